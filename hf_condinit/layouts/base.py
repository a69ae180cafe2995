"""The layout protocol: where a family keeps q/k/v/o, as writable per-head views in math orientation.

Math orientation (docs/methods.md, "Notation"): row-vector convention, Q = X·W_Q with X (N, D), one head's W_Q, W_K,
W_V of shape (D, d) and W_O's head-h block of shape (d, D). Storage differs per module type:

- ``nn.Linear`` stores ``weight`` as (out, in): a head of q/k/v is a *row* block, seen transposed;
- GPT-2 ``Conv1D`` stores ``weight`` as (in, out) = math orientation: a head is a *column* block, no transpose.

All transposition and fused / interleaved slicing in the package lives in this file; schemes, variants and
diagnostics only see `Projection.heads` views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["HeadGeometry", "Projection", "AttentionLayout", "LayoutError", "RUNTIME_VARIANT_CHECKS"]

QKV_ROLES = ("q", "k", "v")

#: The checks of `AttentionLayout.refuse_variant` that build models, ``check(layout, config, implementation)`` →
#: the reason or None, in order. `hf_condinit.layouts.detect` (an implementation, which builds on this protocol)
#: registers its own when the package is imported, so this module imports none.
RUNTIME_VARIANT_CHECKS: list[Callable[..., str | None]] = []


def _full_shape(t: torch.Tensor) -> torch.Size:
    """The unpartitioned shape (DeepSpeed ZeRO-3 leaves an empty local tensor and keeps it in ``ds_shape``)."""
    return getattr(t, "ds_shape", t.shape)


class LayoutError(ValueError):
    """A model does not match what its layout adapter expects (shapes, head dimensions, missing modules)."""


@dataclass(frozen=True)
class HeadGeometry:
    """Head geometry of one attention module.

    Attributes:
        hidden: D, the input width of q/k/v (and output width of o).
        n_heads: H, number of query heads.
        n_kv_heads: H_kv, number of key/value heads (H_kv < H under GQA/MQA; H divisible by H_kv).
        head_dim: d.
    """

    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def heads_for(self, role: str) -> int:
        return self.n_kv_heads if role in ("k", "v") else self.n_heads


@dataclass(frozen=True)
class Projection:
    """One role (``"q"``, ``"k"``, ``"v"`` or ``"o"``) of one attention module.

    Head h of a q/k/v role occupies positions ``starts[h]`` … ``starts[h] + head_dim`` of the module's *output*
    axis (``starts=None``: contiguous heads, ``starts[h] = h·head_dim``; fused layouts give explicit starts, see
    `hf_condinit.layouts.fused`). Head h of the ``"o"`` role occupies the same positions of the module's *input*
    axis.

    Attributes:
        module: the module computing ``y = x·W (+ b)`` for this role (the fused module for fused layouts).
        role: ``"q"``, ``"k"``, ``"v"`` or ``"o"``.
        n_heads: heads of this role (KV heads for k/v under GQA/MQA).
        head_dim: d.
        storage: ``"linear"`` (weight is (out, in)) or ``"conv1d"`` (weight is (in, out)).
        starts: where each head begins on the head axis (None = contiguous from 0).
        gate_starts: for a query projection that also computes the attention output's gate (gated attention,
            Qwen3-Next / Qwen3.5: ``attn_out_h ⊙ σ(x·W_G^h)`` before W_O), where each head's d gate columns begin on
            the same axis; None without a gate. The gate is not part of W_Q: `heads` never includes it.
    """

    module: nn.Module
    role: str
    n_heads: int
    head_dim: int
    storage: str
    starts: tuple[int, ...] | None = None
    gate_starts: tuple[int, ...] | None = None

    @property
    def weight(self) -> nn.Parameter:
        return self.module.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return getattr(self.module, "bias", None)

    def _starts(self) -> Iterator[int]:
        if self.starts is not None:
            return iter(self.starts)
        return (h * self.head_dim for h in range(self.n_heads))

    @property
    def head_axis(self) -> int:
        """Axis of `weight` along which the heads lie (output axis for q/k/v, input axis for o)."""
        out_axis = 0 if self.storage == "linear" else 1
        return out_axis if self.role in QKV_ROLES else 1 - out_axis

    def heads(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Per-head writable views of ``t`` (shaped like `weight`) in math orientation.

        Returns (D, d) views for q/k/v and (d, D) views for o.
        """
        views = [t.narrow(self.head_axis, start, self.head_dim) for start in self._starts()]
        # nn.Linear stores the transpose of the math matrix; Conv1D stores it as is.
        return [v.t() for v in views] if self.storage == "linear" else views

    def gate_heads(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Per-head writable views of the output gate's part of ``t`` (shaped like `weight`), (D, d) in math
        orientation like `heads`; empty without a gate."""
        views = [t.narrow(self.head_axis, start, self.head_dim) for start in self.gate_starts or ()]
        return [v.t() for v in views] if self.storage == "linear" else views

    def bias_heads(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Per-head (d,) views of ``t`` shaped like `bias` (q/k/v roles only)."""
        if self.role not in QKV_ROLES:
            raise LayoutError("bias_heads is defined for the q, k and v roles only.")
        return [t.narrow(0, start, self.head_dim) for start in self._starts()]

    def linear(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x·t`` in this module's storage convention, over the whole tensor ``t`` shaped like `weight`."""
        return F.linear(x, t) if self.storage == "linear" else x @ t


# Attributes under which HF attention modules keep their geometry (first found wins), in order of preference.
_HEADS_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "n_head")
_KV_HEADS_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "head_size")


