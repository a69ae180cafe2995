"""Where torch.compile of a model with an attention variant or spectral conditioning is refused, and the pre-hook
that refuses it in one line (docs/versions.md)."""

from __future__ import annotations

import torch
from torch import nn

from ._common import refuse_compile
from .catalog import VARIANTS

__all__ = ["COMPILE_MIN_TORCH", "COMPILE_WRONG_GRADIENTS", "compile_refusal", "guard_compile"]

_VARIANT_NAMES = tuple(v.name for v in VARIANTS)


#: torch.compile of a model with an attention variant needs this torch. On 2.5.1 and 2.6.0 dynamo cannot trace
#: transformers 5.17's own forward wrappers, whatever the attention (plain ``sdpa`` fails alike): ``merge_with_config_
#: defaults`` (transformers/utils/generic.py) reads ``func.__code__.co_varnames`` ("Unsupported call_method
#: GetAttrVariable(GetSetDescriptorVariable(), co_varnames) __contains__"), and past it ``capture_outputs``
#: (transformers/utils/output_capturing.py) stops with "NameError: name 'torch' is not defined". Measured: 2.7.1 traces
#: both and compiles every variant with eager's outputs and gradients (tests/attention/test_compile.py), so does 2.8.0.
COMPILE_MIN_TORCH = (2, 7)

#: torch releases (major, minor) whose compiled training gives these variants wrong gradients while the outputs equal
#: eager's: refused there. 2.11 with inductor, affine_scaled + spectral (tests/attention/test_compile.py with
#: HF_CONDINIT_COMPILE_BACKEND=inductor: ‖Δ grad wte‖ up to 0.71, 34 % of its elements; the version matrix's
#: torch-2.11 row); aot_eager matches there, but the refusal cannot see the backend.
COMPILE_WRONG_GRADIENTS = {(2, 11): ("affine_scaled", "spectral conditioning")}


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
        refuse_compile(compile_refusal(module.config))


def guard_compile(model: nn.Module) -> None:
    """Where `compile_refusal` refuses ``model`` (a model with an attention variant or spectral conditioning) on the
    running torch, make torch.compile of it fail at its first compiled forward with that one line, rather than deep
    inside transformers' code or with wrong gradients. Idempotent; nothing where compile is not refused."""
    if compile_refusal(model.config) is None:
        return
    if _refuse_compile_hook not in model._forward_pre_hooks.values():
        model.register_forward_pre_hook(_refuse_compile_hook)
