"""`AttentionSinkHolder`: the learnable per-head sink logit of one attention module, attached as ``condinit_sink``."""

from __future__ import annotations

import torch
from torch import nn

from ..holder_base import CondInitHolder, hf_init_fn

__all__ = ["AttentionSinkHolder"]


class AttentionSinkHolder(CondInitHolder):
    """A learnable logit per head added to the softmax denominator (init 0): parameter ``logit`` (H,)."""

    shape_fields = ("n_heads",)

    def __init__(self, n_heads: int, *, device=None, dtype=None):
        super().__init__()
        self.n_heads = n_heads
        self.logit = nn.Parameter(torch.zeros(n_heads, device=device, dtype=dtype))

    def reset_condinit_parameters(self, force: bool = False) -> None:
        with torch.no_grad():
            if force:
                self.logit.zero_()
            else:
                hf_init_fn("zeros_")(self.logit)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"