def _int_attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def text_scope(model: nn.Module) -> str | None:
    """Dotted path of the language model inside a multimodal model (``config.text_config``), else None.

    The language model is the outermost submodule that is a `PreTrainedModel` whose config has the text config's
    ``model_type``; models without a separate text config (every text-only model) give None (the whole model).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None
    text = config.get_text_config()
    if text is config or getattr(text, "model_type", None) == getattr(config, "model_type", None):
        return None
    for name, module in model.named_modules():
        sub = getattr(module, "config", None)
        if name and module is not model and sub is not None and hasattr(module, "post_init") \
                and getattr(sub, "model_type", None) == text.model_type:
            return name
    return None


class AttentionLayout:
    """Base class of layout adapters: one instance per family, selected by ``config.model_type``.

    Subclasses implement `_is_attention_block` and `_projections`. ``core`` names the submodule (dotted path,
    ``""`` = the block itself) that calls HF's attention interface: attention-variant holders attach there.
    ``variant_refusal`` (None, or the reason) says why the attention variants cannot run on this family (its
    attention does not go through HF's attention interface, or it adds terms the variants do not implement).
    ``detected``: made by `hf_condinit.layouts.detect` (proved on a miniature, not in the table): each variant is
    also tried on a miniature before a real model takes it (`refuse_variant`). ``block_classes`` (None: every
    block the names match): the class names of the blocks that are attention blocks, set by detection on a hybrid
    (softmax attention among linear-attention, state-space or convolution mixers whose modules carry the same
    names: OLMo-Hybrid's Gated DeltaNet has q_proj/k_proj/v_proj/o_proj, a Mamba mixer in_proj/out_proj), so the
    other mixers are left alone.
    """

    name: str = "base"
    core: str = ""
    variant_refusal: str | None = None
    detected: bool = False
    block_classes: frozenset[str] | None = None

    def _is_attention_block(self, module: nn.Module) -> bool:
        raise NotImplementedError

    def refuse_variant(self, config, implementation: str | None = None) -> str | None:
        """Why the attention variants (or the variant ``implementation``) cannot run on a model of this family with
        this config (None: they can).

        The table's fixed reason comes first, then what the config says (logit softcapping, ALiBi), then the checks
        that build models (`RUNTIME_VARIANT_CHECKS`, registered by `hf_condinit.layouts.detect`): the route the
        *installed* transformers takes (the model class's ``_supports_attention_backend`` flag, else the layout proof
        on a miniature of this config), since whether a family computes attention inline changes between
        transformers versions (GPT-J / CodeGen: inline in 5.17, through the attention interface in 5.25); for a
        detected family and a named ``implementation``, a miniature of this config built with it must run a forward
        pass (a sub-model without the attention interface or without a layout, an attention module that takes its
        input another way).
        """
        if self.variant_refusal:
            return self.variant_refusal
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        cap = getattr(text, "attn_logit_softcapping", None)
        if cap is not None:
            return (f"its attention logits are soft-capped (attn_logit_softcapping={cap}), which the variants do "
                    "not implement")
        if getattr(text, "alibi", False) is True:
            return ("its ALiBi position bias reaches the attention function inside the attention mask, which the "
                    "variants read as visibility only")
        for check in RUNTIME_VARIANT_CHECKS:
            reason = check(self, config, implementation)
            if reason:
                return reason
        return None

    def check_variant(self, config, implementation: str) -> None:
        """Raise `LayoutError` (before any model work) when ``implementation`` cannot run on this family."""
        reason = self.refuse_variant(config, implementation)
        if reason:
            raise LayoutError(
                f"attn_implementation={implementation!r} is not available for model_type="
                f"{getattr(config, 'model_type', None)!r}: {reason}. Build it without the variant (conditioned / "
                "mimetic init and spectral conditioning still apply)."
            )

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        raise NotImplementedError

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The attention blocks of ``model`` in model order; the list index is the layer ordinal.

        In a multimodal model (a config with a separate ``text_config``) only the language model's blocks count
        (`text_scope`): the init and the variants apply to the language model, the other towers keep their own.
        """
        scope = text_scope(model)
        prefix = f"{scope}." if scope else ""
        return [(name, m) for name, m in model.named_modules()
                if name.startswith(prefix) and self._is_attention_block(m)
                and (self.block_classes is None or type(m).__name__ in self.block_classes)]

    def core_module(self, module: nn.Module) -> nn.Module:
        """The submodule of attention block ``module`` that runs the attention function."""
        return module.get_submodule(self.core) if self.core else module

    def projections(self, module: nn.Module, geometry: HeadGeometry | None = None) -> dict[str, Projection]:
        """Map ``"q"``, ``"k"``, ``"v"``, ``"o"`` to the `Projection` of attention block ``module``.

        Without ``geometry`` it is read from the block (and the ``config`` attribute of the block or its core).
        """
        if geometry is None:
            geometry = self.geometry(module, self._module_config(module))
        return self._projections(module, geometry)

    def _module_config(self, module: nn.Module):
        for m in (module, self.core_module(module)):
            if getattr(m, "config", None) is not None:
                return m.config
        raise LayoutError(
            f"{type(module).__name__} has no `config` attribute; pass the geometry explicitly "
            "(layout.projections(module, layout.geometry(module, model.config)))."
        )

    def _hidden_from_weights(self, module: nn.Module) -> int | None:
        """D read from the query projection's input axis (None when the layout cannot say before geometry)."""
        return None

    def geometry(self, module: nn.Module, config) -> HeadGeometry:
        """Head geometry of attention block ``module``, checked against the real projection shapes.

        Read from the attention module first, where HF keeps the per-layer values (``num_heads``,
        ``num_key_value_heads`` or ``num_key_value_groups``, ``head_dim`` on the block or its core module, and
        D from the query projection's input), then from the (text) config: per-layer head dimensions and
        sliding/global mixes get each layer's own geometry.
        """
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        core = self.core_module(module)
        owners = (core, module) if core is not module else (module,)
        hidden = self._hidden_from_weights(module) or config.hidden_size
        n_heads = next((v for m in owners if (v := _int_attr(m, _HEADS_ATTRS))), None)
        n_heads = n_heads or config.num_attention_heads
        n_kv = next((v for m in owners if (v := _int_attr(m, _KV_HEADS_ATTRS))), None)
        if n_kv is None:
            groups = next((v for m in owners if (v := _int_attr(m, ("num_key_value_groups",)))), None)
            n_kv = n_heads // groups if groups and n_heads % groups == 0 else None
        n_kv = n_kv or getattr(config, "num_key_value_heads", None) or n_heads
        head_dim = next((v for m in owners if (v := _int_attr(m, _HEAD_DIM_ATTRS))), None)
        head_dim = head_dim or getattr(config, "head_dim", None)
        if head_dim is None:
            if hidden % n_heads:
                raise LayoutError(
                    f"{type(module).__name__}: hidden size {hidden} is not divisible by {n_heads} heads, so the "
                    "head dimension is undefined; set config.head_dim or fix the head count."
                )
            head_dim = hidden // n_heads
        if n_heads % n_kv:
            raise LayoutError(f"{n_heads} query heads are not a multiple of {n_kv} key/value heads.")
        geometry = HeadGeometry(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim)
        self._check_shapes(module, geometry)
        return geometry

    def _check_shapes(self, module: nn.Module, g: HeadGeometry) -> None:
        """The non-head axis of every weight must be D, and each head axis must be tiled exactly by its heads."""
        projs = self._projections(module, g)
        tiled: dict[tuple[int, int], int] = {}
        for role, p in projs.items():
            if _full_shape(p.weight)[1 - p.head_axis] != g.hidden:
                self._shape_error(module, role, p, g)
            key = (id(p.module), p.head_axis)
            tiled[key] = tiled.get(key, 0) + (p.n_heads + len(p.gate_starts or ())) * g.head_dim
        for role, p in projs.items():
            if tiled[(id(p.module), p.head_axis)] != _full_shape(p.weight)[p.head_axis]:
                self._shape_error(module, role, p, g)

    def _shape_error(self, module: nn.Module, role: str, proj: Projection, g: HeadGeometry) -> None:
        raise LayoutError(
            f"{type(module).__name__} ({role}): weight of shape {tuple(_full_shape(proj.weight))} does not hold "
            f"{proj.n_heads} heads of dimension {g.head_dim} over hidden size {g.hidden} in the {self.name!r} "
            "layout. Check config.num_attention_heads / num_key_value_heads / head_dim, or register a layout "
            "that matches this model with hf_condinit.register_layout(model_type, layout, overwrite=True)."
        )
