"""Layout adapters: how each model family stores q/k/v/o (see `base` for the protocol)."""

from __future__ import annotations

from ..registry import LAYOUTS, register_layout
from . import table  # noqa: F401  (registers the built-in families)
from .base import AttentionLayout, HeadGeometry, LayoutError, Projection
from .detect import get_layout
from .fused import FusedQKVLayout, Gpt2FusedLayout, InterleavedQKVLayout
from .separate import GatedQuerySeparateLayout, SeparateQKVLayout

__all__ = [
    "AttentionLayout",
    "HeadGeometry",
    "LayoutError",
    "Projection",
    "FusedQKVLayout",
    "GatedQuerySeparateLayout",
    "Gpt2FusedLayout",
    "InterleavedQKVLayout",
    "SeparateQKVLayout",
    "get_layout",
    "register_layout",
]
