"""Every holder class, one import away; each is defined beside its variant (docs/attention_variants.md).

===========================  ==========================================================  =========================
attribute                    state                                                       defined in
===========================  ==========================================================  =========================
``condinit_affine``          parameter ``weight`` = W_a, shape **(H, D)** (``nn.Linear``   ``affine_scaled/holder.py``
                             orientation: α = φ(F.linear(X, weight)), i.e. W_a of the
                             paper is ``weight.T``); persistent fp32 buffer
                             ``alpha_ma`` (H,)
``condinit_sink``            parameter ``logit`` (H,)                                     ``attention_sink/holder.py``
``condinit_spectral_<roles>``  persistent buffer ``C`` shaped like the projection's       ``spectral/holder.py``
                             ``weight`` (one holder per projection *module*: ``qkv`` for
                             fused layouts, ``q``/``k``/``v`` for separate ones)
===========================  ==========================================================  =========================

The base class and its conventions (attachment, ``reset_condinit_parameters``, hooks as bound methods):
`hf_condinit.attention.holder_base`.
"""

from __future__ import annotations

from .affine_scaled.holder import AFFINE_INPUT_KWARG, AffineScaledHolder, in_backward_recompute, reduce_over_replicas
from .attention_sink.holder import AttentionSinkHolder
from .holder_base import HOLDER_PREFIX, CondInitHolder, iter_holders
from .spectral.holder import SpectralHolder

__all__ = [
    "HOLDER_PREFIX",
    "AFFINE_INPUT_KWARG",
    "in_backward_recompute",
    "reduce_over_replicas",
    "CondInitHolder",
    "AffineScaledHolder",
    "AttentionSinkHolder",
    "SpectralHolder",
    "iter_holders",
]
