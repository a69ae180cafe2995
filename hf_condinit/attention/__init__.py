"""Attention variants as Hugging Face attention implementations (docs/methods.md §3–§5, docs/attention_variants.md).

Each variant is a folder of this package (``affine_scaled/``, ``attention_sink/``, ``preconditioned/``: options,
holder, fast path, reference form), listed once in `hf_condinit.attention.catalog.VARIANTS`; `register_all` registers
each in ``transformers.AttentionInterface`` (with ``sdpa_mask`` in ``AttentionMaskInterface``, so HF builds
padding/causal masks for them) and in `hf_condinit.registry.ATTENTION_VARIANTS`, and `inject` attaches the holder
of the variant a config names.

Spectral conditioning is not an attention function but fixed buffers + forward hooks on the q/k/v projections,
switched on by ``config.condinit["spectral_lambda"]`` or `apply_spectral_conditioning`; it combines with any
attention implementation.

Integration with the core hooks (``hf_condinit.hooks``):

- ``post_init`` wrapper → `inject(model, layout, config)` *before* the original ``post_init`` (structure: holders
  and hooks; idempotent);
- ``_initialize_weights`` wrapper → ``holder.reset_condinit_parameters()`` for every holder whose tensors are not
  flagged ``_is_hf_initialized``, and, after the init scheme has written the block's q/k/v,
  `on_block_initialized(block, layout, config)` (= `on_attention_module_initialized`: recomputes the svd-mode
  spectral C from the final weights; no-op otherwise). Init order is children-first, so a holder's own reset runs
  after the block's projections got their default init but *before* the block's scheme: hence the second step.
- ``_from_config`` wrapper under DeepSpeed ZeRO-3 → `after_zero3_init(model, layout, config)` after the scheme
  (gathers and resets the holders that are not flagged).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ._common import watch_attention_requests
from .affine_scaled import AffineScaledHolder, affine_scaled_attention_forward
from .attention_sink import AttentionSinkHolder, attention_sink_attention_forward
from .catalog import VARIANTS as _CATALOG
from .catalog import variant_named
from .compile_guard import guard_compile
from .holder_base import HOLDER_PREFIX, CondInitHolder
from .portable import PORTABLE_FILE, plugin_config_dict, portable_kind, write_portable
from .preconditioned import preconditioned_attention_forward
from ..parallel import gathered
from .spectral import apply_spectral_conditioning, inject_spectral, merge_spectral, remove_spectral
from .spectral.holder import SpectralHolder
from .variant import AttentionVariant

__all__ = [
    "AttentionVariant",
    "VARIANTS",
    "CondInitHolder",
    "AffineScaledHolder",
    "AttentionSinkHolder",
    "SpectralHolder",
    "register_all",
    "unregister_all",
    "inject",
    "on_attention_module_initialized",
    "on_block_initialized",
    "after_zero3_init",
    "no_decay_parameter_names",
    "condinit_state_dict",
    "write_portable",
    "portable_kind",
    "plugin_config_dict",
    "apply_spectral_conditioning",
    "merge_spectral",
    "remove_spectral",
    "affine_scaled_attention_forward",
    "attention_sink_attention_forward",
    "preconditioned_attention_forward",
]

#: ``attn_implementation`` name → fast path, for every variant of `hf_condinit.attention.catalog.VARIANTS`
VARIANTS = {v.name: v.forward for v in _CATALOG}


def _is_ours(existing: Any, fn: Any) -> bool:
    """Same object, the same function re-imported (importlib.reload of this package), or its copy in the
    ``condinit_modeling.py`` of a portable checkpoint loaded with ``trust_remote_code=True`` (same source)."""
    if existing is fn:
        return True
    module = getattr(existing, "__module__", None) or ""
    return getattr(existing, "__qualname__", None) == getattr(fn, "__qualname__", object()) and (
        module == getattr(fn, "__module__", object()) or module.rpartition(".")[2] == PORTABLE_FILE[:-3]
    )


def register_all() -> list[str]:
    """Register every variant with HF (attention function + mask function) and in ``ATTENTION_VARIANTS``.

    Idempotent for hf_condinit's own functions. Raises `ValueError` when a name is already taken by another
    library's function, so that two plugins never silently shadow each other.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from .. import registry

    for name, fn in VARIANTS.items():
        existing = AttentionInterface._global_mapping.get(name)
        if existing is not None and not _is_ours(existing, fn):
            raise ValueError(
                f"attn_implementation {name!r} is already registered in transformers.AttentionInterface by "
                f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)!s}; "
                "hf_condinit refuses to overwrite it."
            )
        existing_mask = AttentionMaskInterface._global_mapping.get(name)
        if existing_mask is not None and existing_mask is not sdpa_mask:
            raise ValueError(
                f"A mask function for {name!r} is already registered in transformers.masking_utils."
                "AttentionMaskInterface by someone else; hf_condinit refuses to overwrite it."
            )
    for name, fn in VARIANTS.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
        current = registry.ATTENTION_VARIANTS.get(name)
        registry.register_variant(name, fn, overwrite=current is not None and _is_ours(current, fn))
    return list(VARIANTS)


