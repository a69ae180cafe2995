"""The fast path of Affine-Scaled Attention (Bae et al., arXiv 2602.23057; docs/methods.md §5).

    out = [α(X)·softmax(QKᵀ/√d) + β(X)]·V,   β = (α_ma − α)/N on the N keys the query may see
        = α·SDPA(Q, K, V) + (α_ma − α)·mean_visible(V)

mean_visible is a prefix mean (causal, no mask: O(N·d) with a cumulative sum) or a masked mean (any 4-D mask:
padding left or right, KV cache, packed sequences; one (Q×K)·(K×d) product with the 0/1 mask, no softmax). The fused
SDPA kernel is kept; the N×N weights are materialised only when attention weights are requested.

X is the attention module's input (the normalised hidden state feeding q/k/v). It arrives as a keyword argument of
this call (`hf_condinit.attention.affine_scaled.holder.AFFINE_INPUT_KWARG`, added by the forward pre-hook that
`hf_condinit.attention.inject` registers), so nothing is stored between calls: one model can serve several threads,
and under gradient checkpointing the re-forward re-runs the hook, so the recomputed α is identical.

The output uses α_ma as it stood *before* this batch; a training forward then updates α_ma from the batch's real
tokens (a query is real when it may attend to its own key position: padding rows are excluded), detached, never in
the backward re-forward of gradient checkpointing, and never in eval (`AffineScaledHolder.alpha_ma_for_forward`).
Updating first would let every token of the batch change every output through the batch mean (docs/methods.md §5).
Dropout (training) applies to the softmax part only.

The gradient of α in bf16 (`difference_for_alpha_grad`): ∂out/∂α = SDPA(V) − mean_visible(V), a small difference of
two near-equal terms where the attention is near-uniform (at init). Taken from bf16 SDPA, whose kernels round the
softmax weights to bf16 (2⁻⁹), it loses most of its digits: W_a's gradient was 6–66× less accurate than the naive
reference's in bf16. So a bf16 training step that needs W_a's gradient (and has no attention dropout) computes
that difference a second time, in the *backward* of `_AffineOutput`, in fp16 (2⁻¹¹ weights, the same fused kernels,
no N×N matrix; one fp16 forward of the kernel: +32–46 % of a causal bf16 SDPA forward + backward on an H200, 20
heads of 64, 32k tokens, sequence 1024–8192, an fp32 pass +240–350 %), on V centred by its per-sequence mean and
scaled to ≤ 1 (SDPA(V − c) − mean(V − c) = SDPA(V) − mean(V) exactly for any c constant over the keys, since the
weights of a query sum to 1; the centred difference has small magnitudes, and the scaling keeps fp16 from
overflowing). Only α's gradient uses it: the output and every other gradient are those of the bf16 SDPA. Elements
where the fp16 pass is not finite fall back to the bf16 difference. With attention dropout the pass is skipped (it
cannot reuse SDPA's dropout mask), and so are fp32 / fp16 models and forwards without gradient.

Not done (measured): a single bf16 SDPA pass on V centred by its per-sequence mean, reused for α's gradient, gives
W_a's bf16 gradient a relative error of 0.157 against the reference's own 0.035 (Llama case of
tests/attention/test_affine_scaled.py; 0.23 uncentred, 0.046 with the fp16 pass): the bf16 rounding of the softmax
weights, not V's common offset, dominates.

Memory (`_AffineOutput`): the combination α·(A − m) + α_ma·m saves only α beyond what SDPA saves; A − m is
recomputed in the backward (m from V: a prefix sum, or a masked mean with a mask).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from .._common import (
    cast_fresh,
    condinit_options,
    crop_for_causal,
    effective_causal,
    get_holder,
    visible_from_mask,
    wants_attentions,
)
from .options import AFFINE_SCALED_OPTIONS
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
        visible = visible_from_mask(attention_mask)
        if visible.shape[1] not in (1, v.shape[1]):
            raise ValueError(f"mask with {visible.shape[1]} heads does not broadcast over {v.shape[1]} key/value heads")
        sums = _MaskedSum.apply(visible, v)
        counts = visible.sum(dim=-1, keepdim=True).to(v.dtype)
    if bias_length == "full":
        counts = torch.full_like(counts[..., :1, :1], float(K))
    return sums / counts.clamp(min=1.0)


class _MaskedSum(torch.autograd.Function):
    """``visible @ value`` for a boolean visibility (B or 1, 1 or H_kv, Q, K) and values (B, H_kv, K, d), saving only
    the boolean mask (which SDPA's caller holds anyway), not its float copy broadcast over the heads."""

    @staticmethod
    def forward(ctx, visible, value):
        ctx.save_for_backward(visible)
        return torch.matmul(visible.to(value.dtype), value)

    @staticmethod
    def backward(ctx, grad):
        (visible,) = ctx.saved_tensors
        return None, torch.matmul(visible.to(grad.dtype).transpose(-1, -2), grad)


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
    opts = condinit_options(module, AFFINE_SCALED_OPTIONS)
    _, H, Q, _ = query.shape
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

    bias_length = opts["affine_bias_length"]
    mean = _mean_per_head(value, attention_mask, causal, Q, bias_length, H)  # (B, Q, H, d) fp32
    precise = attn.dtype == torch.bfloat16 and alpha.requires_grad and torch.is_grad_enabled() and dropout == 0.0
    recompute = dict(module=module, mask=attention_mask, causal=causal, bias_length=bias_length, precise=precise,
                     kwargs=dict(scaling=scaling, is_causal=is_causal, **kwargs))
    out = _AffineOutput.apply(alpha.float(), attn, mean, alpha_ma, query, key, value, recompute)
    return out, None


def _mean_per_head(value, attention_mask, causal: bool, q_len: int, bias_length: str, n_heads: int) -> torch.Tensor:
    """`mean_visible` repeated over the query heads of each KV head: (B, Q, H, d) fp32."""
    mean = mean_visible(value, attention_mask, causal, q_len, bias_length)  # (B, H_kv, Q, d)
    return repeat_kv(mean, n_heads // mean.shape[1]).transpose(1, 2)


def difference_for_alpha_grad(
    module, query, key, value, attention_mask, causal: bool, bias_length: str, fallback: torch.Tensor, **kwargs
) -> torch.Tensor:
    """SDPA(V) − mean_visible(V), (B, Q, H, d) fp32, from one fp16 SDPA forward without gradient (module docstring).

    V is centred by its mean over all keys of its sequence and head, c (exact for any mask: the weights of every query
    sum to 1 over its visible keys, and mean_visible subtracts the same c), and divided by s = max |V − c| (exact up
    to rounding; fp16 cannot overflow). ``fallback`` (the bf16 difference) replaces non-finite elements (q or k past
    fp16's range, fully masked rows). Autocast is disabled, so the kernel runs in fp16 whatever the context.
    """
    with torch.no_grad(), torch.autocast(query.device.type, enabled=False):
        v = value.float()
        centred = v - v.mean(dim=2, keepdim=True)
        s = centred.abs().amax(dim=(2, 3), keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # (B, H_kv, 1, 1)
        v16 = (centred / s).half()
        mask = attention_mask
        if mask is not None and mask.is_floating_point():  # additive: in the kernel's dtype (masked: −inf)
            mask = mask.float().clamp(min=torch.finfo(torch.float32).min).half()
        attn, _ = sdpa_attention_forward(module, query.half(), key.half(), v16, mask, **kwargs)
        mean = mean_visible(v16, attention_mask, causal, query.shape[2], bias_length)
        n_rep = query.shape[1] // value.shape[1]
        diff = (attn.float() - repeat_kv(mean, n_rep).transpose(1, 2)) * repeat_kv(s, n_rep).transpose(1, 2)
        return torch.where(torch.isfinite(diff), diff, fallback)


class _AffineOutput(torch.autograd.Function):
    """out = α·(A − m) + α_ma·m = α·SDPA(V) + (α_ma − α)·m, in A's dtype, keeping no per-call tensor of its own.

    Inputs: α (B, Q, H) fp32; A = SDPA(Q, K, V) (B, Q, H, d); m = the visible mean (B, Q, H, d) fp32 (its gradient
    flows on to V through autograd); α_ma (H,) fp32, no gradient; query, key, value: only read in the backward (no
    gradient from here: theirs flows through SDPA); ``recompute``: module, mask, causal, bias_length, precise, kwargs.

    Saved: α, and tensors SDPA saves anyway (A, query, key, value, the mask): ∂out/∂α = A − m is recomputed in the
    backward — m from V (a prefix or masked mean), or, when ``precise`` (bf16 training, module docstring), from the
    fp16 difference pass `difference_for_alpha_grad`, which therefore runs in the backward, not the forward.
    """

    @staticmethod
    def forward(ctx, alpha, attn, mean, alpha_ma, query, key, value, recompute):
        out = alpha.unsqueeze(-1) * (attn.float() - mean) + alpha_ma.view(1, 1, -1, 1) * mean
        ctx.save_for_backward(alpha, attn, alpha_ma, query, key, value, recompute["mask"])
        ctx.recompute = {k: v for k, v in recompute.items() if k != "mask"}
        return cast_fresh(out, attn.dtype)

    @staticmethod
    def backward(ctx, grad):
        alpha, attn, alpha_ma, query, key, value, mask = ctx.saved_tensors
        r = ctx.recompute
        g = grad.float()
        a = alpha.unsqueeze(-1)
        grad_attn = cast_fresh(g * a, attn.dtype) if ctx.needs_input_grad[1] else None
        grad_mean = g * (alpha_ma.view(1, 1, -1, 1) - a) if ctx.needs_input_grad[2] else None
        grad_alpha = None
        if ctx.needs_input_grad[0]:
            with torch.no_grad():
                mean = _mean_per_head(value, mask, r["causal"], query.shape[2], r["bias_length"], query.shape[1])
                diff = attn.float() - mean
                if r["precise"]:
                    diff = difference_for_alpha_grad(r["module"], query, key, value, mask, r["causal"],
                                                     r["bias_length"], diff, **r["kwargs"])
            grad_alpha = (g * diff).sum(dim=-1)
        return grad_alpha, grad_attn, grad_mean, None, None, None, None, None
