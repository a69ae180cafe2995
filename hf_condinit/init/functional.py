"""In-place tensor initialisers (timm / torch style: names end in ``_``).

Every function computes in float32 with an explicit ``torch.Generator`` (never the global RNG) and writes with
``copy_``, so it works on non-contiguous views (transposed ``nn.Linear`` blocks) and on bf16/fp16 parameters.
Random values are drawn and factorised on the generator's device (CPU for the hooks' generators: the weights do
not depend on the device the model is built on), deterministic ones built on the view's device, always with an
explicit ``device=``, so a default-device context (``with torch.device("cuda")``
or ``"meta"``) neither redirects the draws nor breaks the CPU generator; ``copy_`` moves the result to the view.
Shapes are in math orientation (see `hf_condinit.layouts.base`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["semi_orthogonal_", "semi_orthogonality_error", "block_identity", "rect_identity_", "mimetic_factors", "mimetic_target", "MIMETIC_TOL",
           "SUBSPACE_MIN_DIM"]


def semi_orthogonal_(view: torch.Tensor, generator: torch.Generator, gain: float = 1.0) -> torch.Tensor:
    """Fill a (D, d) view with ``gain · U Vᵀ`` from the thin SVD of a Gaussian matrix.

    For D ≥ d the columns are orthonormal (Wᵀ W = gain² I_d); for D < d the rows are.
    """
    rows, cols = view.shape
    gaussian = torch.randn(rows, cols, generator=generator, dtype=torch.float32, device=generator.device)
    u, _, vh = torch.linalg.svd(gaussian, full_matrices=False)
    with torch.no_grad():
        view.copy_(gain * (u @ vh))
    return view


def semi_orthogonality_error(w: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    """max |WᵀW − gain²·I_d| of a (D, d) head (d ≤ D), else max |W Wᵀ − gain²·I_D| (a head wider than the model):
    the property `semi_orthogonal_` writes, in ``w``'s dtype (pass float64 to check fp32 weights)."""
    gram = w.T @ w if w.shape[1] <= w.shape[0] else w @ w.T
    return (gram - gain**2 * torch.eye(gram.shape[0], dtype=w.dtype, device=w.device)).abs().max()


def block_identity(rows: int, cols: int, row_offset: int = 0, gain: float = 1.0, device=None) -> torch.Tensor:
    """The (D, d) block of the block identity E of METHODS.md §1, fp32 on ``device``: column i has ``gain`` at row
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
#: accepts its fp32 subspace result (estimated, see `_top_singular_factors`); above it the computation reruns in
#: float64. Half the 1e-4 the tests and `hf_condinit.coverage` require.
MIMETIC_TOL = 5e-5
#: Eigenpairs past the r-th that the subspace path computes for its error estimate.
_NEXT_PAIRS = 16
#: Smallest D for the subspace path: below it the full SVD is as fast (D = 384, r = 64: 40 ms each), and models
#: that small (the CPU studies' 256-wide GPT-2, the 128-wide ViT) keep the original weights bit for bit.
SUBSPACE_MIN_DIM = 512


def mimetic_factors(target: torch.Tensor, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Split A (D, D) into L = U_r Σ_r^½ (D, r) and R = Σ_r^½ V_rᵀ (r, D), so L R is A's best rank-r approximation.

    ``rank`` defaults to D; above D the factors are zero-padded (L R = A). fp32 results; the signs of the singular
    vectors are the solver's (only the products are defined).

    Two paths with the same products (tests/test_mimetic_factors.py checks both against a float64 SVD):

    - ``D < SUBSPACE_MIN_DIM``, ``2·r > D`` (e.g. the full-rank VO target of a multi-head block), or ``target`` not
      on the CPU: the full ``torch.linalg.svd`` of A, the original implementation, bit for bit, except where fp32
      cannot split σ_r from σ_{r+1} to `MIMETIC_TOL` (`_fp32_split_error`): then the SVD runs in float64.
    - otherwise `_top_singular_factors`: only the top-r singular subspace, ~3× faster at D = 1280–1728, r = 64
      (the full SVD again if LAPACK reports that it did not converge).
    """
    dim = target.shape[0]
    r = dim if rank is None else rank
    kept = min(r, dim)
    factors = None
    if dim >= SUBSPACE_MIN_DIM and 2 * kept <= dim and target.device.type == "cpu":
        try:
            factors = _top_singular_factors(target, kept)[:2]
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
        left = torch.cat([left, left.new_zeros(dim, r - kept)], dim=1)
        right = torch.cat([right, right.new_zeros(r - kept, dim)], dim=0)
    return left, right


