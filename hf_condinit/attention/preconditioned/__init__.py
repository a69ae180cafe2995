"""Preconditioned attention, the project's reading of Saratchandran (arXiv 2603.27153; docs/methods.md §4,
docs/attention_variants.md): ``attn_implementation="preconditioned"``, per-token L2 normalisation of each head's output
after SDPA. No holder: its state is its two options."""

from __future__ import annotations

from ..variant import AttentionVariant
from .fast import preconditioned_attention_forward
from .options import PRECONDITIONED_OPTIONS
from .reference import preconditioned_reference

__all__ = ["PRECONDITIONED", "PRECONDITIONED_OPTIONS", "preconditioned_attention_forward", "preconditioned_reference"]

PRECONDITIONED = AttentionVariant(
    name="preconditioned",
    forward=preconditioned_attention_forward,
    reference=preconditioned_reference,
    options=PRECONDITIONED_OPTIONS,
)
