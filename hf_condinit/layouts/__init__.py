"""Layout adapters: how each model family stores q/k/v/o (see `base` for the protocol)."""

from __future__ import annotations

from ..registry import LAYOUTS, register_layout
from . import table  # noqa: F401  (registers the built-in families)
from .base import AttentionLayout, HeadGeometry, LayoutError, Projection
from .fused import FusedQKVLayout, Gpt2FusedLayout, InterleavedQKVLayout
from .separate import SeparateQKVLayout

__all__ = [
    "AttentionLayout",
    "HeadGeometry",
    "LayoutError",
    "Projection",
    "FusedQKVLayout",
    "Gpt2FusedLayout",
    "InterleavedQKVLayout",
    "SeparateQKVLayout",
    "get_layout",
    "register_layout",
]


def get_layout(model_or_config) -> AttentionLayout:
    """The layout adapter for a model (or config), by ``config.model_type``.

    Raises:
        LayoutError: for a model type with no registered layout, naming the model class, the supported types and
            how to register one.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    owner = type(model_or_config).__name__
    raise LayoutError(
        f"hf_condinit has no attention layout for {owner} (model_type={model_type!r}). Supported model types: "
        f"{', '.join(sorted(LAYOUTS))}. To add one, describe where q/k/v/o live, e.g.\n"
        "    hf_condinit.register_layout('my_type', hf_condinit.layouts.SeparateQKVLayout("
        "q='attn.q', k='attn.k', v='attn.v', o='attn.out'))"
    )
