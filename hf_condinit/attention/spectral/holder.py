"""`SpectralHolder`: the fixed matrix C of spectral conditioning for one projection module (docs/methods.md §3).

Attached as ``condinit_spectral_<roles>`` (one holder per projection *module*: ``qkv`` for fused layouts, ``q`` /
``k`` / ``v`` for separate ones): a persistent buffer ``C`` shaped like the projection's ``weight``. How the holders
are attached, merged and removed: `hf_condinit.attention.spectral.conditioning`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...init.functional import block_identity
from ..holder_base import CondInitHolder, hf_init_fn, is_flagged

__all__ = ["SpectralHolder"]


class SpectralHolder(CondInitHolder):
    """The fixed spectral-conditioning matrix C of one projection module (docs/methods.md §3).

    ``C`` has the shape (and storage convention) of the projection's ``weight``; a forward hook on the projection
    adds ``Projection.linear(x, C)`` to its output, so W_eff = W + C in the forward pass only (C is a buffer: no
    gradient, no weight decay, saved separately from W).

    Modes: ``"identity"``: C = λ·E on each role's heads (E the block identity of docs/methods.md §1, so C does not depend
    on W); ``"svd"``: per head, W_h = U S Vᵀ → C_h = σ_max(W_h)·U Vᵀ so that κ(W_h + C_h) ≤ 2 (λ is ignored; it only
    switches the method on). The svd mode reads the *current* weights: see ``reset_condinit_parameters``.
    """

    def __init__(self, projections: list, lam: float, mode: str, shape: torch.Size, *, device=None, dtype=None):
        super().__init__()
        if mode not in ("identity", "svd"):
            raise ValueError(f"spectral_mode must be 'identity' or 'svd', got {mode!r}.")
        self.roles = "".join(p.role for p in projections)
        self._projections = list(projections)  # plain list: not registered as children
        self.lam, self.mode = float(lam), mode
        self.register_buffer("C", torch.zeros(shape, device=device, dtype=dtype), persistent=True)

    @property
    def projection_module(self) -> nn.Module:
        return self._projections[0].module

    def compute_C(self) -> torch.Tensor:
        """C in fp32 from the options (and, in svd mode, from the current weights)."""
        C = torch.zeros(self.C.shape, dtype=torch.float32, device=self.C.device)
        for proj in self._projections:
            c_heads = proj.heads(C)
            if self.mode == "identity":
                for h, view in enumerate(c_heads):  # the block identity of conditioned W_V (wraps modulo D)
                    D, d = view.shape
                    view += block_identity(D, d, row_offset=h * d, gain=self.lam).to(C.device)
            else:
                w_heads = proj.heads(proj.weight.detach().to(device=C.device, dtype=torch.float32))
                for w, view in zip(w_heads, c_heads):
                    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
                    view.copy_(S.max() * (U @ Vh))
        return C

    def reset_condinit_parameters(self, force: bool = False) -> None:
        if self.C.is_meta or (not force and is_flagged(self.C)):
            return
        if self.mode == "svd" and any(p.weight.is_meta or p.weight.shape != self.C.shape for p in self._projections):
            return  # weights not materialised yet (meta device, ZeRO-3 partition): `after_zero3_init` computes C
        with torch.no_grad():
            C = self.compute_C().to(self.C.dtype)
            if force:
                self.C.copy_(C)
            else:
                hf_init_fn("copy_")(self.C, C)

    # forward hook of the projection module (registered by `inject_spectral`)
    def _add_spectral(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """``output + x·C`` formed in fp32 (or wider) and rounded once to the output's dtype, autocast off: in a
        bf16 / fp16 model (or under autocast) the projection's own ``x·W + b`` is upcast, ``x·C`` is computed in
        fp32 from the same x, and only the sum is rounded (docs/methods.md §3, "bf16"). Summed in bf16, ``x·W + x·C``
        would round twice; a merged ``W + C`` in bf16 would lose W where C is non-zero (spacing 0.0625 at λ = 10).

        ``mode="identity"``: C = λ·E has at most one non-zero per output coordinate, so ``x·C`` is a gather,
        ``x[..., idx]·c`` (idx, c read from C: its largest entry per output), exact and without a second matmul."""
        x = args[0]
        acc = torch.promote_types(output.dtype, torch.float32)
        projection = self._projections[0]
        with torch.autocast(x.device.type, enabled=False):
            C = self.C.to(acc)
            if self.mode == "identity":
                in_axis = 1 if projection.storage == "linear" else 0
                idx = C.abs().argmax(dim=in_axis)  # (out,)
                coef = C.gather(in_axis, idx.unsqueeze(in_axis)).squeeze(in_axis)
                added = x.to(acc).index_select(-1, idx) * coef
            else:
                added = projection.linear(x.to(acc), C)
        return (output.to(acc) + added).to(output.dtype)

    def extra_repr(self) -> str:
        return f"roles={self.roles!r}, lam={self.lam}, mode={self.mode!r}, shape={tuple(self.C.shape)}"
