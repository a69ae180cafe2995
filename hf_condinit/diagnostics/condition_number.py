"""Condition number of the attention Jacobian with respect to the query, key and value weights, its side quantities
and bounds (docs/methods.md §6, "The definitions", where the choices below are argued).

Pure tensor functions: no model, layout or Trainer knowledge. J, its Gram matrix ``G = J Jᵀ``, the notation (X, P,
A, ``Λ(p)``, ``M_t``, ``R_t``, the scaling ``s``), the vec convention and the closed form are those of
:mod:`.jacobian`.

- ``κ(J) = sqrt(λ_max / λ_min⁺)`` over the eigenvalues of G, ``λ_min⁺`` the smallest one ``> rtol · λ_max``
  (``method="eig"``, ``rtol = 1e-12``: resolves κ up to ~1e6), or ``σ_max / σ_min⁺`` over the singular values of the
  explicit J (``method="svd"``, tolerance ``(max(m, n)·eps)²`` on the λ scale: up to ~1e12, J in memory). With
  ``refine=True`` a saturated eig result is redone by SVD when J has at most ``SVD_REFINE_MAX_ELEMENTS`` entries.
- *saturated*: more eigenvalues under the tolerance than J's a-priori rank deficit ``n_structural``; κ is then the
  condition number of J's resolvable part, a **lower bound** (``HeadCondition.kappa_is_lower_bound``).
- beside κ, each ``σ_max / σ_min⁺`` (``σ_min⁺ > max(shape)·eps·σ_max``): ``kappa_x`` (stacked valid tokens X),
  ``kappa_px`` (P X), ``kappa_p`` (P, block-diagonal over sequences), ``kappa_lambda`` (``blockdiag_t Λ(p_t)``),
  ``kappa_wq`` / ``kappa_wk`` / ``kappa_wv`` (the (D, d) weights);
- ``bound``: the papers' surrogate ``kappa_x**3 · kappa_lambda · kappa_wv · (kappa_wq + kappa_wk) + kappa_x ·
  kappa_p``, **not** an upper bound of κ(J);
- ``upper_bound`` (:func:`jacobian_upper_bound`): ``sqrt(κ(PX)² + ‖J_QK‖_F² / σ_min(PX)²)``, proven when the stacked
  P X has full row rank, ``nan`` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from .jacobian import JacobianBlocks, attention_head_jacobian, gram_from_blocks, jacobian_blocks

__all__ = [
    "BOUND_NOTES",
    "HeadCondition",
    "condition_bound",
    "head_condition_number",
    "jacobian_upper_bound",
    "pseudo_condition_number",
    "singular_values",
    "softmax_jacobian_condition_number",
]

#: What the two bounds beside κ are, in the words every display prints under them (module docstring).
BOUND_NOTES = (
    "κ ≤: a proven upper bound, sqrt(κ(PX)² + ‖J_QK‖_F²/σ_min(PX)²); n/a when P X lacks full row rank (tokens > width)",
    "surrogate: the papers' κ(X)³κ(Λ)κ(W_V)(κ(W_Q)+κ(W_K)) + κ(X)κ(P), not an upper bound: it ignores the scale of",
    "  W_V: under a causal mask κ is at least ‖J_QK‖/|x_0|, which grows with |W_V| past it (diagnostics.condition_number)",
)

DEFAULT_EIG_RTOL = 1e-12
_SVD_MAX_ELEMENTS = 100_000_000  # 800 MB of float64
SVD_REFINE_MAX_ELEMENTS = 4_000_000  # 32 MB of float64: a saturated eig result is redone with svd up to this size


# ----------------------------------------------------------------------------------------------------------------
# condition numbers
# ----------------------------------------------------------------------------------------------------------------


def _kappa_from_values(values: torch.Tensor, rtol: float) -> tuple[float, int]:
    """σ_max / σ_min⁺ over non-negative `values` (singular values), σ_min⁺ the smallest > rtol·σ_max."""
    values = values.abs()
    if values.numel() == 0:
        return float("nan"), 0
    vmax = float(values.max())
    if vmax == 0.0:
        return float("nan"), int(values.numel())
    kept = values[values > rtol * vmax]
    return vmax / float(kept.min()), int(values.numel() - kept.numel())


def singular_values(M: torch.Tensor) -> torch.Tensor:
    """The ``min(m, n)`` singular values of a matrix, descending: those of the triangular factor R of a QR of its
    taller orientation (``Mᵀ = Q R`` for a wide M), which are M's own up to rounding (Householder QR is backward
    stable). The square SVD is what costs: on the ViT's 2,080 × 12,288 head Jacobian ``svdvals(M)`` took 49 s and
    the QR with ``svdvals(R)`` 5.4 s (one thread), the values equal to 2e-15 of σ_max."""
    tall = M.mT if M.shape[-2] < M.shape[-1] else M
    if tall.shape[-1] * 2 > tall.shape[-2]:  # nearly square: nothing to gain
        return torch.linalg.svdvals(M)
    return torch.linalg.svdvals(torch.linalg.qr(tall, mode="r")[1])


def pseudo_condition_number(M: torch.Tensor, rtol: Optional[float] = None) -> float:
    """``σ_max / σ_min⁺`` of a matrix (or of the block-diagonal of a stack ``(..., m, n)``), float64.

    Args:
        M (`torch.Tensor`): a matrix, or a stack of blocks whose singular values are pooled.
        rtol (`float`, *optional*, defaults to ``max(m, n) · eps``): singular values ``≤ rtol · σ_max`` are zero.

    Returns:
        `float`: the pseudo-condition number (``nan`` for a zero matrix).
    """
    M = M.detach().to("cpu", torch.float64)
    if rtol is None:
        rtol = max(M.shape[-2:]) * torch.finfo(torch.float64).eps
    return _kappa_from_values(torch.linalg.svdvals(M).reshape(-1), rtol)[0]


def softmax_jacobian_condition_number(P: torch.Tensor, rtol: Optional[float] = None) -> float:
    """``κ(Λ(P))``: pseudo-condition number of the row-wise softmax Jacobian of probability rows ``P (..., N)``.

    The Jacobian of a row-wise softmax is ``blockdiag_t Λ(p_t)`` with ``Λ(p) = Diag(p) − p pᵀ``; its singular values
    are the pooled eigenvalues of the (symmetric PSD) blocks. Every row of ``P`` (any leading shape) is one block;
    pass only the rows that count (valid queries).

    Args:
        P (`torch.Tensor`): probability rows, shape ``(..., N)``.
        rtol (`float`, *optional*, defaults to ``N · eps``): eigenvalues ``≤ rtol · max`` count as zero.
    """
    P = P.detach().to("cpu", torch.float64).reshape(-1, P.shape[-1])
    if rtol is None:
        rtol = P.shape[-1] * torch.finfo(torch.float64).eps
    L = torch.diag_embed(P) - P[:, :, None] * P[:, None, :]
    return _kappa_from_values(torch.linalg.eigvalsh(L).reshape(-1), rtol)[0]


def condition_bound(kappa_x, kappa_lambda, kappa_wq, kappa_wk, kappa_wv, kappa_p) -> float:
    """The papers' surrogate (docs/methods.md §1): ``κ(X)³ κ(Λ) κ(W_V) (κ(W_Q) + κ(W_K)) + κ(X) κ(P)``. Not an
    upper bound of κ(J): it is blind to the scale of W_V, which under a causal mask drives κ(J) past it (module
    docstring); :func:`jacobian_upper_bound` is one."""
    return kappa_x ** 3 * kappa_lambda * kappa_wv * (kappa_wq + kappa_wk) + kappa_x * kappa_p


def _qk_frobenius_squared(blk: JacobianBlocks) -> float:
    """``‖[J_Q J_K]‖_F² = s² Σ_t (|x_t|² ‖M_t‖_F² + |q_t|² ‖R_t‖_F²)`` (module docstring)."""
    x2 = blk.Xt.square().sum(-1)
    q2 = blk.Qt.square().sum(-1)
    m2 = blk.Mt.square().sum((-2, -1))
    r2 = blk.Rt.square().sum((-2, -1))
    return blk.scaling ** 2 * float((x2 * m2 + q2 * r2).sum())


def jacobian_upper_bound(px_singular_values: torch.Tensor, n_tokens: int, qk_frobenius_squared: float,
                         rtol: float) -> float:
    """A proven upper bound of κ(J): ``sqrt(κ(PX)² + ‖J_QK‖_F² / σ_min(PX)²)`` when the stacked ``P X`` (``T×D``,
    ``T = n_tokens``; ``px_singular_values`` descending) has full row rank: ``T`` singular values (``T ≤ D``), the
    smallest ``> rtol · σ_max``. ``nan`` otherwise: the bound does not apply. Proof in the module docstring."""
    sv = px_singular_values
    if sv.numel() < n_tokens or n_tokens == 0 or float(sv[-1]) <= rtol * float(sv[0]):
        return float("nan")
    smax, smin = float(sv[0]), float(sv[-1])
    return math.sqrt((smax / smin) ** 2 + qk_frobenius_squared / smin ** 2)


@dataclass
class HeadCondition:
    """Condition diagnostics of one head on one probe (see the module docstring for every definition).

    Attributes:
        kappa: ``κ(J) = sqrt(λ_max / λ_min⁺)``.
        lambda_max, lambda_min: ``λ_max`` and ``λ_min⁺`` of ``G = J Jᵀ`` (σ² for ``method="svd"``).
        n_below_tol: eigenvalues of G (σ² of J) ``≤ rtol · λ_max``, excluded from κ.
        n_structural: a-priori rank deficit (shape and parameter symmetries; module docstring).
        saturated: ``n_below_tol > n_structural`` (κ is then a lower bound, or J is exactly rank-deficient).
        kappa_is_lower_bound: True when ``kappa`` is only a lower bound of κ(J) (= ``saturated``; module
            docstring), False when it is the resolved value.
        rtol: the relative tolerance used, on the λ = σ² scale.
        method: ``"eig"`` or ``"svd"``: the method that produced ``kappa`` (``"svd"`` after a refinement).
        refined: True when ``method="eig"`` was asked for, saturated, and recomputed with ``"svd"``.
        n_rows, n_cols: shape of J.
        kappa_px, kappa_p, kappa_x, kappa_lambda, kappa_wq, kappa_wk, kappa_wv: pseudo-condition numbers.
        bound: the papers' surrogate, :func:`condition_bound` of those: **not** an upper bound (κ may exceed it).
        upper_bound: :func:`jacobian_upper_bound`, ``κ ≤ upper_bound`` proven; ``nan`` when P X does not have full
            row rank (more probe tokens than width), where it does not apply.
        spectrum: the eigenvalues of G, ascending (only with ``return_spectrum=True``; left out of ``to_dict``).
    """

    kappa: float
    lambda_max: float
    lambda_min: float
    n_below_tol: int
    n_structural: int
    saturated: bool
    rtol: float
    method: str
    n_rows: int
    n_cols: int
    kappa_px: float
    kappa_p: float
    kappa_x: float
    kappa_lambda: float
    kappa_wq: float
    kappa_wk: float
    kappa_wv: float
    bound: float
    upper_bound: float = float("nan")
    kappa_is_lower_bound: bool = False
    refined: bool = False
    spectrum: Optional[torch.Tensor] = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("spectrum")
        return out


def _parameter_null_dim(blk: JacobianBlocks, b_q) -> int:
    """Directions of (W_Q, W_K, W_V) that leave A unchanged to first order, whatever the probe's size.

    - gauge: ``dW_Q = W_Q E``, ``dW_K = −W_K Eᵀ`` changes S only by ``−1 (b_Qᵀ E Kᵀ)`` plus row-constant terms
      (annihilated by the softmax), so it is a null direction for every ``E`` with ``b_Qᵀ E = 0``: ``d²`` of them
      without a query bias, ``d² − d`` with one;
    - key shift: ``X dW_K = 1 uᵀ`` (possible iff the all-ones vector is in the column space of the stacked X) adds
      the same ``s q_t·u`` to every logit of a row: ``d`` more.
    """
    d = blk.Qt.shape[1]
    bias = b_q is not None and bool(torch.as_tensor(b_q).detach().abs().max() > 0)
    n = d * (d - 1) if bias else d * d
    ones = torch.ones(blk.Xt.shape[0], 1, dtype=torch.float64)
    coef = torch.linalg.lstsq(blk.Xt, ones, driver="gelsd").solution
    if float((blk.Xt @ coef - ones).norm()) <= 1e-8 * math.sqrt(blk.Xt.shape[0]):
        n += d
    return n


def head_condition_number(X, W_q, W_k, W_v, b_q=None, b_k=None, b_v=None, *, scaling, causal=False,
                          key_padding_mask=None, attn_mask=None, method: str = "eig", rtol: Optional[float] = None,
                          return_spectrum: bool = False, x_rtol: Optional[float] = None,
                          device=None, refine: bool = True) -> HeadCondition:
    """κ of the attention Jacobian of one head w.r.t. ``(W_Q, W_K, W_V)``, with the side quantities, the papers'
    surrogate (not a bound) and a proven upper bound (module docstring).

    Args:
        X (`torch.Tensor`): ``(N, D)`` or ``(B, N, D)`` attention input (the probe's sequences; J stacks over them).
        W_q, W_k, W_v (`torch.Tensor`): ``(D, d)`` weights in math orientation (``Q = X W_q + b_q``).
        b_q, b_k, b_v (`torch.Tensor`, *optional*): ``(d,)`` biases (held fixed, they only shift Q, K, V).
        scaling (`float`): logit scale (e.g. ``d ** -0.5``).
        causal (`bool`, *optional*, defaults to `False`): lower-triangular mask.
        key_padding_mask (`torch.Tensor`, *optional*): ``(B, N)``, 1/True = real token. Padded tokens are removed
            from both sides: they are masked as keys and their query rows are left out of J.
        attn_mask (`torch.Tensor`, *optional*): extra bool mask ``(N, N)`` or ``(B, N, N)``, True = may attend.
        method (`str`, *optional*, defaults to ``"eig"``): ``"eig"`` (closed-form G, ``eigvalsh``) or ``"svd"``
            (closed-form explicit J, :func:`singular_values`; small probes only).
        rtol (`float`, *optional*): relative tolerance on the λ = σ² scale; defaults to ``1e-12`` (eig) or
            ``(max(n_rows, n_cols) · eps)²`` (svd).
        return_spectrum (`bool`, *optional*, defaults to `False`): keep the eigenvalues of G in the result.
        x_rtol (`float`, *optional*, defaults to ``max(shape) · eps(float64)``): relative tolerance on σ for
            ``kappa_x`` and ``kappa_px``. Choice: pass the precision X was computed in (the model-level API passes
            ``sqrt(max(T, D)) · eps(dtype of X)``): LayerNorm outputs with zero bias lie on the hyperplane
            ``x · 1 = 0``, and a float32 X then has one singular value at rounding level (~1e-7 σ_max) that is
            not a property of the model.
        device (`torch.device` or `str`, *optional*, defaults to CPU): where G is built and ``eigvalsh`` runs
            (float64; e.g. ``"cuda"``: the (T·d)² eigenproblem dominates the cost). Everything else runs on CPU.
        refine (`bool`, *optional*, defaults to `True`): with ``method="eig"``, recompute a saturated result with
            ``method="svd"`` when J has at most ``SVD_REFINE_MAX_ELEMENTS`` entries.

    Returns:
        :class:`HeadCondition` (``kappa_is_lower_bound`` says whether ``kappa`` is resolved or a lower bound).
    """
    if method not in ("eig", "svd"):
        raise ValueError(f"method must be 'eig' or 'svd', got {method!r}")
    blk = jacobian_blocks(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling, causal, key_padding_mask, attn_mask)
    T, D = blk.Xt.shape
    d = blk.Qt.shape[1]
    n_rows, n_cols = T * d, 3 * D * d
    eps = torch.finfo(torch.float64).eps
    if method == "eig":
        if rtol is None:
            rtol = DEFAULT_EIG_RTOL
        # row order does not change eigenvalues
        lam = torch.linalg.eigvalsh(gram_from_blocks(blk, permute=False, device=device)).cpu()
    else:
        if n_rows * n_cols > _SVD_MAX_ELEMENTS:
            raise ValueError(f"method='svd' would materialise J of shape {(n_rows, n_cols)}; use method='eig' "
                             "or a smaller probe")
        if rtol is None:
            rtol = (max(n_rows, n_cols) * eps) ** 2
        J = attention_head_jacobian(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling=scaling, causal=causal,
                                    key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        lam = singular_values(J).square().flip(0)
        if lam.numel() < n_rows:  # G = J Jᵀ has n_rows eigenvalues; the missing ones are exact zeros
            lam = torch.cat([torch.zeros(n_rows - lam.numel(), dtype=torch.float64), lam])
    lam_max = float(lam.max())
    if lam_max > 0:
        kept = lam[lam > rtol * lam_max]
        lam_min = float(kept.min())
        kappa = math.sqrt(lam_max / lam_min)
        n_below = int(lam.numel() - kept.numel())
    else:
        lam_min, kappa, n_below = 0.0, float("nan"), int(lam.numel())
    n_structural = n_rows - min(n_rows, n_cols - _parameter_null_dim(blk, b_q))
    if method == "eig" and refine and n_below > n_structural and n_rows * n_cols <= SVD_REFINE_MAX_ELEMENTS:
        result = head_condition_number(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling=scaling, causal=causal,
                                       key_padding_mask=key_padding_mask, attn_mask=attn_mask, method="svd",
                                       return_spectrum=return_spectrum, x_rtol=x_rtol)
        result.refined = True
        return result

    # side quantities, all on the valid tokens
    prep = blk.prep
    W_q64, W_k64, W_v64 = blk.W
    p_blocks = [blk.P[b][prep.query_valid[b]][:, prep.key_valid[b]] for b in range(prep.X.shape[0])]
    sv_p = torch.cat([torch.linalg.svdvals(pb) for pb in p_blocks])
    kappa_p = _kappa_from_values(sv_p, max(pb.shape[0] for pb in p_blocks) * eps)[0]
    kappa_x = pseudo_condition_number(blk.Xt, x_rtol)
    px_rtol = max(T, D) * eps if x_rtol is None else x_rtol
    sv_px = torch.linalg.svdvals(blk.PXt)
    kappa_px = _kappa_from_values(sv_px, px_rtol)[0]
    upper_bound = jacobian_upper_bound(sv_px, T, _qk_frobenius_squared(blk), px_rtol)
    kappa_lambda = softmax_jacobian_condition_number(blk.P[prep.query_valid])
    kappa_wq = pseudo_condition_number(W_q64)
    kappa_wk = pseudo_condition_number(W_k64)
    kappa_wv = pseudo_condition_number(W_v64)
    bound = condition_bound(kappa_x, kappa_lambda, kappa_wq, kappa_wk, kappa_wv, kappa_p)
    return HeadCondition(
        kappa=kappa, lambda_max=lam_max, lambda_min=lam_min, n_below_tol=n_below, n_structural=n_structural,
        saturated=n_below > n_structural, rtol=float(rtol), method=method, n_rows=n_rows, n_cols=n_cols,
        kappa_px=kappa_px, kappa_p=kappa_p, kappa_x=kappa_x, kappa_lambda=kappa_lambda, kappa_wq=kappa_wq,
        kappa_wk=kappa_wk, kappa_wv=kappa_wv, bound=bound, upper_bound=upper_bound,
        kappa_is_lower_bound=n_below > n_structural,
        spectrum=lam if return_spectrum else None,
    )
