"""The fast path of preconditioned attention (Saratchandran, arXiv 2603.27153), **the project's reading**
(docs/methods.md §4).

The paper multiplies each head's output by a diagonal matrix C depending on Q, K, V; its exact formula is not public
in full. The project reads it as C = diag(1 / (‖A_i‖₂ + ε)) for A = softmax(QKᵀ/√d)V, computed on a *detached*
copy: each token's per-head output is L2-normalised before the heads are concatenated (option
``precond_scale="sqrt_d"`` multiplies by √d). It runs after the fused SDPA kernel, so the fast path is kept.
Options come from ``config.condinit``: ``precond_eps`` (1e-6), ``precond_scale`` ("none" | "sqrt_d").
"""

from __future__ import annotations

import math

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .._common import condinit_options, wants_attentions
from .options import PRECONDITIONED_OPTIONS
from .reference import preconditioned_reference

__all__ = ["preconditioned_attention_forward"]


def preconditioned_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF attention function for ``attn_implementation="preconditioned"``."""
    if wants_attentions(kwargs):
        return preconditioned_reference(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal
        )
    opts = condinit_options(module, PRECONDITIONED_OPTIONS)
    out, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )  # (B, Q, H, d)
    norm = out.detach().float().norm(dim=-1, keepdim=True) + float(opts["precond_eps"])
    factor = 1.0 / norm
    if opts["precond_scale"] == "sqrt_d":
        factor = factor * math.sqrt(out.shape[-1])
    if out.dtype == torch.float16:  # in fp32: 1/ε overflows fp16 on all-zero (fully padded) rows, and 0·inf is NaN
        return (out.float() * factor).to(out.dtype), None
    return out * factor.to(out.dtype), None  # fp32 / bf16: no fp32 copy of the output
