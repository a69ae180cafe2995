"""What data-parallel training wraps, in one place: DeepSpeed ZeRO-3's partitioned parameters
(:func:`is_zero3_param`, :func:`gathered`) and the DDP / DeepSpeed engine around a model (:func:`unwrap_model`).
docs/fsdp.md compares the strategies."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

__all__ = ["gathered", "is_zero3_param", "unwrap_model"]


def is_zero3_param(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DeepSpeed ZeRO-3 partitioned parameter (it carries DeepSpeed's ``ds_id``)."""
    return hasattr(p, "ds_id")


@contextlib.contextmanager
def gathered(params, modifier_rank: int | None = 0):
    """Gather the ZeRO-3 partitioned parameters among ``params`` for the block (a no-op for ordinary tensors).

    ``modifier_rank``: the rank whose writes are broadcast when the block ends (0); ``None`` for a read-only gather."""
    zero_params = [p for p in params if is_zero3_param(p)]
    if not zero_params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(zero_params, modifier_rank=modifier_rank):
        yield


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a DDP / DeepSpeed engine wrapper (``.module``, as many levels as there are): the first one
    with a ``config``; ``model`` itself when it has one."""
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    return model
