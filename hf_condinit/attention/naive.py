"""Naive N×N softmax attention, the ground the variants' reference forms are built on (docs/attention_variants.md).

Every reference has HF's attention-function signature ``fn(module, query, key, value, attention_mask, dropout=0.0,
scaling=None, is_causal=None, **kwargs) -> (attn_output (B, Q, H, d), attn_weights (B, H, Q, K))`` and materialises
the full weight matrix exactly as the papers write it. Masked logits use ``torch.finfo(dtype).min`` (never -inf);
scores are computed in fp32.

The visible set of keys follows the mask semantics of HF's ``sdpa_attention_forward``: with a 4-D mask, the mask; with
none, upper-left causal (keys past the query length invisible) for a causal module with several queries, every key
otherwise.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._common import effective_causal, visible_from_mask

__all__ = ["repeat_heads", "visible_keys", "masked_scores", "masked_softmax", "eager_reference"]


def repeat_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, H_kv, K, d) key or value heads repeated to ``n_heads`` query heads (unchanged when equal)."""
    n_kv = t.shape[1]
    return t if n_kv == n_heads else t.repeat_interleave(n_heads // n_kv, dim=1)


def visible_keys(module, query, key, attention_mask, is_causal=None) -> torch.Tensor:
    """Boolean (B or 1, 1 or H, Q, K): which keys each query may attend to."""
    Q, K = query.shape[2], key.shape[2]
    if attention_mask is not None:
        return visible_from_mask(attention_mask)
    if effective_causal(module, query, attention_mask, is_causal):
        i = torch.arange(Q, device=query.device)[:, None]
        j = torch.arange(K, device=query.device)[None, :]
        return (j <= i)[None, None]
    return torch.ones(1, 1, Q, K, dtype=torch.bool, device=query.device)


def masked_scores(module, query, key, attention_mask, scaling, is_causal):
    """fp32 logits (B, H, Q, K), masked with finfo.min, and the visibility."""
    H, d = query.shape[1], query.shape[-1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    k = repeat_heads(key, H).float()
    logits = torch.matmul(query.float(), k.transpose(-1, -2)) * scale
    vis = visible_keys(module, query, key, attention_mask, is_causal)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        logits = logits + attention_mask.float().clamp(min=torch.finfo(torch.float32).min)
    logits = logits.masked_fill(~vis, torch.finfo(torch.float32).min)
    return logits, vis


def masked_softmax(logits: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """Softmax over keys, 0 on invisible keys."""
    p = torch.softmax(logits, dim=-1)
    return p * vis  # fully masked rows: 0, not a uniform distribution over masked keys


def eager_reference(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Plain softmax attention (for neutral-setting checks)."""
    logits, vis = masked_scores(module, query, key, attention_mask, scaling, is_causal)
    w = masked_softmax(logits, vis)
    w = nn.functional.dropout(w, p=dropout, training=module.training)
    out = torch.matmul(w, repeat_heads(value, query.shape[1]).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), w.to(query.dtype)
