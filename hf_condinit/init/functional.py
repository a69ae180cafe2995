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

import math

import torch

__all__ = ["semi_orthogonal_", "block_identity", "rect_identity_", "mimetic_factors", "mimetic_target"]


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


def mimetic_factors(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split A = U Σ Vᵀ into L = U Σ^½ and R = Σ^½ Vᵀ, so L[:, :r] R[:r] is A's best rank-r approximation."""
    u, s, vh = torch.linalg.svd(target)
    root = s.sqrt()
    return u * root, root[:, None] * vh
