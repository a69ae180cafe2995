"""Spectral conditioning of attention (Saratchandran & Lucey, NeurIPS 2025; docs/methods.md §3): ``options.py`` (its
condinit options), ``holder.py`` (`SpectralHolder`, the buffer C of one projection module), ``conditioning.py``
(attach, merge, remove, the bf16 check).

Attention is computed with W_Q + C, W_K + C, W_V + C, where C is fixed before training: a persistent *buffer* (no
gradient, no weight decay, saved next to W in the state dict), never folded into W unless `merge_spectral` is called.

- ``mode="identity"`` (default): C = λ·E, E the block identity of docs/methods.md §1 written through the layout's
  ``Projection.heads`` views (so fused GPT-2 ``Conv1D``, separate ``nn.Linear``, GQA and interleaved NeoX layouts are
  all handled by the layout adapters). Default λ = 10.
- ``mode="svd"``: per head, W_h = U S Vᵀ → C_h = σ_max(W_h)·U Vᵀ, so κ(W_h + C_h) ≤ 2 (λ only switches it on).
  C depends on the weights *after* their init scheme: it is computed when the holder is reset (children-first init
  order: the projections of the block are initialised before the holder) and recomputed by
  `on_attention_module_initialized` after the block's scheme has rewritten q/k/v.

W_eff = W + C is applied by a forward hook on each projection module adding ``Projection.linear(x, C)`` (one holder,
``condinit_spectral_<roles>``, per projection module: ``qkv`` for a fused module, ``q``/``k``/``v`` otherwise).

Two entry points: ``config.condinit["spectral_lambda"]`` (+ ``["spectral_mode"]``) at build time (the post_init hook
calls `hf_condinit.attention.inject`), or `apply_spectral_conditioning` on a built model (it writes the same keys
into ``config.condinit`` so that ``save_pretrained`` / ``from_pretrained`` restore it).
"""

from __future__ import annotations

from .conditioning import (
    PROJECTION_TOL,
    apply_spectral_conditioning,
    forward_weight,
    inject_spectral,
    low_precision_error,
    merge_spectral,
    remove_spectral,
    spectral_holders,
)
from .holder import SpectralHolder
from .options import SPECTRAL_OPTIONS

__all__ = [
    "SPECTRAL_OPTIONS",
    "SpectralHolder",
    "inject_spectral",
    "spectral_holders",
    "forward_weight",
    "apply_spectral_conditioning",
    "merge_spectral",
    "remove_spectral",
    "low_precision_error",
    "PROJECTION_TOL",
]
