"""The reference form of preconditioned attention: softmax attention with the full N×N weights, then the per-token
normalisation (for tests, and for ``output_attentions=True``); conventions as `hf_condinit.attention.naive`."""

from __future__ import annotations

import math

import torch
from torch import nn

from .._common import condinit_options
from ..naive import masked_scores, masked_softmax, repeat_heads
from .options import PRECONDITIONED_OPTIONS

__all__ = ["preconditioned_reference"]


def preconditioned_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """Softmax attention, then each token's per-head output divided by its (detached) L2 norm + ε (× √d option)."""
    opts = condinit_options(module, PRECONDITIONED_OPTIONS)
    logits, vis = masked_scores(module, query, key, attention_mask, scaling, is_causal)
    p = masked_softmax(logits, vis)
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    a = torch.matmul(p, repeat_heads(value, query.shape[1]).float())  # (B, H, Q, d)
    norm = a.detach().norm(dim=-1, keepdim=True)
    out = a / (norm + opts["precond_eps"])
    if opts["precond_scale"] == "sqrt_d":
        out = out * math.sqrt(query.shape[-1])
    return out.to(query.dtype).transpose(1, 2).contiguous(), p.to(query.dtype)
