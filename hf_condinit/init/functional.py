"""In-place tensor initialisers (timm / torch style: names end in ``_``).

Every function draws with an explicit ``torch.Generator`` (never the global RNG) and writes with ``copy_``, so it
works on non-contiguous views (transposed ``nn.Linear`` blocks) and on bf16/fp16 parameters. Random values are drawn
on the generator's device (CPU for the hooks' generators by default: the draws do not depend on the device the model
is built on; the weights' device with ``CondInitConfig.generator="device"``), deterministic ones built on the view's
device, always with an explicit ``device=``, so a default-device context (``with torch.device("cuda")`` or
``"meta"``) neither redirects the draws nor breaks the CPU generator; ``copy_`` moves the result to the view.

Factorisations are batched (one call per attention block) and run where `factor_device` says: on the CPU in fp32
(the original weights, bit for bit), or, for a model at least `DEVICE_MIN_DIM` wide built on an accelerator, on
the parameters' device (the same weights up to float rounding for the conditioned init; the same W_Q W_Kᵀ and
W_V W_O products, judged against the Eckart–Young optimum, for the mimetic init, whose singular-vector signs are the
solver's). Shapes are in math orientation (see `hf_condinit.layouts.base`); a leading batch dimension is the heads.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["semi_orthogonal_", "semi_orthogonal_heads_", "semi_orthogonal_factors", "semi_orthogonality_error",
           "block_identity", "rect_identity_", "mimetic_factors", "mimetic_target", "factor_device", "MIMETIC_TOL",
           "SUBSPACE_MIN_DIM", "DEVICE_MIN_DIM"]

#: Smallest D for the subspace path of `mimetic_factors`: below it the full SVD is as fast (D = 384, r = 64: 40 ms
#: each), and models that small (the CPU studies' 256-wide GPT-2, the 128-wide ViT) keep the original weights bit
#: for bit.
SUBSPACE_MIN_DIM = 512
#: Smallest D whose factorisations move to an accelerator the parameters live on (`factor_device`): below it they
#: cost milliseconds on the CPU, and a model built on the device keeps exactly the CPU build's weights.
DEVICE_MIN_DIM = SUBSPACE_MIN_DIM
#: Iteration cap of `_polar_newton` (from a spectrum in (0, 1] it needs ~7 for a Gaussian D × d draw, d ≤ D/4;
#: ~2·log₂ κ more for an ill-conditioned one); past it, or if its result is not orthonormal to 1e-10, the SVD.
_POLAR_MAX_ITERS = 60


def factor_device(param: torch.Tensor, dim: int) -> torch.device:
    """Where the init factorisations of a block of width ``dim`` whose weight is ``param`` run: ``param``'s device if
    it is an accelerator and ``dim ≥ DEVICE_MIN_DIM``, else the CPU."""
    if param.device.type in ("cpu", "meta") or dim < DEVICE_MIN_DIM:
        return torch.device("cpu")
    return param.device


def _accelerated(device: torch.device) -> bool:
    """Whether factorisations of tensors on ``device`` take the accelerator paths (batched solvers, matrix products)
    instead of the CPU's per-matrix LAPACK ones (tests patch it to run those paths on the CPU)."""
    return device.type != "cpu"


def semi_orthogonal_heads_(views: list[torch.Tensor], generator: torch.Generator, gain: float = 1.0) -> list:
    """Fill each (D, d) view with ``gain · U Vᵀ`` from the thin SVD of its own Gaussian draw (drawn in list order,
    one ``randn(D, d)`` per view on the generator's device), factorised in one batched call on `factor_device`.

    For D ≥ d the columns are orthonormal (Wᵀ W = gain² I_d); for D < d the rows are.
    """
    if not views:
        return views
    rows, cols = views[0].shape
    draws = torch.stack([torch.randn(rows, cols, generator=generator, dtype=torch.float32, device=generator.device)
                         for _ in views])
    factors = semi_orthogonal_factors(draws.to(factor_device(views[0], rows)))
    with torch.no_grad():
        for view, factor in zip(views, factors):
            view.copy_(gain * factor)
    return views


