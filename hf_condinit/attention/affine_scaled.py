"""Affine-Scaled Attention (Bae et al., arXiv 2602.23057; METHODS.md §5), fast path.

    out = [α(X)·softmax(QKᵀ/√d) + β(X)]·V,   β = (α_ma − α)/N on the N keys the query may see
        = α·SDPA(Q, K, V) + (α_ma − α)·mean_visible(V)

mean_visible is a prefix mean (causal, no mask: O(N·d) with a cumulative sum) or a masked mean (any 4-D mask:
padding left or right, KV cache, packed sequences; one (Q×K)·(K×d) product with the 0/1 mask, no softmax). The fused
SDPA kernel is kept; the N×N weights are materialised only when attention weights are requested.

X is the attention module's input (the normalised hidden state feeding q/k/v). It arrives as a keyword argument of
this call (`hf_condinit.modules.AFFINE_INPUT_KWARG`, added by the forward pre-hook that
`hf_condinit.attention.inject` registers), so nothing is stored between calls: one model can serve several threads,
and under gradient checkpointing the re-forward re-runs the hook, so the recomputed α is identical.

The output uses α_ma as it stood *before* this batch; a training forward then updates α_ma from the batch's real
tokens (a query is real when it may attend to its own key position: padding rows are excluded), detached, never in
the backward re-forward of gradient checkpointing, and never in eval (`AffineScaledHolder.alpha_ma_for_forward`).
Updating first would let every token of the batch change every output through the batch mean (METHODS.md §5).
Dropout (training) applies to the softmax part only.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from ._common import (
    condinit_options,
    crop_for_causal,
    effective_causal,
    get_holder,
    visible_from_mask,
    wants_attentions,
)
from .reference import affine_scaled_reference

__all__ = ["affine_scaled_attention_forward", "mean_visible"]


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
        return affine_scaled_reference(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )

    holder = get_holder(module, "condinit_affine", "affine_scaled")
    x = holder.input_from(kwargs)
    opts = condinit_options(module)
    B, H, Q, _ = query.shape
    causal = effective_causal(module, query, attention_mask, is_causal)
    if causal:
        key, value = crop_for_causal(key, value, Q)

    attn, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )  # (B, Q, H, d)

    alpha = holder.alpha(x)  # (B, Q, H)
    real = None
    if attention_mask is not None and Q <= key.shape[2]:
        real = visible_from_mask(attention_mask)[:, 0].diagonal(offset=key.shape[2] - Q, dim1=-2, dim2=-1)
    alpha_ma = holder.alpha_ma_for_forward(alpha, real, opts["affine_rho"])  # (H,) fp32, before this batch

    mean = mean_visible(value, attention_mask, causal, Q, opts["affine_bias_length"])  # (B, H_kv, Q, d) fp32
    mean = repeat_kv(mean, H // mean.shape[1]).transpose(1, 2)  # (B, Q, H, d)
    alpha = alpha.to(attn.dtype).unsqueeze(-1)  # (B, Q, H, 1)
    alpha_ma = alpha_ma.to(attn.dtype).view(1, 1, H, 1)
    out = alpha * attn + (alpha_ma - alpha) * mean.to(attn.dtype)
    return out, None
