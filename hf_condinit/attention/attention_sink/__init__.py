"""The attention sink: a learnable logit per head in the softmax denominator (docs/methods.md,
docs/attention_variants.md): ``attn_implementation="attention_sink"``, fast path σ(lse − s)·O from one fused kernel call
that returns lse (virtual-key SDPA fallback)."""

from __future__ import annotations

from ..variant import AttentionVariant
from .fast import (
    CPU_KERNEL_TAKES_GQA,
    SinkAttention,
    attention_sink_attention_forward,
    extra_coordinates,
    kernel_takes_gqa,
    lse_kernel,
    lse_kernel_choice,
    sink_attention,
)
from .holder import AttentionSinkHolder
from .reference import attention_sink_reference, randomise_attention_sink

__all__ = [
    "ATTENTION_SINK",
    "AttentionSinkHolder",
    "attention_sink_attention_forward",
    "attention_sink_reference",
    "CPU_KERNEL_TAKES_GQA",
    "SinkAttention",
    "sink_attention",
    "lse_kernel",
    "lse_kernel_choice",
    "kernel_takes_gqa",
    "extra_coordinates",
]

ATTENTION_SINK = AttentionVariant(
    name="attention_sink",
    forward=attention_sink_attention_forward,
    reference=attention_sink_reference,
    holder=AttentionSinkHolder,
    holder_name="condinit_sink",
    randomise=randomise_attention_sink,
)
