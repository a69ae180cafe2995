"""Affine-Scaled Attention (Bae et al., arXiv 2602.23057; docs/methods.md §5, docs/attention_variants.md):
``attn_implementation="affine_scaled"``, fast path ``α·SDPA + (α_ma − α)·mean_visible(V)``."""

from __future__ import annotations

from ..variant import AttentionVariant
from .fast import affine_scaled_attention_forward, mean_visible
from .holder import AFFINE_INPUT_KWARG, AffineScaledHolder, in_backward_recompute, reduce_over_replicas
from .options import AFFINE_SCALED_OPTIONS
from .reference import affine_scaled_reference, randomise_affine_scaled

__all__ = [
    "AFFINE_SCALED",
    "AFFINE_SCALED_OPTIONS",
    "AFFINE_INPUT_KWARG",
    "AffineScaledHolder",
    "affine_scaled_attention_forward",
    "affine_scaled_reference",
    "in_backward_recompute",
    "mean_visible",
    "reduce_over_replicas",
]

AFFINE_SCALED = AttentionVariant(
    name="affine_scaled",
    forward=affine_scaled_attention_forward,
    reference=affine_scaled_reference,
    options=AFFINE_SCALED_OPTIONS,
    holder=AffineScaledHolder,
    holder_name="condinit_affine",
    randomise=randomise_affine_scaled,
)
