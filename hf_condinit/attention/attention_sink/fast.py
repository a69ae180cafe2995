"""The fast path of the attention sink, a learnable logit s_h per head in the softmax denominator (init 0).

    p_ij = exp(l_ij) / (exp(s_h) + Σ_j exp(l_ij)),   out_i = Σ_j p_ij v_j = σ(lse_i − s_h) · O_i

where O, lse = softmax(l)·V and logsumexp_j(l_ij) over the real keys (the sink has no value vector: it only takes
probability mass away). **Fast path** (`SinkAttention`): one call of a fused kernel that returns lse beside O
(``_scaled_dot_product_flash_attention_for_cpu`` on CPU, ``_scaled_dot_product_flash_attention`` on CUDA), then the
per-row factor w = σ(lse − s) = exp(lse − lse'), lse' = logaddexp(lse, s). Head dim and q/k/v are unchanged; the keys
stay per KV head where the kernel reads GQA itself (`kernel_takes_gqa`: the CPU kernel from torch 2.9), otherwise
they are repeated to the query heads before the call (`sink_attention`; autograd sums their gradients back, as HF's
SDPA path does on such torch). The backward is the kernel's own backward called with the sink's log-normaliser lse'
and the sink's output: the kernel recomputes P' = exp(l − lse') = w·P (the probabilities of the sink softmax) and
Δ = rowsum(dOut ∘ out), which is exactly the backward of softmax-with-sink; the sink's gradient is written out:
∂L/∂s_h = −Σ_{b,i} (1 − w_i)·⟨dOut_i, out_i⟩. Saved tensors: q, k, v (repeated when they were), out, lse' (what SDPA
saves).

Visibility: with a 4-D mask, the mask (converted to the kernel's additive form in the query dtype); a fully masked
row has lse = finfo.min, so w = 0 and the row outputs 0 (as the reference). Without a mask and causal, upper-left
``is_causal`` over keys cropped to the query length (`crop_for_causal`); otherwise every key.

**Fallback** (attention dropout in training, or a device/case without an lse kernel: CUDA with a mask, GQA or a dtype
other than fp16/bf16; other devices): the sink as a *virtual key with a zero value* at key position 0 through HF's
SDPA. Its logit must be s_h for every query, which a key vector alone cannot give, so q and k get extra
coordinates: q' = [q, s_h/scale], k'_sink = [0, 1], k'_j = [k_j, 0], so q'·k'_sink·scale = s_h and q'·k'_j = q·k_j
(`extra_coordinates`: 1 on CPU, up to a multiple of 8 elsewhere for the fused GPU kernels). With a mask the sink
column is always visible; without one and causal, a dummy query is prepended so that upper-left ``is_causal`` lets
query i see the sink and keys 0..i.

A neutral sink (s → −∞) gives plain SDPA; use a large finite value (e.g. −1e4): s = −inf would give NaN gradients.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from .._common import cast_fresh, crop_for_causal, effective_causal, get_holder, wants_attentions
from .reference import attention_sink_reference

__all__ = [
    "attention_sink_attention_forward",
    "SinkAttention",
    "sink_attention",
    "lse_kernel",
    "lse_kernel_choice",
    "kernel_takes_gqa",
    "extra_coordinates",
]

#: Whether ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward) read key/value with fewer heads than the
#: query. Added by pytorch/pytorch#157893 "[CPU] Support GQA for flash attention" (July 2025, first released in torch
#: 2.9.0); before it, aten/src/ATen/native/cpu/FlashAttentionKernel.cpp indexes k/v with the query's head index
#: and no check: out-of-bounds reads (NaN or garbage on 2.5.1 / 2.6.0 / 2.8.0) and writes in the backward (heap
#: corruption, abort). torch's own dispatcher agrees: ``torch._fused_sdp_choice(q, k, v, enable_gqa=True)`` picks the
#: CPU flash kernel from 2.9.0, the math kernel before. Decided by version, never by probing the kernel.
CPU_KERNEL_TAKES_GQA = torch.__version__ >= (2, 9)


def extra_coordinates(head_dim: int, device: torch.device) -> int:
    """Fallback path: coordinates appended to q/k/v per head: 1 on CPU; elsewhere enough to make ``head_dim + extra``
    a multiple of 8 (at least 1), so the fused GPU kernels (flash / memory-efficient SDPA need head dims divisible by
    8) stay eligible. The output does not depend on it (the extra coordinates are zero except the sink's)."""
    if device.type == "cpu":
        return 1
    return 8 - head_dim % 8 if head_dim % 8 else 8


def lse_kernel_choice(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask,
                      dropout: float) -> tuple[str | None, str]:
    """Which fused kernel returning (O, lse) serves this call, and why: (``"cpu"``, ``"cuda"`` or None for the
    virtual-key fallback; the deciding condition in words, a constant string).

    CPU: ``_scaled_dot_product_flash_attention_for_cpu`` (fp64 / fp32 / bf16 / fp16 and additive masks on every torch
    from 2.5, GQA from 2.9: `kernel_takes_gqa`; no dropout). CUDA: ``_scaled_dot_product_flash_attention``
    (fp16/bf16, no mask, equal q/k/v head counts and head dims, head dim a multiple of 8 up to 256; dropout supported
    through its RNG state).
    """
    if query.device.type == "cpu":
        if dropout != 0.0:
            return None, "attention dropout: the CPU kernel has none"
        return "cpu", "CPU without attention dropout"
    if query.device.type != "cuda":
        return None, "no kernel returning lse on this device type"
    if mask is not None:
        return None, "a mask: the CUDA flash kernel takes none"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return None, "dtype other than fp16 / bf16"
    if query.shape[1] != key.shape[1]:
        return None, "fewer key/value heads than query heads (GQA)"
    if query.shape[-1] != value.shape[-1] or query.shape[-1] % 8 or query.shape[-1] > 256:
        return None, "head dim not a multiple of 8 up to 256, or v's head dim differs"
    return "cuda", "CUDA, fp16 / bf16, no mask, equal heads, head dim a multiple of 8 up to 256"


def lse_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, dropout: float) -> str | None:
    """`lse_kernel_choice` without the reason: ``"cpu"``, ``"cuda"`` or None (use the fallback)."""
    return lse_kernel_choice(query, key, value, mask, dropout)[0]


