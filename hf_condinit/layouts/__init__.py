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
    """The layout adapter for a model (or config): the registered one for ``config.model_type``, else one detected
    from the attention modules' names and proved on a miniature of the same model class (`detect`).

    Raises:
        LayoutError: for a model type that is refused (MLA, no softmax attention) or whose layout could not be
            proved, naming the model type, the reason and how to register a layout.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    from .detect import detected_layout

    try:
        return detected_layout(model_or_config)
    except LayoutError as err:
        owner = type(model_or_config).__name__
        raise LayoutError(f"hf_condinit has no attention layout for {owner} (model_type={model_type!r}): {err}") \
            from None
