"""Judging a fast path against its reference, tensor by tensor (part b).

A case compares named tensors — the output, then every gradient (training cases), or the logits of each comparable
decoding step (KV cache) — of the fast path (``got``) with the fp32 reference (``truth``), and in bf16 also the
naive reference run in bf16 on the same weights (``ref``) with the same truth.

- **Non-finite**: any NaN or ±inf in any tensor of ``got``, ``truth`` or ``ref`` fails the case, naming the tensor.
  (Reductions use torch, never Python's ``max`` over floats, which drops a NaN unless it comes first.)
- **Each tensor on its own scale**: ``rel_err = max |got − truth| / max |truth|`` of that tensor, so a parameter
  whose gradient is 1e-6 of the largest one (affine_scaled's W_a, the sink logit) is judged as strictly as the
  embeddings. fp32 passes at ``rel_err ≤ REL_TOL_FP32``; bf16 at ``rel_err ≤ max(BF16_FACTOR × ref_rel_err,
  BF16_FLOOR)``, where ``ref_rel_err`` is the bf16 reference's own error on that tensor: bf16 rounding of the
  weights and inputs is allowed, extra error of the fast path is not (the reference computes its scores in fp32,
  the fast path's fused kernels in bf16: hence a factor 4 rather than 1; a gradient off by a factor 2 has
  ``rel_err`` 1 and fails wherever the reference's own bf16 error is below 0.25).
- **Zero by construction**: a gradient whose fp32 truth is below ``ZERO_SCALE`` × the case's largest tensor is zero
  in exact arithmetic (e.g. BERT's key bias: softmax is invariant to the logit shift q·b_k shared by every key) and
  its values are rounding noise; it is judged on the case's largest scale instead of its own.
"""

from __future__ import annotations

import math

import torch

REL_TOL_FP32 = 1e-4
BF16_FACTOR = 4.0
BF16_FLOOR = 2e-2
ZERO_SCALE = 1e-9


def _amax(t: torch.Tensor) -> float:
    return t.detach().float().abs().max().item() if t.numel() else 0.0


def _non_finite(t: torch.Tensor) -> bool:
    return not bool(torch.isfinite(t.detach()).all())


def _limit(dtype_name: str, ref_rel: float | None) -> float:
    if dtype_name == "fp32":
        return REL_TOL_FP32
    return max(BF16_FACTOR * (ref_rel or 0.0), BF16_FLOOR)


def compare(names: list[str], got: list, truth: list, dtype_name: str, ref: list | None = None) -> dict:
    """Judge ``got`` (and ``ref``) against ``truth`` tensor by tensor; returns the fields of a case row.

    ``names``, ``got``, ``truth`` (and ``ref`` when given) are parallel lists; ``names[0]`` is the output.
    Fields: ``passed``, ``non_finite`` (``"<tensor> (<which>)"`` entries), ``worst_tensor`` with its ``rel_err``,
    ``ref_rel_err`` and ``limit`` (the tensor nearest to failing, or the most failing), ``out_rel_err``,
    ``max_abs_err`` (over all tensors), ``n_tensors``, ``zero_by_construction`` (names), ``tensors`` (per tensor
    ``[name, rel_err, ref_rel_err, limit]``).
    """
    if not (len(names) == len(got) == len(truth)) or (ref is not None and len(ref) != len(truth)):
        raise ValueError("names, got, truth (and ref) must be parallel lists")
    non_finite = [f"{n} ({which})" for which, tensors in (("fast path", got), ("fp32 reference", truth),
                                                          ("bf16 reference", ref or []))
                  for n, t in zip(names, tensors) if _non_finite(t)]
    scales = [_amax(t) for t in truth]
    case_scale = max((s for s in scales if math.isfinite(s)), default=0.0)
    tensors, zero, worst, max_abs = [], [], None, 0.0
    for i, name in enumerate(names):
        scale = scales[i]
        if scale <= ZERO_SCALE * case_scale:
            zero.append(name)
            scale = case_scale
        abs_err = _amax(got[i].float() - truth[i].float())
        rel = abs_err / scale if scale else abs_err
        ref_rel = None
        if ref is not None:
            ref_abs = _amax(ref[i].float() - truth[i].float())
            ref_rel = ref_abs / scale if scale else ref_abs
        limit = _limit(dtype_name, ref_rel)
        tensors.append([name, rel, ref_rel, limit])
        if not math.isnan(abs_err):
            max_abs = max(max_abs, abs_err)
        badness = rel / limit if math.isfinite(rel) else math.inf
        if worst is None or badness > worst[0]:
            worst = (badness, i)
    passed = not non_finite and all(rel <= limit for _, rel, _, limit in tensors)  # NaN compares False
    w = tensors[worst[1]]
    return dict(passed=passed, non_finite=non_finite, worst_tensor=w[0], rel_err=w[1], ref_rel_err=w[2],
                limit=w[3], out_rel_err=tensors[0][1], max_abs_err=max_abs, n_tensors=len(names),
                zero_by_construction=zero, tensors=tensors)
