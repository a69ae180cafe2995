"""Helpers shared by the attention variants: mask semantics identical to HF's ``sdpa_attention_forward``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "effective_causal",
    "crop_for_causal",
    "visible_from_mask",
    "condinit_options",
    "wants_attentions",
    "get_holder",
    "cast_fresh",
    "COMPILE_MIN_TORCH",
    "COMPILE_WRONG_GRADIENTS",
    "compile_refusal",
    "guard_compile",
]

_DEFAULTS = {
    "affine_rho": 0.9,
    "affine_bias_length": "visible",
    "precond_eps": 1e-6,
    "precond_scale": "none",
    "spectral_lambda": None,
    "spectral_mode": "identity",
}


def cast_fresh(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``, never through a same-dtype ``.to`` (which returns an alias of ``tensor``).

    For what a custom ``autograd.Function`` returns from ``forward`` or ``backward``: on torch 2.11, ``torch.compile``
    (aot_eager and inductor) of a Function whose forward output is such an alias routes its gradient nowhere: every
    input gets zero (pytorch/pytorch#180642, "aliased output of forward"; fixed in 2.12). ``tensor`` must itself be
    a fresh result of the Function's own computation, not one of its inputs.
    """
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


#: torch.compile of a model with an attention variant needs this torch. On 2.5.1 and 2.6.0 dynamo cannot trace
#: transformers 5.17's own forward wrappers, whatever the attention (plain ``sdpa`` fails alike): ``merge_with_config_
#: defaults`` (transformers/utils/generic.py) reads ``func.__code__.co_varnames`` ("Unsupported call_method
#: GetAttrVariable(GetSetDescriptorVariable(), co_varnames) __contains__"), and past it ``capture_outputs``
#: (transformers/utils/output_capturing.py) stops with "NameError: name 'torch' is not defined". Measured: 2.7.1 traces
#: both and compiles every variant with eager's outputs and gradients (tests/test_compile.py), so does 2.8.0.
COMPILE_MIN_TORCH = (2, 7)

#: torch releases (major, minor) whose compiled training gives these variants wrong gradients while the outputs equal
#: eager's: refused there. 2.11 with inductor, affine_scaled + spectral (tests/test_compile.py with
#: HF_CONDINIT_COMPILE_BACKEND=inductor: ‖Δ grad wte‖ up to 0.71, 34 % of its elements; the version matrix's
#: torch-2.11 row); aot_eager matches there, but the refusal cannot see the backend.
COMPILE_WRONG_GRADIENTS = {(2, 11): ("affine_scaled", "spectral conditioning")}

_VARIANT_NAMES = ("affine_scaled", "attention_sink", "preconditioned")


@torch._dynamo.assume_constant_result
def _refuse_compile(message: str) -> None:
    """Raise the one-line refusal. ``assume_constant_result``: dynamo runs it for real while tracing, so its message
    reaches the user (the first line of dynamo's error) instead of dynamo's bare "Observed exception"."""
    raise RuntimeError(message)


def compile_refusal(config) -> str | None:
    """Why torch.compile of a model with ``config`` is refused on the running torch (one line), or None."""
    impl = getattr(config, "_attn_implementation", None)
    spectral = (getattr(config, "condinit", None) or {}).get("spectral_lambda") is not None
    variants = ([impl] if impl in _VARIANT_NAMES else []) + (["spectral conditioning"] if spectral else [])
    if not variants:
        return None
    what = " and ".join(f"attn_implementation={v!r}" if v in _VARIANT_NAMES else v for v in variants)
    if torch.__version__ < COMPILE_MIN_TORCH:
        return (f"hf_condinit: torch.compile of a model with {what} needs torch >= "
                f"{'.'.join(map(str, COMPILE_MIN_TORCH))} (this is torch {torch.__version__}); run it eagerly or "
                f"upgrade torch")
    wrong = COMPILE_WRONG_GRADIENTS.get(tuple(int(x) for x in torch.__version__.split(".")[:2]), ())
    if any(v in wrong for v in variants):
        return (f"hf_condinit: torch.compile of a model with {what} gives wrong gradients on torch "
                f"{torch.__version__} (inductor); run it eagerly or use another torch (docs/versions.md)")
    return None


def _refuse_compile_hook(module: nn.Module, args) -> None:
    """Forward pre-hook (`guard_compile`): a no-op eagerly; under torch.compile, the refusal."""
    if torch.compiler.is_compiling():
        _refuse_compile(compile_refusal(module.config))


def guard_compile(model: nn.Module) -> None:
    """Where `compile_refusal` refuses ``model`` (a model with an attention variant or spectral conditioning) on the
    running torch, make torch.compile of it fail at its first compiled forward with that one line, rather than deep
    inside transformers' code or with wrong gradients. Idempotent; nothing where compile is not refused."""
    if compile_refusal(model.config) is None:
        return
    if _refuse_compile_hook not in model._forward_pre_hooks.values():
        model.register_forward_pre_hook(_refuse_compile_hook)


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


def condinit_options(module: nn.Module) -> dict[str, Any]:
    """The variant options of ``module.config.condinit`` (plain dict, a `CondInitConfig`, or absent → defaults)."""
    config = getattr(module, "config", None)
    stored = getattr(config, "condinit", None) if config is not None else None
    if stored is None:
        return _DEFAULTS
    if not isinstance(stored, dict):
        stored = stored.to_dict() if hasattr(stored, "to_dict") else dict(vars(stored))
    return {**_DEFAULTS, **{k: v for k, v in stored.items() if v is not None or k == "spectral_lambda"}}


def wants_attentions(kwargs: dict) -> bool:
    """Whether the caller asked for the attention weights (HF v5 records them through an output collector)."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector

        collected = _active_collector.get()
    except Exception:  # pragma: no cover - other transformers versions
        return False
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
