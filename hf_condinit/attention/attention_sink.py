"""Attention sink: a learnable logit s_h per head in the softmax denominator (init 0), SDPA fast path.

    p_ij = exp(l_ij) / (exp(s_h) + Σ_j exp(l_ij)),   out_i = Σ_j p_ij v_j

Fast path: the sink is a *virtual key with a zero value*, placed at key position 0. Its logit must be s_h for every
query, which a key vector alone cannot give, so q and k get one extra coordinate: q' = [q, s_h/scale],
k'_sink = [0, 1], k'_j = [k_j, 0] (scale = the attention scale), so q'·k'_sink·scale = s_h and q'·k'_j = q·k_j.
The per-head part lives on the query side, so the keys stay per KV head (GQA needs no repeat). Values get the same
zero padding (fused SDPA kernels need equal q/k/v head dims) and the output drops it.

Visibility: with a mask, the sink column is always visible (so no row is ever fully masked; padding rows output 0);
without a mask and causal, a dummy query is prepended so that SDPA's upper-left ``is_causal`` lets query i see
the sink and keys 0..i (the flash/causal kernel is kept); otherwise every key and the sink are visible.

A neutral sink (s → −∞) gives plain SDPA; use a large finite value (e.g. −1e4): s = −inf would give 0·(−inf) = NaN.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ._common import crop_for_causal, effective_causal, get_holder, wants_attentions

__all__ = ["attention_sink_attention_forward", "extra_coordinates"]


def extra_coordinates(head_dim: int, device: torch.device) -> int:
    """Coordinates appended to q/k/v per head: 1 on CPU; elsewhere enough to make ``head_dim + extra`` a multiple of
    8 (at least 1), so the fused GPU kernels (flash / memory-efficient SDPA need head dims divisible by 8) stay
    eligible. The output does not depend on it (the extra coordinates are zero except the sink's)."""
    if device.type == "cpu":
        return 1
    return 8 - head_dim % 8 if head_dim % 8 else 8


def attention_sink_attention_forward(
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
    """HF attention function for ``attn_implementation="attention_sink"``."""
    if wants_attentions(kwargs):
        from .reference import attention_sink_reference

        return attention_sink_reference(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal
        )
    holder = get_holder(module, "condinit_sink", "attention_sink")
    B, H, Q, d = query.shape
    Hkv = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    causal = effective_causal(module, query, attention_mask, is_causal)
    if causal:
        key, value = crop_for_causal(key, value, Q)
    K = key.shape[2]
    extra = extra_coordinates(d, query.device)
    dt, dev = query.dtype, query.device

    s = (holder.logit / scale).to(dt).view(1, H, 1, 1).expand(B, H, Q, 1)
    q_aug = torch.cat([query, s, query.new_zeros(B, H, Q, extra - 1)], dim=-1)
    k_sink = key.new_zeros(B, Hkv, 1, d + extra)
    k_sink[..., d] = 1
    k_aug = torch.cat([k_sink, torch.cat([key, key.new_zeros(B, Hkv, K, extra)], dim=-1)], dim=2)
    # v padded too: SDPA's fused CPU/GPU kernels need equal q/k/v head dims (else the N×N math fallback runs)
    dv = value.shape[-1]
    v_aug = torch.cat([value, value.new_zeros(B, Hkv, K, d + extra - dv)], dim=-1) if dv < d + extra else value
    v_aug = torch.cat([v_aug.new_zeros(B, Hkv, 1, v_aug.shape[-1]), v_aug], dim=2)

    mask_aug = None
    if causal:
        q_aug = torch.cat([q_aug.new_zeros(B, H, 1, d + extra), q_aug], dim=2)
        flag = True
    elif attention_mask is None:
        flag = False
    else:
        flag = False
        lead = attention_mask.shape[:-1]
        if attention_mask.dtype == torch.bool:
            col = torch.ones(*lead, 1, dtype=torch.bool, device=dev)
        else:
            col = torch.zeros(*lead, 1, dtype=attention_mask.dtype, device=dev)
        mask_aug = torch.cat([col, attention_mask], dim=-1)

    out, _ = sdpa_attention_forward(
        module, q_aug, k_aug, v_aug, mask_aug, dropout=dropout, scaling=scale, is_causal=flag, **kwargs
    )  # (B, Q(+1), H, d)
    if causal:
        out = out[:, 1:]
    return out[..., :dv], None
