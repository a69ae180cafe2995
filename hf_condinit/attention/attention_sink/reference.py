"""The reference form of the attention sink: an explicit extra logit in the softmax, full N×N weights (for tests,
and for ``output_attentions=True``); conventions as `hf_condinit.attention.naive`."""

from __future__ import annotations

import torch
from torch import nn

from .._common import get_holder
from ..naive import masked_scores, repeat_heads

__all__ = ["attention_sink_reference", "randomise_attention_sink"]


def attention_sink_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """``softmax`` with an extra per-head logit s_h in the denominator: p_ij = e^{l_ij} / (e^{s_h} + Σ_j e^{l_ij})."""
    holder = get_holder(module, "condinit_sink", "attention_sink")
    logits, vis = masked_scores(module, query, key, attention_mask, scaling, is_causal)
    B, H, Q, K = logits.shape
    sink = holder.logit.float().view(1, H, 1, 1).expand(B, H, Q, 1)
    full = torch.cat([sink, logits], dim=-1)
    p = torch.softmax(full, dim=-1)[..., 1:] * vis
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    out = torch.matmul(p, repeat_heads(value, H).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), p.to(query.dtype)


def randomise_attention_sink(holder, generator: torch.Generator) -> None:
    """Sink logits ~ N(0, 1), drawn on CPU from ``generator``, in place (the zero init is trivial)."""
    holder.logit.copy_(torch.randn(holder.logit.shape, generator=generator))