def kernel_takes_gqa(kernel: str) -> bool:
    """Whether ``kernel`` (`lse_kernel`) may be called with key/value having fewer heads than the query: the CPU
    kernel where the running torch supports it (`CPU_KERNEL_TAKES_GQA`); never the CUDA one (`lse_kernel` gives it
    equal head counts only)."""
    return kernel == "cpu" and CPU_KERNEL_TAKES_GQA


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A 4-D boolean (True = attend) or additive mask as the additive mask in ``dtype`` that the CPU kernel takes."""
    if mask is None:
        return None
    lowest = torch.finfo(dtype).min
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, lowest)
    return mask.clamp(min=lowest).to(dtype) if mask.dtype != dtype else mask


class SinkAttention(torch.autograd.Function):
    """Softmax attention with a per-head sink logit, from one fused kernel call (module docstring).

    Inputs: query (B, H, Q, d), key / value (B, H_kv, K, d) (H_kv = H unless `kernel_takes_gqa`: call it through
    `sink_attention`, which repeats the KV heads where needed), logit (H,) the sink logits, mask
    None or additive (B or 1, 1, Q, K) in the query dtype, causal (upper-left, keys already cropped), scale,
    dropout (CUDA only), kernel (`lse_kernel`). Output: (B, H, Q, d) in the query dtype.
    """

    @staticmethod
    def forward(ctx, query, key, value, logit, mask, causal: bool, scale: float, dropout: float, kernel: str):
        H = query.shape[1]
        if key.shape[1] != H and not kernel_takes_gqa(kernel):  # the kernel would read and write out of bounds
            raise ValueError(f"SinkAttention: {key.shape[1]} key/value heads for {H} query heads, which the {kernel!r} "
                             f"kernel of torch {torch.__version__} does not support; call sink_attention")
        if kernel == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, 0.0, causal, attn_mask=mask, scale=scale)
            extra = ()
        else:
            out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout, causal, False, scale=scale)
            extra = (cum_q, cum_k, seed, offset)
            ctx.max_q, ctx.max_k = max_q, max_k
        # lse is fp32 (fp64 for fp64 inputs); the kernel's backward takes the sink's lse' in the same dtype
        lse_sink = torch.logaddexp(lse, logit.detach().to(lse.dtype).view(1, H, 1))  # (B, H, Q)
        w = torch.exp(lse - lse_sink).unsqueeze(-1)  # σ(lse − s), (B, H, Q, 1)
        out = cast_fresh(out.to(lse.dtype) * w, query.dtype)
        ctx.save_for_backward(query, key, value, out, lse_sink, logit, mask, *extra)
        ctx.causal, ctx.scale, ctx.dropout, ctx.kernel = causal, scale, dropout, kernel
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, out, lse_sink, logit, mask, *extra = ctx.saved_tensors
        if ctx.kernel == "cpu":
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, query, key, value, out, lse_sink, 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale)
        else:
            cum_q, cum_k, seed, offset = extra
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                grad, query, key, value, out, lse_sink, cum_q, cum_k, ctx.max_q, ctx.max_k, ctx.dropout, ctx.causal,
                seed, offset, scale=ctx.scale)
        g_logit = None
        if ctx.needs_input_grad[3]:
            one_minus_w = torch.exp(logit.detach().to(lse_sink.dtype).view(1, -1, 1) - lse_sink)  # (B, H, Q)
            dot = (grad.to(lse_sink.dtype) * out.to(lse_sink.dtype)).sum(-1)  # ⟨dOut_i, out_i⟩
            g_logit = cast_fresh(-(one_minus_w * dot).sum(dim=(0, 2)), logit.dtype)
        return gq, gk, gv, g_logit, None, None, None, None, None


def sink_attention(query, key, value, logit, mask, causal: bool, scale: float, dropout: float, kernel: str):
    """`SinkAttention` with the KV heads repeated to the query heads (outside the Function, so autograd sums their
    gradients back) unless `kernel_takes_gqa`. Shapes and arguments as `SinkAttention`; returns (B, H, Q, d)."""
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1 and not kernel_takes_gqa(kernel):
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    return SinkAttention.apply(query, key, value, logit, mask, causal, scale, dropout, kernel)


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
        return attention_sink_reference(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal
        )
    holder = get_holder(module, "condinit_sink", "attention_sink")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    causal = effective_causal(module, query, attention_mask, is_causal)
    if causal:
        key, value = crop_for_causal(key, value, query.shape[2])
    kernel = lse_kernel(query, key, value, attention_mask, dropout)
    if kernel is not None:
        mask = _additive_mask(attention_mask, query.dtype) if kernel == "cpu" else None
        out = sink_attention(query, key, value, holder.logit, mask, causal, scale, dropout, kernel)
        return out.transpose(1, 2), None  # (B, Q, H, d)
    return _virtual_key_attention(module, query, key, value, holder.logit, attention_mask, causal, scale, dropout,
                                  **kwargs), None


def _virtual_key_attention(module, query, key, value, logit, attention_mask, causal: bool, scale: float,
                           dropout: float, **kwargs) -> torch.Tensor:
    """The fallback: the sink as a virtual key with a zero value, through HF's SDPA (module docstring).
    Shapes as `SinkAttention` (keys already cropped when ``causal``); returns (B, Q, H, d)."""
    B, H, Q, d = query.shape
    Hkv, K = key.shape[1], key.shape[2]
    extra = extra_coordinates(d, query.device)
    dt, dev = query.dtype, query.device

    s = (logit / scale).to(dt).view(1, H, 1, 1).expand(B, H, Q, 1)
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
    return out[..., :dv]