def semi_orthogonal_(view: torch.Tensor, generator: torch.Generator, gain: float = 1.0) -> torch.Tensor:
    """`semi_orthogonal_heads_` of one (D, d) view."""
    return semi_orthogonal_heads_([view], generator, gain)[0]


def semi_orthogonal_factors(gaussian: torch.Tensor) -> torch.Tensor:
    """U Vᵀ of each (D, d) matrix of ``gaussian`` (..., D, d) = U Σ Vᵀ (its polar factor), fp32, on its device.

    CPU: ``torch.linalg.svd`` in fp32 (one LAPACK call per matrix, the same bits as one SVD per head). Elsewhere:
    `_polar_newton` in float64, matrix products only (an accelerator's batched SVD loops over the batch), cast to
    fp32: the CPU result up to fp32 rounding.
    """
    if not _accelerated(gaussian.device):
        u, _, vh = torch.linalg.svd(gaussian, full_matrices=False)
        return u @ vh
    return _polar_newton(gaussian).float()


def _polar_newton(a: torch.Tensor) -> torch.Tensor:
    """The polar factor A (AᵀA)^-½ of each (D, d) matrix of ``a`` (..., D, d) (rows' instead when D < d), float64.

    The inverse square root by the coupled Newton–Schulz iteration (Higham, *Functions of Matrices*, §6.3):
    M = AᵀA / c with c = min(‖AᵀA‖_F, ‖AᵀA‖_∞) ≥ λ_max, so M's spectrum lies in (0, 1]; Y₀ = M, Z₀ = I,
    T = (3I − Z Y)/2, Y ← Y T, Z ← T Z; Z → M^-½, quadratically once Z Y ≈ I. Then Q = A Z / √c. A rank-deficient
    draw (probability 0), an iteration that has not converged after `_POLAR_MAX_ITERS`, or a result whose Gram
    matrix is off I by more than 1e-10 falls back to ``torch.linalg.svd`` in float64 (same answer: U Vᵀ).
    """
    wide = a.shape[-2] < a.shape[-1]
    a = (a.mT if wide else a).double()
    gram = a.mT @ a
    scale = torch.minimum(gram.norm(dim=(-2, -1)), gram.abs().sum(-1).amax(-1))[..., None, None]
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    y, z = gram / scale, eye
    for step in range(_POLAR_MAX_ITERS):
        t = 1.5 * eye - 0.5 * (z @ y)
        y, z = y @ t, t @ z
        if step >= 4 and float((t - eye).abs().amax()) < 1e-12:
            break
    q = a @ z / scale.sqrt()
    if not bool(((q.mT @ q - eye).abs().amax() <= 1e-10).all()):
        u, _, vh = torch.linalg.svd(a, full_matrices=False)
        q = u @ vh
    return q.mT if wide else q


