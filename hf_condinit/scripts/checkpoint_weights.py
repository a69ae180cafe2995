"""A checkpoint's weights under the model's own parameter names, for a resume.

transformers 5 saves many models in their original (Hub) format: ``save_pretrained`` reverts the model's weight
conversions (renamed modules such as ViT's ``vit.layers.0.attention.q_proj`` saved as
``vit.encoder.layer.0.attention.attention.query``; fused MoE experts saved one per expert). ``from_pretrained``
converts them back, but the stock Trainer's resume reads the safetensors file and calls ``load_state_dict`` with
``strict=False``: for such a model every weight is "missing", a warning is logged and training goes on from the
freshly built model. :class:`~.trainer.CondInitTrainer` loads those checkpoints here instead, through transformers'
own conversion (:func:`weights_in_model_names`), and refuses a load that leaves a weight of the model unset
(:func:`missing_weights_error`).
"""

from __future__ import annotations

import copy
import json
import os

from ..errors import UsageError

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


def saved_weight_names(folder: str) -> set[str] | None:
    """The tensor names in ``folder``'s safetensors weights (one file or an index of shards); ``None`` without them."""
    index = os.path.join(folder, WEIGHTS_INDEX_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            return set(json.load(f)["weight_map"])
    single = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.isfile(single):
        return None
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        return set(f.keys())


def saved_under_other_names(model, folder: str) -> bool:
    """Whether ``folder`` holds safetensors weights with a name that ``model``'s state dict does not have: the
    checkpoint is in the original format of a model whose weights transformers converts when loading."""
    names = saved_weight_names(folder)
    return names is not None and not names <= set(model.state_dict())


def weights_in_model_names(model, folder: str) -> dict:
    """``folder``'s weights as a state dict keyed like ``model.state_dict()``, converted by transformers'
    ``from_pretrained`` (the same renaming, merging and splitting a loaded model gets) into a CPU copy of ``model``'s
    class and config, in the dtype of ``model``'s first floating-point parameter. Peak memory: one more copy of the
    weights in CPU memory, as the stock resume's ``load_file`` takes."""
    import torch

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    loaded = type(model).from_pretrained(folder, config=copy.deepcopy(model.config), dtype=dtype)
    return loaded.state_dict()


def missing_weights_error(folder: str, missing: list[str]) -> UsageError:
    """The one-line refusal of a checkpoint that leaves ``missing`` weights of the model unset."""
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return UsageError(f"{folder} holds no weights for {len(missing)} parameters of this model ({shown}): it was "
                      "saved from another model or configuration; resume from a checkpoint of this run, or start a "
                      "new one with a new --output_dir")
