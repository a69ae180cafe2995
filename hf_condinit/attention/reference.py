"""The reference forms of the attention variants, registered as ``<variant>_reference`` implementations.

Each variant's naive N×N form lives in its folder (``<variant>/reference.py``), on the softmax attention of
`hf_condinit.attention.naive` (conventions there); this module collects them. `register_references()` registers them
(and ``eager_reference``) with the SDPA mask function, so that a model can be switched between a variant's fast path
and its reference with ``model.config._attn_implementation = ...``.
"""

from __future__ import annotations

import torch
from torch import nn

from .affine_scaled.reference import affine_scaled_reference
from .attention_sink.reference import attention_sink_reference
from .catalog import VARIANTS
from .naive import eager_reference, visible_keys
from .preconditioned.reference import preconditioned_reference

__all__ = [
    "visible_keys",
    "eager_reference",
    "affine_scaled_reference",
    "attention_sink_reference",
    "preconditioned_reference",
    "REFERENCES",
    "register_references",
    "randomise_holders",
]

REFERENCES = {"eager_reference": eager_reference, **{v.reference_name: v.reference for v in VARIANTS}}


def register_references() -> list[str]:
    """Register the references in HF's AttentionInterface / AttentionMaskInterface (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in REFERENCES.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
    return list(REFERENCES)


def randomise_holders(model: nn.Module, seed: int = 0) -> None:
    """Give the variants' holders non-trivial values for a comparison with the references (each variant's
    ``randomise``: affine W_a ~ N(0, 3²), α_ma ~ U(0, 1), sink logits ~ N(0, 1)), drawn on CPU from one
    ``torch.Generator().manual_seed(seed + 1)`` in module order (the same values on every device), in place. The zero
    inits would make affine_scaled and the sink trivial."""
    by_holder = {v.holder: v.randomise for v in VARIANTS if v.holder is not None and v.randomise is not None}
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            for holder_class, randomise in by_holder.items():
                if isinstance(m, holder_class):
                    randomise(m, gen)
