"""Affine-Scaled Attention (Bae et al., arXiv 2602.23057; METHODS.md §5), fast path.

    out = [α(X)·softmax(QKᵀ/√d) + β(X)]·V,   β = (α_ma − α)/N on the N keys the query may see
        = α·SDPA(Q, K, V) + (α_ma − α)·mean_visible(V)

mean_visible is a prefix mean (causal, no mask: O(N·d) with a cumulative sum) or a masked mean (any 4-D mask:
padding left or right, KV cache, packed sequences; one (Q×K)·(K×d) product with the 0/1 mask, no softmax). The fused
SDPA kernel is kept; the N×N weights are materialised only when attention weights are requested.

X is the attention module's input (the normalised hidden state feeding q/k/v), stashed on
``module.condinit_affine`` by a forward pre-hook registered by `hf_condinit.attention.inject`; under gradient
checkpointing the re-forward re-runs the hook, so the recomputed α is identical.

α_ma is updated *before* it is used, in training forward passes only (``module.training``), from real tokens (a query
is real when it may attend to its own key position: padding rows are excluded), detached, never in the backward
re-forward of gradient checkpointing, and never in eval. Dropout (training) applies to the softmax part only.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from ._common import (
    condinit_options,
    crop_for_causal,
    effective_causal,
    get_holder,
    in_backward_recompute,
    visible_from_mask,
    wants_attentions,
)

__all__ = ["affine_scaled_attention_forward", "mean_visible", "update_alpha_ma"]


def mean_visible(
    value: torch.Tensor, attention_mask: torch.Tensor | None, causal: bool, q_len: int, bias_length: str = "visible"
) -> torch.Tensor:
    """Mean of the visible values for each query: (B, H_kv, Q, d), computed in fp32.

    Args:
        value: (B, H_kv, K, d) (already cropped to Q keys when ``causal``).
        attention_mask: 4-D boolean or additive mask (B or 1, 1 or H_kv, Q, K), or None.
        causal: no mask and upper-left causal (query i sees keys 0..i).
        bias_length: ``"visible"`` divides by the number of visible keys, ``"full"`` by the key length K.
    """
    v = value.float()
    K = v.shape[2]
    if attention_mask is None:
        if causal:
            sums = v.cumsum(dim=2)[:, :, :q_len]
            counts = torch.arange(1, q_len + 1, device=v.device, dtype=v.dtype).view(1, 1, q_len, 1)
        else:
            sums = v.sum(dim=2, keepdim=True).expand(-1, -1, q_len, -1)
            counts = torch.full((1, 1, 1, 1), float(K), device=v.device, dtype=v.dtype)
    else:
        m = visible_from_mask(attention_mask).to(v.dtype)
        if m.shape[1] not in (1, v.shape[1]):
            raise ValueError(f"mask with {m.shape[1]} heads does not broadcast over {v.shape[1]} key/value heads")
        sums = torch.matmul(m, v)
        counts = m.sum(dim=-1, keepdim=True)
    if bias_length == "full":
        counts = torch.full_like(counts[..., :1, :1], float(K))
    return sums / counts.clamp(min=1.0)


def update_alpha_ma(holder, alpha: torch.Tensor, real: torch.Tensor | None, rho: float) -> None:
    """EMA update of ``holder.alpha_ma`` from α (B, Q, H) over real tokens (B, Q) (None: all real).

    Only in training forward passes, never inside a backward pass (gradient-checkpointing recompute).
    """
    if not holder.training or in_backward_recompute():
        return
    with torch.no_grad():
        a = alpha.detach().float()
        if real is None:
            if a.shape[0] * a.shape[1] == 0:
                return
            batch_mean = a.mean(dim=(0, 1))
        else:
            w = real.to(a.dtype).expand(a.shape[0], a.shape[1]).unsqueeze(-1)  # (B, Q, 1); masks may broadcast B
            n = w.sum()
            if n == 0:
                return
            batch_mean = (a * w).sum(dim=(0, 1)) / n
        new = rho * holder.alpha_ma.float() + (1.0 - rho) * batch_mean
        holder.alpha_ma.copy_(new.to(holder.alpha_ma.dtype))


def affine_scaled_attention_forward(
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
    """HF attention function for ``attn_implementation="affine_scaled"``.

    Shapes: query (B, H, Q, d), key/value (B, H_kv, K, d); returns (B, Q, H, d) and the (B, H, Q, K) affine weights
    when attention weights are requested (then the naive reference computes the output), else None.
    """
    if wants_attentions(kwargs):
        from .reference import affine_scaled_reference

        return affine_scaled_reference(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal
        )

    holder = get_holder(module, "condinit_affine", "affine_scaled")
    x = holder.pop_input()
    opts = condinit_options(module)
    B, H, Q, _ = query.shape
    causal = effective_causal(module, query, attention_mask, is_causal)
    if causal:
        key, value = crop_for_causal(key, value, Q)

    attn, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )  # (B, Q, H, d)

    alpha = holder.alpha(x)  # (B, Q, H)
    if holder.training:
        real = None
        if attention_mask is not None and Q <= key.shape[2]:
            real = visible_from_mask(attention_mask)[:, 0].diagonal(offset=key.shape[2] - Q, dim1=-2, dim2=-1)
        update_alpha_ma(holder, alpha, real, opts["affine_rho"])

    mean = mean_visible(value, attention_mask, causal, Q, opts["affine_bias_length"])  # (B, H_kv, Q, d) fp32
    mean = repeat_kv(mean, H // mean.shape[1]).transpose(1, 2)  # (B, Q, H, d)
    alpha = alpha.to(attn.dtype).unsqueeze(-1)  # (B, Q, H, 1)
    alpha_ma = holder.alpha_ma.detach().clone().to(attn.dtype).view(1, 1, H, 1)
    out = alpha * attn + (alpha_ma - alpha) * mean.to(attn.dtype)
    return out, None
