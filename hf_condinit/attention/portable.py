"""Portable checkpoints: a model whose forward needs hf_condinit loads exactly in plain transformers, or not at all.

Which checkpoints: a model built with an attention variant (``affine_scaled``, ``attention_sink``,
``preconditioned``) or with unmerged spectral conditioning (holders ``condinit_spectral_*``). Conditioned and
mimetic init (ordinary weights) and merged spectral conditioning (`merge_spectral`) stay plain checkpoints.

Mechanism (Hugging Face's convention for an architecture that transformers does not ship: code next to the weights,
``auto_map``, ``trust_remote_code=True``). `write_portable` runs after every ``save_pretrained`` of such a model
(the ``save_pretrained`` hook of `hf_condinit.hooks`) and

- writes ``condinit_modeling.py``: one self-contained file (imports only the standard library, torch and
  transformers) built by `bundle_source` from hf_condinit's own source of the holders and attention functions
  (`bundled_modules`; no second copy to keep in sync), ending with a config class and a model class per Auto class
  of the family (``class CondInitGPT2LMHeadModel(CondInitPortableMixin, GPT2LMHeadModel)``);
- rewrites config.json: ``model_type`` becomes ``"condinit_<type>"`` (the original kept in
  ``condinit_base_model_type``), ``auto_map`` points the Auto classes at that file, ``condinit_holders`` lists the
  holders (`holder_manifest`), and ``attn_implementation`` names the variant.

Why the renamed model_type: with a model_type transformers knows, ``AutoModel*.from_pretrained(dir)`` without
``trust_remote_code`` silently uses the local class and ignores ``auto_map``; with an unknown one it refuses with
HF's own error asking for ``trust_remote_code=True``. Why ``attn_implementation``: a concrete class
(``GPT2LMHeadModel.from_pretrained(dir)``) skips the Auto lookup, but then refuses to build a model whose attention
implementation is not registered. (Unmerged spectral conditioning runs with sdpa/eager, so a concrete class of the
family loads it with HF's model-type warning and its "UNEXPECTED keys" report; docs/attention_variants.md says so.)

With hf_condinit imported, `plugin_config_dict` (the ``get_config_dict`` hook) undoes the rewrite when the config is
read, so loading goes through the plugin exactly as before, with or without ``trust_remote_code``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re

from torch import nn

from .catalog import VARIANTS
from .holder_base import CondInitHolder
from .spectral.holder import SpectralHolder

__all__ = [
    "PORTABLE_FILE",
    "portable_kind",
    "holder_manifest",
    "bundle_source",
    "bundled_modules",
    "write_portable",
    "plugin_config_dict",
    "auto_class_name",
    "loading_instructions",
]

PORTABLE_FILE = "condinit_modeling.py"
_MODULE = PORTABLE_FILE[:-3]
_PREFIX = "condinit_"
#: the modules of a variant's folder, bundled in this order when the folder has them
_VARIANT_PARTS = ("options", "holder", "reference", "fast", "")
#: Auto classes given an ``auto_map`` entry (when the family has a class for them), with their mapping names
_AUTO_CLASSES = {
    "AutoModel": "MODEL_MAPPING_NAMES",
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForPreTraining": "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "AutoModelForImageClassification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
_RELATIVE_IMPORT = re.compile(r"^([ \t]*)from \.[\w.]* import (\([^)]*\)|[^\n]*)\n", re.MULTILINE)
_FUTURE = re.compile(r"^from __future__ import annotations\n", re.MULTILINE)


def portable_kind(model: nn.Module) -> str | None:
    """What makes ``model``'s forward need hf_condinit: its attention variant, ``"spectral"`` (unmerged spectral
    conditioning only), or None (a plain checkpoint)."""
    variant = getattr(model.config, "condinit_attention", None)
    if variant:
        return variant
    if any(isinstance(m, SpectralHolder) for m in model.modules()):
        return "spectral"
    return None


def holder_manifest(model: nn.Module) -> list[dict]:
    """One entry per holder of ``model``: where it sits (relative to ``model.base_model``) and how to build it.

    Raises:
        ValueError: a holder outside the base model (the remote classes attach holders to the base model).
    """
    root = model.base_model
    # torch's checkpoint_wrapper (activation checkpointing under FSDP) adds a level to module names that state dicts
    # and the saved model leave out
    modules = [(n.replace("_checkpoint_wrapped_module.", ""), m) for n, m in root.named_modules()]
    names = {id(m): n for n, m in modules}
    kinds = {v.holder: v.name for v in VARIANTS if v.holder is not None}
    entries = []
    for name, holder in modules:
        if not isinstance(holder, CondInitHolder):
            continue
        module, _, attr = name.rpartition(".")
        entry = {"module": module, "name": attr}
        kind = next((k for cls, k in kinds.items() if isinstance(holder, cls)), None)
        if kind is not None:
            entry.update(kind=kind, **holder.shape())
        elif isinstance(holder, SpectralHolder):
            projection = holder._projections[0]
            entry.update(kind="spectral", projection=names[id(projection.module)], roles=holder.roles,
                         storage=projection.storage, lam=holder.lam, mode=holder.mode, shape=list(holder.C.shape))
        else:
            raise ValueError(f"holder {name} of type {type(holder).__name__} has no portable form.")
        entries.append(entry)
    total = sum(isinstance(m, CondInitHolder) for m in model.modules())
    if total != len(entries):
        raise ValueError("condinit holders outside model.base_model: this checkpoint cannot be made portable.")
    return entries


def _strip(source: str) -> str:
    """A module's source without ``from __future__`` and relative imports (each replaced by ``pass``, so an import
    that was the only statement of a block leaves valid code)."""
    source = _FUTURE.sub("", source)
    return _RELATIVE_IMPORT.sub(lambda m: f"{m.group(1)}pass\n", source)


def bundle_source(base_model_type: str) -> str:
    """The source of ``condinit_modeling.py`` for a checkpoint of family ``base_model_type``.

    Raises:
        ValueError: transformers ships no config class for ``base_model_type`` (e.g. a family registered by a
        plugin): such a checkpoint cannot load without its plugin anyway.
    """
    from transformers.models.auto import configuration_auto, modeling_auto

    from ..init.functional import block_identity

    config_name = configuration_auto.CONFIG_MAPPING_NAMES.get(base_model_type)
    if config_name is None:
        raise ValueError(f"transformers has no model type {base_model_type!r}: no portable checkpoint possible.")
    classes = {}
    for auto, mapping in _AUTO_CLASSES.items():
        name = getattr(modeling_auto, mapping).get(base_model_type)
        if isinstance(name, str):
            classes[auto] = name
    parts = [
        f'"""Self-contained code of an hf_condinit checkpoint (model type {base_model_type!r}), written by\n'
        "hf_condinit.attention.portable: load with `AutoModel*.from_pretrained(dir, trust_remote_code=True)`, no\n"
        'hf_condinit needed. Built from hf_condinit\'s own source; do not edit."""\n\n'
        "from __future__ import annotations\n",
        "import torch\n\n\n" + inspect.getsource(block_identity),
    ]
    for module in bundled_modules():
        parts.append(f"# ---- {module} " + "-" * max(0, 100 - len(module)) + "\n")
        parts.append(_strip(inspect.getsource(importlib.import_module(module))))
    tail = ["# ---- the classes of this checkpoint " + "-" * 64, "import transformers", "",
            "register_portable_variants()", "", "",
            f"class {_portable_name(config_name)}(CondInitPortableConfigMixin, transformers.{config_name}):",
            f"    model_type = {_PREFIX + base_model_type!r}", ""]
    for model_class in dict.fromkeys(classes.values()):
        tail += ["", f"class {_portable_name(model_class)}(CondInitPortableMixin, transformers.{model_class}):",
                 f"    config_class = {_portable_name(config_name)}", ""]
    parts.append("\n".join(tail))
    return "\n".join(parts)


