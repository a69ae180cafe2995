"""Helpers shared by the attention variants: mask semantics identical to HF's ``sdpa_attention_forward``, a variant's
options as a module's config sets them, and whether a call wants the attention weights (decided without a graph break
under torch.compile)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "effective_causal",
    "crop_for_causal",
    "visible_from_mask",
    "condinit_options",
    "ATTENTIONS_KWARG",
    "wants_attentions",
    "pass_attention_request",
    "check_attentions_returned",
    "watch_attention_requests",
    "get_holder",
    "cast_fresh",
    "refuse_compile",
]

def cast_fresh(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``, never through a same-dtype ``.to`` (which returns an alias of ``tensor``).

    For what a custom ``autograd.Function`` returns from ``forward`` or ``backward``: on torch 2.11, ``torch.compile``
    (aot_eager and inductor) of a Function whose forward output is such an alias routes its gradient nowhere: every
    input gets zero (pytorch/pytorch#180642, "aliased output of forward"; fixed in 2.12). ``tensor`` must itself be
    a fresh result of the Function's own computation, not one of its inputs.
    """
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


@torch._dynamo.assume_constant_result
def refuse_compile(message: str) -> None:
    """Raise ``message`` (one line) as a RuntimeError. ``assume_constant_result``: dynamo runs it for real while
    tracing, so its message reaches the user (the first line of dynamo's error) instead of dynamo's bare "Observed
    exception"."""
    raise RuntimeError(message)


def effective_causal(module: nn.Module, query: torch.Tensor, attention_mask, is_causal) -> bool:
    """The ``is_causal`` that HF's ``sdpa_attention_forward`` passes to SDPA.

    With a mask, the mask alone says what is visible. Without one, the attention is causal (upper-left aligned, i.e.
    query i sees keys 0..i, keys past the query length cropped) when the module is causal and there is more than one
    query; a single query (decoding) or a non-causal module sees every key.
    """
    flag = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(query.shape[2] > 1 and attention_mask is None and flag)


def crop_for_causal(key: torch.Tensor, value: torch.Tensor, q_len: int):
    """Static-cache prefill: keys past the query length are invisible under an upper-left causal mask."""
    if key.shape[2] > q_len:
        return key[:, :, :q_len], value[:, :, :q_len]
    return key, value


def visible_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Boolean visibility from a 4-D mask: boolean (True = attend) or additive float (min/-inf = masked)."""
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def condinit_options(module: nn.Module, defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` (a variant's options) overridden by the values set in ``module.config.condinit`` (plain dict, a
    `CondInitConfig`, or absent)."""
    config = getattr(module, "config", None)
    stored = getattr(config, "condinit", None) if config is not None else None
    if stored is None:
        return defaults
    if not isinstance(stored, dict):
        stored = stored.to_dict() if hasattr(stored, "to_dict") else dict(vars(stored))
    return {**defaults, **{k: stored[k] for k in defaults if stored.get(k) is not None}}


#: Keyword under which a model's request for attention weights reaches the attention functions of its blocks: set to
#: True by `pass_attention_request` (never set otherwise), read and removed by `wants_attentions`.
ATTENTIONS_KWARG = "condinit_output_attentions"


def pass_attention_request(model: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook (``with_kwargs``) on a model with an attention variant (`watch_attention_requests`): when the
    call asks for the attention weights, add ``ATTENTIONS_KWARG=True`` to its kwargs, which HF passes on through the
    layers to the attention functions (as it passes ``position_ids``).

    "Asks" as transformers' ``capture_outputs`` decides it: the ``output_attentions`` keyword, else
    ``config.output_attentions``, for a model that records ``attentions`` or ``cross_attentions``. Both are constant
    under a trace (dynamo guards on them), and under regional compilation this hook runs eagerly, outside the
    compiled blocks: the decision reaches the blocks as an argument instead of being read inside them from
    transformers' collector, a ContextVar that dynamo cannot trace (a graph break per read). Nothing is added when
    nothing is asked, so a training forward is the model's own call.
    """
    requested = kwargs.get("output_attentions", getattr(model.config, "output_attentions", False))
    recorded = getattr(model, "_can_record_outputs", None) or {}
    if requested and ("attentions" in recorded or "cross_attentions" in recorded):
        return args, {**kwargs, ATTENTIONS_KWARG: True}
    return None


def check_attentions_returned(model: nn.Module, args: tuple, kwargs: dict, output) -> None:
    """Forward hook (``with_kwargs``, `watch_attention_requests`): a call that asked for the attention weights
    (`pass_attention_request`) and got none raises, rather than returning an empty tuple where eager gives one
    tensor per layer. That happens only under compilation of the blocks on their own, in a model whose forward
    does not pass its keyword arguments on to its layers (the request cannot reach them)."""
    if kwargs.get(ATTENTIONS_KWARG) and getattr(output, "attentions", None) == ():
        refuse_compile(
            f"hf_condinit: output_attentions=True returned no attention weights: {type(model).__name__} does not "
            f"pass the request on to its compiled blocks (attn_implementation="
            f"{model.config._attn_implementation!r}). Call the model uncompiled for the weights, or compile the "
            "whole model (torch.compile(model)) instead of its blocks."
        )


def watch_attention_requests(model: nn.Module) -> None:
    """Register `pass_attention_request` and `check_attentions_returned` on ``model`` (idempotent)."""
    if pass_attention_request not in model._forward_pre_hooks.values():
        model.register_forward_pre_hook(pass_attention_request, with_kwargs=True)
    if check_attentions_returned not in model._forward_hooks.values():
        model.register_forward_hook(check_attentions_returned, with_kwargs=True)


def wants_attentions(kwargs: dict) -> bool:
    """Whether the caller asked for the attention weights; removes ``ATTENTIONS_KWARG`` from the attention function's
    ``kwargs``.

    In order: the model's request (``ATTENTIONS_KWARG``, `pass_attention_request`); an ``output_attentions`` keyword
    passed down by the family; transformers' output collector (HF v5 records the weights through it) where it can be
    read without a graph break: always eagerly, and under torch.compile when the collector was set inside the same
    trace (whole-model compilation, where transformers keeps it in a plain attribute). A block compiled on its own
    and called without the request (the model's pre-hook did not run, or its forward drops keyword arguments) takes
    the fast path; `check_attentions_returned` turns the second case into an error.
    """
    if kwargs.pop(ATTENTIONS_KWARG, False) or kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - other transformers versions
        return False
    if torch.compiler.is_compiling() and not getattr(_active_collector, "compiling", False):
        return False  # set outside the graph: its ContextVar cannot be read without a graph break
    collected = _active_collector.get()
    return bool(collected) and ("attentions" in collected or "cross_attentions" in collected)


def get_holder(module: nn.Module, name: str, variant: str) -> nn.Module:
    holder = module._modules.get(name)
    if holder is None:
        raise RuntimeError(
            f"attn_implementation={variant!r}: {type(module).__name__} has no `{name}` holder. Build the model after "
            f"`import hf_condinit` (its post_init hook injects the holders), or call "
            f"hf_condinit.attention.inject(model). Cross-attention modules that the layout skips are not supported."
        )
    return holder
