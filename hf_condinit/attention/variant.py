"""`AttentionVariant`: what one attention variant registers, and how its holder is attached to an attention block.

A variant is a folder ``hf_condinit/attention/<name>/`` (docs/architecture.md, "Where a variant lives"):
``options.py`` (its condinit options and their defaults), ``holder.py`` (its state, when it has any), ``fast.py``
(the attention function HF calls), ``reference.py`` (the naive N×N form the fast path is tested against, and the
path ``output_attentions=True`` takes), and ``__init__.py``, which builds its one `AttentionVariant`.
`hf_condinit.attention.catalog.VARIANTS` lists them; every other table (HF's ``AttentionInterface`` and
``AttentionMaskInterface`` entries, ``hf_condinit.registry.ATTENTION_VARIANTS``, the ``<name>_reference``
implementations, the options' "read by" table of `hf_condinit.config.check_options_apply`,
``hf_condinit.hooks.FORWARD_OPTIONS``, a portable checkpoint's holders) is derived from that list.

Module-level names in a variant's folder are unique across variants (``AFFINE_SCALED_OPTIONS``, not ``OPTIONS``):
a portable checkpoint's ``condinit_modeling.py`` concatenates their source (`hf_condinit.attention.portable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

__all__ = ["AttentionVariant"]


@dataclass(frozen=True)
class AttentionVariant:
    """One attention variant.

    Attributes:
        name: its ``attn_implementation`` name; its reference form is registered as ``<name>_reference``.
        forward: the fast path, an HF attention function ``fn(module, query, key, value, attention_mask, dropout,
            scaling, is_causal, **kwargs) -> (out (B, Q, H, d), weights (B, H, Q, K) or None)``.
        reference: the naive form, same signature, always returning the weights.
        options: the condinit options only this variant reads, with their defaults.
        holder: its `hf_condinit.attention.holder_base.CondInitHolder` subclass, or None for a variant without state.
        holder_name: the attribute the holder is attached under (starts with ``condinit_``).
        randomise: ``fn(holder, generator)`` giving the holder non-trivial values for a comparison with the reference.
    """

    name: str
    forward: Callable[..., Any]
    reference: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    holder: type | None = None
    holder_name: str | None = None
    randomise: Callable[..., None] | None = None

    @property
    def reference_name(self) -> str:
        return f"{self.name}_reference"

    def attach(self, core: nn.Module, geometry, like) -> nn.Module | None:
        """The holder of attention module ``core`` (of ``geometry``; device and dtype of tensor ``like``), attached
        with its hooks if missing; an existing holder keeps its values. None for a variant without a holder."""
        if self.holder is None:
            return None
        holder = core._modules.get(self.holder_name)
        if holder is None:
            holder = self.holder.from_geometry(geometry, device=like.device, dtype=like.dtype)
            core.add_module(self.holder_name, holder)
        holder.hook_into(core)
        return holder
