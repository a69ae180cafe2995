"""`CondInitHolder`, the base class of the modules an attention variant attaches to an attention block.

A holder is a small ``nn.Module`` attached as a *direct child* of the module that calls HF's attention function
(`AttentionLayout.core_module(block)`), under an attribute name starting with ``HOLDER_PREFIX``. Each variant's folder
defines its own holder in its ``holder.py`` (spectral conditioning's: `hf_condinit.attention.spectral.holder`); each
holder's attribute and state: docs/architecture.md, "Holder protocol".

Every holder has ``reset_condinit_parameters()`` (called by the ``_initialize_weights`` hook for holders whose
tensors are not flagged ``_is_hf_initialized``): it writes its initial values in place, computing in fp32 and
copying with the guarded ``transformers.initialization`` functions, deterministically (no RNG).

Hooks registered on other modules are *bound methods* of the holder (never closures), so ``copy.deepcopy`` and
pickling of the model keep each hook pointing at the copy's own holder.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["HOLDER_PREFIX", "hf_init_fn", "is_flagged", "CondInitHolder", "iter_holders"]

HOLDER_PREFIX = "condinit_"


def hf_init_fn(name: str):
    """The guarded (``_is_hf_initialized``-aware) init function of transformers, or the torch one."""
    try:
        from transformers import initialization as hf_init

        return getattr(hf_init, name)
    except (ImportError, AttributeError):  # pragma: no cover - old transformers
        if name == "copy_":
            return lambda t, o: t.copy_(o)
        return getattr(torch.nn.init, name)


def is_flagged(t: torch.Tensor) -> bool:
    """Whether ``t`` carries ``_is_hf_initialized`` (loaded by from_pretrained, or written by this init pass)."""
    return bool(getattr(t, "_is_hf_initialized", False))


class CondInitHolder(nn.Module):
    """Base class of the injected holders.

    ``shape_fields``: the constructor's keyword arguments besides ``device`` / ``dtype``, named as the attributes of
    `hf_condinit.layouts.HeadGeometry` they are read from (`from_geometry`) and recorded under in a portable
    checkpoint's manifest (`shape`, `from_shape`).
    """

    shape_fields: tuple[str, ...] = ()

    @classmethod
    def from_geometry(cls, geometry, *, device=None, dtype=None) -> "CondInitHolder":
        """A holder (zeros) sized for an attention block of ``geometry``."""
        return cls(**{f: getattr(geometry, f) for f in cls.shape_fields}, device=device, dtype=dtype)

    @classmethod
    def from_shape(cls, shape: dict, *, device=None, dtype=None) -> "CondInitHolder":
        """A holder (zeros) rebuilt from what `shape` recorded."""
        return cls(**{f: shape[f] for f in cls.shape_fields}, device=device, dtype=dtype)

    def shape(self) -> dict:
        """``{field: value}`` for every ``shape_fields`` entry (what `from_shape` needs)."""
        return {f: getattr(self, f) for f in self.shape_fields}

    def hook_into(self, module: nn.Module) -> None:
        """Register the hooks this holder needs on ``module``, the attention module it is attached to (idempotent).
        None by default."""

    def reset_condinit_parameters(self, force: bool = False) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def condinit_tensors(self) -> list[torch.Tensor]:
        return [*self.parameters(recurse=False), *self.buffers(recurse=False)]

    def is_initialized(self) -> bool:
        """True when every parameter and buffer carries ``_is_hf_initialized`` (e.g. loaded by from_pretrained)."""
        tensors = self.condinit_tensors()
        return bool(tensors) and all(is_flagged(t) for t in tensors)


def iter_holders(model: nn.Module):
    """Yield ``(qualified_name, holder)`` for every condinit holder in ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, CondInitHolder):
            yield name, module
