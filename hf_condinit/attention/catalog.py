"""The attention variants of hf_condinit, registered once: `VARIANTS` (docs/architecture.md, "Where a variant lives").

Adding a variant: a folder ``hf_condinit/attention/<name>/`` that builds its `AttentionVariant`
(`hf_condinit.attention.variant`), and its entry here.
"""

from __future__ import annotations

from .affine_scaled import AFFINE_SCALED
from .attention_sink import ATTENTION_SINK
from .preconditioned import PRECONDITIONED
from .variant import AttentionVariant

__all__ = ["VARIANTS", "variant_named"]

VARIANTS = (AFFINE_SCALED, ATTENTION_SINK, PRECONDITIONED)


def variant_named(name) -> AttentionVariant | None:
    """The variant whose ``attn_implementation`` is ``name``, or None (any other implementation)."""
    return next((v for v in VARIANTS if v.name == name), None)
