"""Naive N×N reference implementations of the attention variants (for tests, and for ``output_attentions=True``).

Each function has HF's attention-function signature ``fn(module, query, key, value, attention_mask, dropout=0.0,
scaling=None, is_causal=None, **kwargs) -> (attn_output (B, Q, H, d), attn_weights (B, H, Q, K))`` and materialises
the full weight matrix exactly as the papers write it. Masked logits use ``torch.finfo(dtype).min`` (never -inf);
scores are computed in fp32.

The visible set of keys follows the mask semantics of HF's ``sdpa_attention_forward``: with a 4-D mask, the mask; with
none, upper-left causal (keys past the query length invisible) for a causal module with several queries, every key
otherwise.

`register_references()` registers them under ``<variant>_reference`` names (with the SDPA mask function) so that a
model can be switched between the fast path and the reference with ``model.config._attn_implementation = ...``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._common import condinit_options, effective_causal, get_holder, visible_from_mask

__all__ = [
    "visible_keys",
    "eager_reference",
    "affine_scaled_reference",
    "attention_sink_reference",
    "preconditioned_reference",
    "REFERENCES",
    "register_references",
]


def _repeat_kv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
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


def _scores(module, query, key, attention_mask, scaling, is_causal):
    """fp32 logits (B, H, Q, K), masked with finfo.min, and the visibility."""
    H, d = query.shape[1], query.shape[-1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    k = _repeat_kv(key, H).float()
    logits = torch.matmul(query.float(), k.transpose(-1, -2)) * scale
    vis = visible_keys(module, query, key, attention_mask, is_causal)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        logits = logits + attention_mask.float().clamp(min=torch.finfo(torch.float32).min)
    logits = logits.masked_fill(~vis, torch.finfo(torch.float32).min)
    return logits, vis


def _softmax_masked(logits: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits, dim=-1)
    return p * vis  # fully masked rows: 0, not a uniform distribution over masked keys


def eager_reference(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Plain softmax attention (for neutral-setting checks)."""
    logits, vis = _scores(module, query, key, attention_mask, scaling, is_causal)
    w = _softmax_masked(logits, vis)
    w = nn.functional.dropout(w, p=dropout, training=module.training)
    out = torch.matmul(w, _repeat_kv(value, query.shape[1]).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), w.to(query.dtype)


def affine_scaled_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """``out = [α(X)·softmax(QKᵀ/√d) + β(X)]·V`` with β = (α_ma − α)/N on the N visible keys only (docs/methods.md §5).

    The output uses α_ma as it stood before the batch; training forward passes then update it (EMA over real
    tokens), exactly like the fast path. X arrives in ``kwargs`` (`hf_condinit.attention.holders.AFFINE_INPUT_KWARG`).
    """
    holder = get_holder(module, "condinit_affine", "affine_scaled")
    x = holder.input_from(kwargs)
    H = query.shape[1]
    logits, vis = _scores(module, query, key, attention_mask, scaling, is_causal)
    p = _softmax_masked(logits, vis)
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    alpha = holder.alpha(x).float().transpose(1, 2).unsqueeze(-1)  # (B, H, Q, 1)
    opts = condinit_options(module)
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
    out = torch.matmul(w, _repeat_kv(value, H).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), w.to(query.dtype)


def attention_sink_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """``softmax`` with an extra per-head logit s_h in the denominator: p_ij = e^{l_ij} / (e^{s_h} + Σ_j e^{l_ij})."""
    holder = get_holder(module, "condinit_sink", "attention_sink")
    logits, vis = _scores(module, query, key, attention_mask, scaling, is_causal)
    B, H, Q, K = logits.shape
    sink = holder.logit.float().view(1, H, 1, 1).expand(B, H, Q, 1)
    full = torch.cat([sink, logits], dim=-1)
    p = torch.softmax(full, dim=-1)[..., 1:] * vis
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    out = torch.matmul(p, _repeat_kv(value, H).float())
    return out.to(query.dtype).transpose(1, 2).contiguous(), p.to(query.dtype)


def preconditioned_reference(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """Softmax attention, then each token's per-head output divided by its (detached) L2 norm + ε (× √d option)."""
    opts = condinit_options(module)
    logits, vis = _scores(module, query, key, attention_mask, scaling, is_causal)
    p = _softmax_masked(logits, vis)
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    a = torch.matmul(p, _repeat_kv(value, query.shape[1]).float())  # (B, H, Q, d)
    norm = a.detach().norm(dim=-1, keepdim=True)
    out = a / (norm + opts["precond_eps"])
    if opts["precond_scale"] == "sqrt_d":
        out = out * math.sqrt(query.shape[-1])
    return out.to(query.dtype).transpose(1, 2).contiguous(), p.to(query.dtype)


REFERENCES = {
    "eager_reference": eager_reference,
    "affine_scaled_reference": affine_scaled_reference,
    "attention_sink_reference": attention_sink_reference,
    "preconditioned_reference": preconditioned_reference,
}


def register_references() -> list[str]:
    """Register the references in HF's AttentionInterface / AttentionMaskInterface (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in REFERENCES.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
    return list(REFERENCES)


def randomise_holders(model: nn.Module, seed: int = 0) -> None:
    """Give the variants' holders non-trivial values for a comparison with the references: affine W_a ~ N(0, 3²),
    α_ma ~ U(0, 1), sink logits ~ N(0, 1), drawn on CPU from ``torch.Generator().manual_seed(seed + 1)`` (the same
    values on every device), in place. The zero inits would make affine_scaled and the sink trivial."""
    from .holders import AffineScaledHolder, AttentionSinkHolder

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AffineScaledHolder):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 3.0)
                m.alpha_ma.copy_(torch.rand(m.alpha_ma.shape, generator=gen))
            elif isinstance(m, AttentionSinkHolder):
                m.logit.copy_(torch.randn(m.logit.shape, generator=gen))