def _fp32_split_error(s: torch.Tensor, rank: int) -> float:
    """Estimated relative Frobenius error of an fp32 SVD's rank-``rank`` product (singular values ``s``, descending):
    the subspace angle of a backward-stable solver, ε₃₂·σ₁ / (σ_r − σ_{r+1}), times √2·σ₁ / ‖Σ_r‖_F (as in
    `_top_singular_factors`); an upper estimate (a 64-wide target with a 5e-4 relative gap: 4.7e-4 estimated, 1.9e-4
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


def _top_singular_factors(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """The subspace path of `mimetic_factors` (CPU, 2·rank ≤ D): (L, R) in fp32 and the precision that was accepted.

    1. The rank + k + 1 largest eigenpairs of the Gram matrix G = AᵀA (k = `_NEXT_PAIRS`), with LAPACK ``?syevx``
       (one tridiagonal reduction, then bisection and inverse iteration for the selected pairs only; torch only
       has the full eigensolver), in fp32 first.
    2. Rayleigh–Ritz in float64 on the top-rank vectors: V (D, r) orthonormal, Θ = diag(σ_1², …, σ_r²) descending,
       A V = U Σ; then L = A V Σ^-½ = U Σ^½ and R = Σ^½ Vᵀ.
    3. Error estimate, float64: the residual E = AᵀA V − V Θ, split into its part along the next k eigenvectors
       w_j (eigenvalues μ_j) and the rest; sin∠(V, exact) ≈ ‖[(w_jᵀ E_i) / (θ_i − μ_j)]‖ (+) ‖E_rest‖ / (θ_r −
       μ_{k+1}) (first-order perturbation, one gap per pair: the full-residual Davis–Kahan bound is ~100× loose
       here), and ‖L R − A_r‖_F / ‖A_r‖_F ≈ √2 · σ_1 · sin∠ / ‖Σ‖_F. The estimate was above the true error on
       every target the tests and the benchmark drew. If it exceeds `MIMETIC_TOL` (σ_r ≈ σ_{r+1}: fp32 cannot
       resolve the split) the three steps rerun in float64, whose result is accepted as is.
    """
    import scipy.linalg  # here, not at package import: only this path needs it

    dim = target.shape[0]
    extra = min(_NEXT_PAIRS, dim - rank - 1)
    a64 = target.double()
    for dtype in (torch.float32, torch.float64):
        a = target.to(dtype)
        gram = (a.T @ a).numpy()
        # one BLAS thread: OpenBLAS's spinning workers slowed syevx 10–70× on the oversubscribed 2-core test machine
        with _blas_threads().limit(limits=1, user_api="blas"):
            vals, vecs = scipy.linalg.eigh(gram, subset_by_index=[dim - rank - extra - 1, dim - 1], driver="evx",
                                           overwrite_a=True, check_finite=False)
        vals, vecs = torch.from_numpy(vals).double().flip(0), torch.from_numpy(vecs).double().flip(1)
        basis, _ = torch.linalg.qr(vecs[:, :rank])
        a_basis = a64 @ basis
        theta, rot = torch.linalg.eigh(a_basis.T @ a_basis)
        theta, rot = theta.flip(0), rot.flip(1)
        v, av = basis @ rot, a_basis @ rot
        residual = a64.T @ av - v * theta  # (D, r)
        nxt, _ = torch.linalg.qr(vecs[:, rank : rank + extra] - v @ (v.T @ vecs[:, rank : rank + extra]))
        along = nxt.T @ residual  # (k, r)
        near = (along / (theta[None, :] - vals[rank : rank + extra, None])).square().sum()
        rest = (residual - nxt @ along).square().sum() / (theta[-1] - vals[rank + extra]) ** 2
        estimate = float(theta[0].sqrt() * 2**0.5 * (near + rest).sqrt() / theta.sum().sqrt())
        if theta[-1] > vals[rank] and estimate <= MIMETIC_TOL:
            break
    root = theta.clamp_min(0).sqrt().sqrt()  # Σ^½
    return (av / root).float(), (root[:, None] * v.T).float(), dtype