def bundled_modules() -> list[str]:
    """The modules whose source makes up ``condinit_modeling.py``, in order: each uses only names of the modules
    before it, or its own."""
    package = __name__.rpartition(".")[0]
    names = [f"{package}.{m}" for m in ("holder_base", "spectral.holder", "_common", "naive", "variant")]
    for variant in VARIANTS:
        folder = variant.forward.__module__.rpartition(".")[0]
        for part in _VARIANT_PARTS:
            name = f"{folder}.{part}" if part else folder
            if importlib.util.find_spec(name) is not None:
                names.append(name)
    return names + [f"{package}.catalog", f"{package}.compile_guard", f"{package}._portable_runtime"]


def auto_class_name(model: nn.Module) -> str:
    """The most specific Auto class that maps ``model``'s family to its class (``"AutoModel"`` when none does)."""
    from transformers.models.auto import modeling_auto

    model_type, name = model.config.model_type, type(model).__name__
    matches = [auto for auto, mapping in _AUTO_CLASSES.items() if getattr(modeling_auto, mapping).get(model_type) == name]
    return next((a for a in matches if a != "AutoModel"), "AutoModel")


def loading_instructions(model: nn.Module) -> str:
    """Markdown for a model card: which kind of checkpoint ``model`` saves and how to load it, with or without
    hf_condinit."""
    from transformers.models.auto import configuration_auto

    kind, auto = portable_kind(model), auto_class_name(model)
    if model.config.model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        return (f"Model type `{model.config.model_type}` is registered by hf_condinit, not shipped by transformers: "
                f"`import hf_condinit` before `transformers.{auto}.from_pretrained(path)` (plain transformers refuses "
                "the unknown model type).\n")
    if kind is None:
        return (f"A plain transformers checkpoint (hf_condinit's init schemes and merged spectral conditioning are "
                f"ordinary weights): `transformers.{auto}.from_pretrained(path)` loads it, with or without "
                "hf_condinit installed.\n")
    what = "unmerged spectral conditioning (fixed C buffers)" if kind == "spectral" else f"attention variant `{kind}`"
    return (f"This model's forward needs hf_condinit's code ({what}), so the checkpoint ships it: "
            f"`{PORTABLE_FILE}` (self-contained, torch + transformers only) next to the weights, with `auto_map` in "
            "config.json.\n\n"
            "```python\n"
            f"model = transformers.{auto}.from_pretrained(path, trust_remote_code=True)  # without hf_condinit\n"
            f"import hf_condinit; model = transformers.{auto}.from_pretrained(path)  # with it\n"
            "```\n\n"
            "Both give the trained model's logits. Without `trust_remote_code=True` (and without hf_condinit) "
            "transformers refuses to load it rather than load another model; pass `trust_remote_code=True` to "
            "pipelines and lm-evaluation-harness too (`--model_args pretrained=path,trust_remote_code=True`).\n")


