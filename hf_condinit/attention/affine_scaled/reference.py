"""The reference form of Affine-Scaled Attention: the full N×N weights as the paper writes them (for tests, and for
``output_attentions=True``); conventions as `hf_condinit.attention.naive`."""

from __future__ import annotations

import torch
from torch import nn

from .._common import condinit_options, get_holder
from ..naive import masked_scores, masked_softmax, repeat_heads
from .options import AFFINE_SCALED_OPTIONS

__all__ = ["affine_scaled_reference", "randomise_affine_scaled"]


def affine_scaled_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """``out = [α(X)·softmax(QKᵀ/√d) + β(X)]·V`` with β = (α_ma − α)/N on the N visible keys only (docs/methods.md §5).

    The output uses α_ma as it stood before the batch; training forward passes then update it (EMA over real
    tokens), exactly like the fast path. X arrives in ``kwargs`` (`.holder.AFFINE_INPUT_KWARG`).
    """
    holder = get_holder(module, "condinit_affine", "affine_scaled")
    x = holder.input_from(kwargs)
    H = query.shape[1]
    logits, vis = masked_scores(module, query, key, attention_mask, scaling, is_causal)
    p = masked_softmax(logits, vis)
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    alpha = holder.alpha(x).float().transpose(1, 2).unsqueeze(-1)  # (B, H, Q, 1)
    opts = condinit_options(module, AFFINE_SCALED_OPTIONS)
    real = None  # a query is real when it may attend to its own position (padding rows excluded)
    if attention_mask is not None:
        real = vis[:, 0].diagonal(offset=key.shape[2] - query.shape[2], dim1=-2, dim2=-1)
    alpha_ma = holder.alpha_ma_for_forward(alpha.squeeze(-1).transpose(1, 2), real, opts["affine_rho"])
    alpha_ma = alpha_ma.view(1, H, 1, 1)
    visf = vis.float().expand(p.shape)
    if opts["affine_bias_length"] == "full":
        n = torch.full_like(visf[..., :1], key.shape[2])
    else:
        n = visf.sum(-1, keepdim=True).clamp(min=1.0)
    beta = (alpha_ma - alpha) / n
    w = alpha * p + beta * visf
    out = torch.matmul(w, repeat_heads(value, H).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), w.to(query.dtype)


def randomise_affine_scaled(holder, generator: torch.Generator) -> None:
    """W_a ~ N(0, 3²), α_ma ~ U(0, 1), drawn on CPU from ``generator``, in place (the zero init is trivial)."""
    holder.weight.copy_(torch.randn(holder.weight.shape, generator=generator) * 3.0)
    holder.alpha_ma.copy_(torch.rand(holder.alpha_ma.shape, generator=generator))
