"""hf_condinit: conditioned initialization and attention-conditioning variants for Hugging Face Transformers.

``import hf_condinit`` installs the `PreTrainedModel` hooks (`hooks.install`), registers the attention variants
with HF's attention and mask registries, and registers Crammed BERT with the Auto classes. After that::

    model = AutoModelForCausalLM.from_config(cfg, condinit=True)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="affine_scaled")
    report = hf_condinit.apply_init(model, "conditioned", seed=0)
"""

from __future__ import annotations

import importlib

from .versions import __version__, check_installed

check_installed()  # one line naming a too-old torch / transformers / accelerate, before either is imported

from . import hooks, init  # noqa: E402,F401  (init registers the built-in schemes)
from .api import InitReport, apply_init  # noqa: E402
from .config import CondInitConfig, resolve_condinit  # noqa: E402
from .layouts import get_layout, register_layout  # noqa: E402
from .registry import register_scheme, register_variant  # noqa: E402

# Heavier or optional parts, resolved on first attribute access: name -> (module, attribute).
_LAZY = {
    "attention_jacobian_condition_number": ("hf_condinit.diagnostics", "attention_jacobian_condition_number"),
    "ConditionReport": ("hf_condinit.diagnostics", "ConditionReport"),
    "ConditionNumberCallback": ("hf_condinit.callbacks", "ConditionNumberCallback"),
    "ConditionedInitCallback": ("hf_condinit.callbacks", "ConditionedInitCallback"),
    "ThroughputCallback": ("hf_condinit.callbacks", "ThroughputCallback"),
    "apply_spectral_conditioning": ("hf_condinit.attention", "apply_spectral_conditioning"),
    "merge_spectral": ("hf_condinit.attention", "merge_spectral"),
    "no_decay_parameter_names": ("hf_condinit.attention", "no_decay_parameter_names"),
}

__all__ = [
    "__version__",
    "CondInitConfig",
    "InitReport",
    "apply_init",
    "get_layout",
    "register_layout",
    "register_scheme",
    "register_variant",
    "resolve_condinit",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_condinit' has no attribute {name!r}")


def _register_plugins() -> None:
    """Install the construction hooks, the attention variants and the shipped model families (idempotent)."""
    from . import models

    hooks.install()  # also registers the attention variants
    models.register()


_register_plugins()