def unregister_all() -> None:
    """Remove the variants from HF's registries and ``ATTENTION_VARIANTS`` (tests / ``hooks.uninstall``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from .. import registry

    for name, fn in VARIANTS.items():
        if _is_ours(AttentionInterface._global_mapping.get(name), fn):
            AttentionInterface._global_mapping.pop(name, None)
            AttentionMaskInterface._global_mapping.pop(name, None)
        if _is_ours(registry.ATTENTION_VARIANTS.get(name), fn):
            registry.ATTENTION_VARIANTS.pop(name, None)


def _options(config) -> dict:
    stored = getattr(config, "condinit", None)
    if stored is None:
        return {}
    return stored if isinstance(stored, dict) else stored.to_dict()


def inject(model: nn.Module, layout=None, config=None) -> list[str]:
    """Attach the holders (and their hooks) that ``config`` asks for to every attention block of ``model``.

    What is injected: the holder of the variant ``config._attn_implementation`` names (`AttentionVariant.attach`:
    ``condinit_affine`` for ``"affine_scaled"``, ``condinit_sink`` for ``"attention_sink"``, none for
    ``"preconditioned"``), and ``condinit_spectral_*`` when ``config.condinit["spectral_lambda"]`` is not None.
    Holders attach to ``layout.core_module(block)`` (the module that calls the attention function). Idempotent:
    existing holders are kept (their values untouched) and hooks are never registered twice. Where the running torch
    refuses to compile the variant (`hf_condinit.attention.compile_guard.compile_refusal`), ``model`` also gets the
    pre-hook that refuses torch.compile in one line (`hf_condinit.attention.compile_guard.guard_compile`). A model
    with a variant gets the hooks that pass a request for attention weights on to its blocks as an argument, so that
    the blocks compile without a graph break (`hf_condinit.attention._common.watch_attention_requests`).

    Values are *not* initialised here beyond zeros: the init pass (``reset_condinit_parameters``) or the loaded
    checkpoint writes them; call `hf_condinit.attention.holder_base.CondInitHolder.reset_condinit_parameters`
    yourself when injecting into an already-built model outside the hooks.

    Returns:
        the qualified names of the holders of ``model`` after injection.
    """
    if layout is None:
        from ..layouts import get_layout

        layout = get_layout(model)
    config = model.config if config is None else config
    variant = variant_named(getattr(config, "_attn_implementation", None))
    opts = _options(config)
    lam = opts.get("spectral_lambda")
    mode = opts.get("spectral_mode") or "identity"
    if variant is not None or lam is not None:
        guard_compile(model)
    if variant is not None:
        watch_attention_requests(model)
    holder = variant is not None and variant.holder is not None
    for _, block in layout.attention_modules(model):
        if not holder and lam is None:
            continue
        core = layout.core_module(block)
        geometry = layout.geometry(block, config)
        if holder:
            variant.attach(core, geometry, layout.projections(block, geometry)["q"].weight)
        if lam is not None:
            inject_spectral(block, core, layout, geometry, lam, mode)
    return [name for name, m in model.named_modules() if isinstance(m, CondInitHolder)]


def on_attention_module_initialized(block: nn.Module, layout, config) -> None:
    """Call after the init scheme has written the q/k/v of attention ``block`` (``_initialize_weights`` wrapper).

    Recomputes the svd-mode spectral C of the block's holders from the final weights, unless C is flagged
    ``_is_hf_initialized`` (loaded from a checkpoint). No-op for every other holder (their initial values do not
    depend on the weights).
    """
    core = layout.core_module(block)
    for holder in core.children():
        if isinstance(holder, SpectralHolder) and holder.mode == "svd":
            holder.reset_condinit_parameters()


on_block_initialized = on_attention_module_initialized  # the name hf_condinit.hooks calls


def after_zero3_init(model: nn.Module, layout, config) -> None:
    """Under DeepSpeed ZeRO-3 (holder parameters partitioned during construction): gather and reset every holder
    whose tensors are not flagged ``_is_hf_initialized``, after the init scheme has run (svd-mode C then reads the
    final, gathered weights). Called by ``hf_condinit.hooks`` after ``apply_init`` in ``_from_config``."""
    for _, holder in [(n, m) for n, m in model.named_modules() if isinstance(m, CondInitHolder)]:
        if any(getattr(t, "_is_hf_initialized", False) for t in holder.condinit_tensors()):
            continue
        extra = [p.weight for p in getattr(holder, "_projections", [])]
        with gathered([*holder.parameters(recurse=False), *extra]):
            holder.reset_condinit_parameters()


def no_decay_parameter_names(model: nn.Module, include_matrices: bool = True, vectors: bool = False) -> list[str]:
    """Names of the parameters to keep out of weight decay, in ``named_parameters`` order: the holder parameters
    (W_a of affine_scaled, sink logits; spectral C is a buffer and never decays), and with ``vectors=True`` every
    parameter of fewer than 2 dimensions too (biases, LayerNorm / RMSNorm weights: nanoGPT's rule, the one the
    example scripts' ``CondInitTrainer`` applies). ``include_matrices=False`` leaves the 2-D W_a to weight decay.
    A ZeRO-3 partitioned parameter (flat) is counted by its real shape, ``ds_shape``.
    """
    names = []
    for name, param in model.named_parameters():
        shape = getattr(param, "ds_shape", None)
        matrix = (len(shape) if shape is not None else param.ndim) >= 2
        holder = any(part.startswith(HOLDER_PREFIX) for part in name.split("."))
        if (holder and (include_matrices or not matrix)) or (vectors and not matrix):
            names.append(name)
    return names


def condinit_state_dict(model: nn.Module) -> dict:
    """The holder entries of ``model.state_dict()`` (W_a, α_ma, sink logits, spectral C)."""
    return {
        k: v for k, v in model.state_dict().items() if any(part.startswith(HOLDER_PREFIX) for part in k.split("."))
    }