def semi_orthogonality_error(w: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    """max |WᵀW − gain²·I_d| of a (D, d) head (d ≤ D), else max |W Wᵀ − gain²·I_D| (a head wider than the model):
    the property `semi_orthogonal_` writes, in ``w``'s dtype (pass float64 to check fp32 weights)."""
    gram = w.T @ w if w.shape[1] <= w.shape[0] else w @ w.T
    return (gram - gain**2 * torch.eye(gram.shape[0], dtype=w.dtype, device=w.device)).abs().max()


def block_identity(rows: int, cols: int, row_offset: int = 0, gain: float = 1.0, device=None) -> torch.Tensor:
    """The (D, d) block of the block identity E of docs/methods.md §1, fp32 on ``device``: column i has ``gain`` at row
    ``(row_offset + i) % D``, zeros elsewhere.

    Head j of a block-identity value projection (and of spectral conditioning's E) uses ``row_offset = j·d``: head j
    reads coordinates [j·d, (j+1)·d) of X, wrapping modulo D when H·d > D. The one definition of E in the package.
    """
    eye = torch.zeros(rows, cols, dtype=torch.float32, device=device)
    cols_idx = torch.arange(cols, device=device)
    eye[(row_offset + cols_idx) % rows, cols_idx] = gain
    return eye


def rect_identity_(view: torch.Tensor, row_offset: int = 0, gain: float = 1.0) -> torch.Tensor:
    """Fill a (D, d) view with `block_identity` (column i has ``gain`` at row ``(row_offset + i) % D``)."""
    with torch.no_grad():
        view.copy_(block_identity(*view.shape, row_offset=row_offset, gain=gain, device=view.device))
    return view


def mimetic_target(
    dim: int, alpha: float, beta: float, sign: int, dist: str, generator: torch.Generator
) -> torch.Tensor:
    """The mimetic target ``α·Z + sign·β·I`` (D, D), Z with i.i.d. entries of variance 1/D (uniform or Gaussian)."""
    if dist == "uniform":
        bound = math.sqrt(3.0 / dim)
        z = (torch.rand(dim, dim, generator=generator, dtype=torch.float32, device=generator.device) * 2 - 1) * bound
    else:
        z = torch.randn(dim, dim, generator=generator, dtype=torch.float32, device=generator.device) / math.sqrt(dim)
    return alpha * z + sign * beta * torch.eye(dim, dtype=torch.float32, device=z.device)


#: Relative Frobenius error of L R against A's exact best rank-r approximation up to which `mimetic_factors`
#: accepts its fp32 subspace result (estimated, see `top_singular_factors`); above it the computation reruns in
#: float64. Half the 1e-4 the tests and `hf_condinit.coverage` require.
MIMETIC_TOL = 5e-5
#: Eigenpairs past the r-th that the subspace path computes for its error estimate.
_NEXT_PAIRS = 16


def mimetic_factors(target: torch.Tensor, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Split A (D, D) into L = U_r Σ_r^½ (D, r) and R = Σ_r^½ V_rᵀ (r, D), so L R is A's best rank-r approximation.

    ``target`` may carry a leading batch dimension (..., D, D) → (..., D, r), (..., r, D). ``rank`` defaults to D;
    above D the factors are zero-padded (L R = A). fp32 results, on ``target``'s device; the signs of the singular
    vectors are the solver's (only the products are defined: ‖A − L R‖_F is within `MIMETIC_TOL` relative of the
    Eckart–Young optimum ‖A − A_r‖_F, tests/init/test_mimetic_factors.py).

    On the CPU, one target at a time:

    - ``D < SUBSPACE_MIN_DIM`` or ``2·r > D`` (e.g. the full-rank VO target of a multi-head block): the full
      ``torch.linalg.svd`` of A, the original implementation, bit for bit, except where fp32 cannot split σ_r from
      σ_{r+1} to `MIMETIC_TOL` (`_fp32_split_error`): then the SVD runs in float64.
    - otherwise `top_singular_factors`: only the top-r singular subspace, ~3× faster at D = 1280–1728, r = 64
      (the full SVD again if LAPACK reports that it did not converge).

    Elsewhere (an accelerator), the whole batch at once: `top_singular_factors` with ``torch.linalg.eigh`` for its
    eigenpairs when ``D ≥ SUBSPACE_MIN_DIM`` and ``2·r ≤ D``, else `_gram_factors` in float64.
    """
    dim = target.shape[-1]
    r = dim if rank is None else rank
    kept = min(r, dim)
    subspace = dim >= SUBSPACE_MIN_DIM and 2 * kept <= dim
    if _accelerated(target.device):
        left, right = top_singular_factors(target, kept)[:2] if subspace else _gram_factors(target, kept)
    elif target.dim() > 2:
        pairs = [mimetic_factors(t, kept) for t in target.reshape(-1, dim, dim)]
        left = torch.stack([p[0] for p in pairs]).reshape(*target.shape[:-2], dim, kept)
        right = torch.stack([p[1] for p in pairs]).reshape(*target.shape[:-2], kept, dim)
    else:
        factors = None
        if subspace:
            try:
                factors = top_singular_factors(target, kept)[:2]
            except np.linalg.LinAlgError:  # syevx did not converge (LAPACK info > 0): the full SVD below
                pass
        if factors is None:
            u, s, vh = torch.linalg.svd(target)
            if kept < dim and target.dtype == torch.float32 and _fp32_split_error(s, kept) > MIMETIC_TOL:
                u, s, vh = (t.float() for t in torch.linalg.svd(target.double()))  # σ_r ≈ σ_{r+1}: fp32 cannot split
            root = s.sqrt()
            factors = (u * root)[:, :kept], (root[:, None] * vh)[:kept]
        left, right = factors
    if r > kept:
        left = torch.cat([left, left.new_zeros(*left.shape[:-1], r - kept)], dim=-1)
        right = torch.cat([right, right.new_zeros(*right.shape[:-2], r - kept, dim)], dim=-2)
    return left, right


def _gram_factors(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The accelerator's full-spectrum path of `mimetic_factors`, (..., D, D) → fp32 (L, R), float64 throughout:
    V_r = the top-``rank`` eigenvectors of AᵀA, L = A V_r Σ_r^-½, R = Σ_r^½ V_rᵀ, so L R = A V_r V_rᵀ (exactly A's
    truncation for any orthonormal V_r of the top subspace; float64 splits σ_r from σ_{r+1} to ~1e-16 / gap)."""
    a = target.double()
    theta, vecs = torch.linalg.eigh(a.mT @ a)
    theta, v = theta.flip(-1)[..., :rank], vecs.flip(-1)[..., :rank]
    root = theta.clamp_min(torch.finfo(torch.float64).tiny).sqrt().sqrt()  # Σ^½
    return ((a @ v) / root[..., None, :]).float(), (root[..., :, None] * v.mT).float()


def _fp32_split_error(s: torch.Tensor, rank: int) -> float:
    """Estimated relative Frobenius error of an fp32 SVD's rank-``rank`` product (singular values ``s``, descending):
    the subspace angle of a backward-stable solver, ε₃₂·σ₁ / (σ_r − σ_{r+1}), times √2·σ₁ / ‖Σ_r‖_F (as in
    `top_singular_factors`); an upper estimate (a 64-wide target with a 5e-4 relative gap: 4.7e-4 estimated, 1.9e-4
    true)."""
    s = s.double()
    gap = float(s[rank - 1] - s[rank])
    if gap <= 0:
        return math.inf
    angle = torch.finfo(torch.float32).eps * float(s[0]) / gap
    return 2**0.5 * float(s[0]) * angle / float(s[:rank].norm())


@functools.cache
def _blas_threads():
    """A `threadpoolctl.ThreadpoolController`, made once (building one scans the loaded libraries: ~2 ms)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def top_singular_factors(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """The subspace path of `mimetic_factors` (2·rank ≤ D), (..., D, D) → (L, R) in fp32 and the precision that
    was accepted (float64 if any target of the batch needed the rerun).

    1. The rank + k + 1 largest eigenpairs of the Gram matrix G = AᵀA (k = `_NEXT_PAIRS`), in fp32 first: on the
       CPU with LAPACK ``?syevx`` (one tridiagonal reduction, then bisection and inverse iteration for the selected
       pairs only; torch only has the full eigensolver), elsewhere with one batched ``torch.linalg.eigh``.
    2. Rayleigh–Ritz in float64 on the top-rank vectors: V (D, r) orthonormal, Θ = diag(σ_1², …, σ_r²) descending,
       A V = U Σ; then L = A V Σ^-½ = U Σ^½ and R = Σ^½ Vᵀ.
    3. Error estimate, float64: the residual E = AᵀA V − V Θ, split into its part along the next k eigenvectors
       w_j (eigenvalues μ_j) and the rest; sin∠(V, exact) ≈ ‖[(w_jᵀ E_i) / (θ_i − μ_j)]‖ (+) ‖E_rest‖ / (θ_r −
       μ_{k+1}) (first-order perturbation, one gap per pair: the full-residual Davis–Kahan bound is ~100× loose
       here), and ‖L R − A_r‖_F / ‖A_r‖_F ≈ √2 · σ_1 · sin∠ / ‖Σ‖_F. The estimate was above the true error on
       every target the tests and the benchmark drew. The targets whose estimate exceeds `MIMETIC_TOL` (σ_r ≈
       σ_{r+1}: fp32 cannot resolve the split) rerun the three steps in float64, whose result is accepted as is.
    """
    batched = target.dim() > 2
    a64 = (target if batched else target[None]).double()
    extra = min(_NEXT_PAIRS, a64.shape[-1] - rank - 1)
    left, right, ok = _ritz_factors(a64, torch.float32, rank, extra)
    precision = torch.float32
    if not bool(ok.all()):
        redo = ~ok
        left[redo], right[redo], _ = _ritz_factors(a64[redo], torch.float64, rank, extra)
        precision = torch.float64
    return (left, right, precision) if batched else (left[0], right[0], precision)


def _top_eigenpairs(gram: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` largest eigenpairs of each symmetric (D, D) matrix of ``gram`` (B, D, D), descending, float64:
    (values (B, count), vectors (B, D, count)). CPU: LAPACK ``?syevx`` per matrix; elsewhere the full batched
    ``torch.linalg.eigh``, sliced."""
    dim = gram.shape[-1]
    if _accelerated(gram.device):
        vals, vecs = torch.linalg.eigh(gram)
        return vals[..., dim - count:].double().flip(-1), vecs[..., dim - count:].double().flip(-1)
    import scipy.linalg  # here, not at package import: only this path needs it

    pairs = []
    for g in gram.numpy():
        # one BLAS thread: OpenBLAS's spinning workers slowed syevx 10–70× on the oversubscribed 2-core test machine
        with _blas_threads().limit(limits=1, user_api="blas"):
            pairs.append(scipy.linalg.eigh(g, subset_by_index=[dim - count, dim - 1], driver="evx", overwrite_a=True,
                                           check_finite=False))
    vals = torch.stack([torch.from_numpy(v) for v, _ in pairs]).double().flip(-1)
    return vals, torch.stack([torch.from_numpy(w) for _, w in pairs]).double().flip(-1)


def _ritz_factors(a64: torch.Tensor, dtype: torch.dtype, rank: int, extra: int):
    """Steps 1–3 of `top_singular_factors` on (B, D, D) float64 targets, the eigenpairs computed in ``dtype``:
    fp32 (L, R) and, per target, whether the error estimate accepts them."""
    a = a64.to(dtype)
    vals, vecs = _top_eigenpairs(a.mT @ a, rank + extra + 1)
    basis, _ = torch.linalg.qr(vecs[..., :rank])
    a_basis = a64 @ basis
    theta, rot = torch.linalg.eigh(a_basis.mT @ a_basis)
    theta, rot = theta.flip(-1), rot.flip(-1)
    v, av = basis @ rot, a_basis @ rot
    residual = a64.mT @ av - v * theta[..., None, :]  # (B, D, r)
    following = vecs[..., rank : rank + extra]
    nxt, _ = torch.linalg.qr(following - v @ (v.mT @ following))
    along = nxt.mT @ residual  # (B, k, r)
    near = (along / (theta[..., None, :] - vals[..., rank : rank + extra, None])).square().sum((-2, -1))
    rest = (residual - nxt @ along).square().sum((-2, -1)) / (theta[..., -1] - vals[..., rank + extra]) ** 2
    estimate = theta[..., 0].sqrt() * 2**0.5 * (near + rest).sqrt() / theta.sum(-1).sqrt()
    ok = (theta[..., -1] > vals[..., rank]) & (estimate <= MIMETIC_TOL)
    root = theta.clamp_min(0).sqrt().sqrt()  # Σ^½
    return (av / root[..., None, :]).float(), (root[..., :, None] * v.mT).float(), ok