def _portable_name(name: str) -> str:
    return "CondInit" + name


def write_portable(model: nn.Module, save_directory: str | os.PathLike) -> bool:
    """Make the checkpoint ``model.save_pretrained`` just wrote to ``save_directory`` portable (see module docstring).

    Returns:
        True when the checkpoint needs hf_condinit's forward and was made portable, False for a plain checkpoint.
    """
    from transformers.models.auto import configuration_auto, modeling_auto

    if portable_kind(model) is None:
        return False
    path = os.path.join(save_directory, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    base = config.get("condinit_base_model_type") or config["model_type"]
    if base not in configuration_auto.CONFIG_MAPPING_NAMES:
        return False  # a family transformers does not ship (Crammed BERT): plain transformers refuses it anyway
    source = bundle_source(base)
    auto_map = {}
    for auto, mapping in _AUTO_CLASSES.items():
        name = getattr(modeling_auto, mapping).get(base)
        if isinstance(name, str):
            auto_map[auto] = f"{_MODULE}.{_portable_name(name)}"
    auto_map["AutoConfig"] = f"{_MODULE}.{_portable_name(configuration_auto.CONFIG_MAPPING_NAMES[base])}"
    config.update(
        model_type=_PREFIX + base,
        condinit_base_model_type=base,
        auto_map={**config.get("auto_map", {}), **auto_map},
        condinit_holders=holder_manifest(model),
    )
    variant = getattr(model.config, "condinit_attention", None)
    if variant:
        config["attn_implementation"] = variant
    with open(os.path.join(save_directory, PORTABLE_FILE), "w", encoding="utf-8") as f:
        f.write(source)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True


def plugin_config_dict(config_dict: dict) -> dict:
    """A config dict written by `write_portable`, as hf_condinit reads it (the plugin's own classes do the work):
    the original model_type, no ``auto_map`` entries of ``condinit_modeling.py``, no manifest, no
    ``attn_implementation`` (the hooks restore the variant from ``condinit_attention``). Other dicts unchanged."""
    if not isinstance(config_dict, dict) or "condinit_base_model_type" not in config_dict:
        return config_dict
    config_dict = dict(config_dict)
    config_dict["model_type"] = config_dict.pop("condinit_base_model_type")
    config_dict.pop("condinit_holders", None)
    if config_dict.get("attn_implementation") == config_dict.get("condinit_attention"):
        config_dict.pop("attn_implementation", None)
    auto_map = {k: v for k, v in (config_dict.get("auto_map") or {}).items() if not v.startswith(_MODULE + ".")}
    if auto_map:
        config_dict["auto_map"] = auto_map
    else:
        config_dict.pop("auto_map", None)
    return config_dict
