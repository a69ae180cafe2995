"""Reversible hooks on `PreTrainedModel` that make ``condinit=`` and the attention variants one flag away.

`install` (run on ``import hf_condinit``) wraps eight methods (six of `PreTrainedModel`, two of
`PreTrainedConfig`) and registers the attention variants with HF's
``AttentionInterface`` / ``AttentionMaskInterface`` (`hf_condinit.attention.register_all`); `uninstall` restores the
methods and unregisters the variants (`uninstalled`: for a ``with`` block). Every wrapper takes ``*args, **kwargs``
and passes them on unchanged, reading only the arguments it needs by name (`_bound`), so an argument a model's
override or a later transformers adds reaches the original (`hf_condinit.inertness` checks every model type):

- ``_from_config`` (classmethod): works on a deep copy of the config (HF's own ``_from_config`` writes dtype and
  attention implementation into it; the caller's object stays unchanged for later models) and pops ``condinit=``
  into it as ``config.condinit``. Under DeepSpeed ZeRO-3, where HF builds with
  initialisation suppressed and re-runs it per module on rank 0, the scheme is applied afterwards on every rank
  with gathered parameters (`hf_condinit.api.apply_init`), giving the same weights as without ZeRO.
- ``post_init`` (structure): resolves ``config.condinit`` (seed, layout, version), checks that the model has a
  recognisable attention, records the attention variant in ``config.condinit_attention`` and lets
  `hf_condinit.attention.inject` attach the variant's holder modules *before* the original ``post_init`` runs the
  init pass, so the holders are created inside ``zero.Init`` and initialised like any other module.
- ``_initialize_weights`` (values): after the original, writes the scheme on each attention block and resets
  each holder, skipping every parameter flagged ``_is_hf_initialized`` — so ``from_pretrained`` never
  re-initialises loaded weights, whatever the config says.
- ``initialize_weights`` (the init pass: ``post_init`` and ``from_pretrained``'s missing keys both run it): while it
  runs, every tensor the scheme wrote carries ``_is_hf_initialized``, so a model's own later re-draw in the same
  pass skips it (ImageGPT re-draws every ``c_proj`` weight from its root module's ``_init_weights``, after the
  blocks: mimetic's W_O would be lost); the flags are removed when the pass ends, so a later ``apply_init`` still
  sees those weights as its own.
- ``_check_and_adjust_attn_implementation``: when the user names no attention implementation and the config
  records ``condinit_attention`` (a checkpoint saved with a variant), that variant is used, so the holders'
  saved parameters are loaded instead of dropped.
- ``PreTrainedConfig.from_dict`` (classmethod; where ``from_pretrained`` of a model, of an Auto class or of a config
  applies its keyword arguments to the stored config): ``condinit=`` on a checkpoint whose config records a
  recipe keeps the options
  the checkpoint was trained with that change the forward pass (`FORWARD_OPTIONS`: spectral conditioning and the
  attention variants' options), and refuses, with a ValueError naming the option, a ``condinit=`` that sets one of
  them to another value or drops the recipe (``condinit=None/False``). Its other options (method, seed, ...) only
  concern weights the checkpoint does not hold.
- ``save_pretrained``: after the original, a model whose forward needs hf_condinit (attention variant, unmerged
  spectral conditioning) is made portable (`hf_condinit.attention.portable.write_portable`: self-contained code
  next to the weights, ``auto_map``, renamed ``model_type``), so plain transformers loads it exactly with
  ``trust_remote_code=True`` and refuses it otherwise.
- ``PreTrainedConfig.get_config_dict`` (classmethod; every config read from a directory): undoes that rewrite
  (`hf_condinit.attention.portable.plugin_config_dict`), so with the plugin imported the checkpoint loads through the
  plugin's hooks as before.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from typing import Any

from transformers import PreTrainedConfig, PreTrainedModel

from . import api
from .attention.catalog import VARIANTS
from .attention.spectral.options import SPECTRAL_OPTIONS
from .config import CondInitConfig, check_options_apply, resolve_condinit
from .layouts import get_layout
from .layouts.detect import base_model_class
from .names import unknown_attention_error
from .parallel import is_zero3_param
from .registry import ATTENTION_VARIANTS

__all__ = ["install", "uninstall", "uninstalled", "is_installed", "FORWARD_OPTIONS"]

_ORIGINALS: dict[str, Any] = {}
_HOOKED = {
    "_from_config": PreTrainedModel,
    "post_init": PreTrainedModel,
    "_initialize_weights": PreTrainedModel,
    "initialize_weights": PreTrainedModel,
    "_check_and_adjust_attn_implementation": PreTrainedModel,
    "from_dict": PreTrainedConfig,
    "get_config_dict": PreTrainedConfig,
    "save_pretrained": PreTrainedModel,
}
#: condinit options that change what a trained checkpoint computes (spectral conditioning's and every attention
#: variant's): `from_pretrained` keeps the checkpoint's.
FORWARD_OPTIONS = (*SPECTRAL_OPTIONS, *(name for variant in VARIANTS for name in variant.options))


def is_installed() -> bool:
    return bool(_ORIGINALS)


def install() -> None:
    """Wrap the `PreTrainedModel` methods and register the attention variants (idempotent)."""
    _variant_hook("register_all")()
    if _ORIGINALS:
        return
    for name, owner in _HOOKED.items():
        _ORIGINALS[name] = owner.__dict__[name]
    PreTrainedModel._from_config = classmethod(_from_config)
    PreTrainedModel.post_init = _post_init
    PreTrainedModel._initialize_weights = _initialize_weights
    PreTrainedModel.initialize_weights = _initialize_weights_pass
    PreTrainedModel._check_and_adjust_attn_implementation = _check_and_adjust_attn_implementation
    PreTrainedConfig.from_dict = classmethod(_config_from_dict)
    PreTrainedConfig.get_config_dict = classmethod(_config_get_config_dict)
    PreTrainedModel.save_pretrained = _save_pretrained


def uninstall() -> None:
    """Restore the original methods and unregister the attention variants."""
    for name, original in _ORIGINALS.items():
        setattr(_HOOKED[name], name, original)
    _ORIGINALS.clear()
    _variant_hook("unregister_all")()


@contextlib.contextmanager
def uninstalled():
    """The hooks removed for the ``with`` block (`hf_condinit.inertness` compares against plain transformers), then
    installed again if they were installed before."""
    was = is_installed()
    uninstall()
    try:
        yield
    finally:
        if was:
            install()


def _original(name: str):
    original = _ORIGINALS[name]
    return original.__func__ if isinstance(original, classmethod) else original


@functools.cache
def _signature(name: str) -> inspect.Signature:
    return inspect.signature(_original(name))


def _bound(name: str, *args, **kwargs) -> inspect.BoundArguments:
    """The arguments of a call to the original ``name``, defaults applied (the wrappers take ``*args, **kwargs``
    and pass them on unchanged, so an argument transformers adds later reaches the original; they read only the
    ones they need, by name). A call the original's signature does not take is passed on as it is, for the
    original to raise its own error."""
    bound = _signature(name).bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return bound


def _needs_variant(config) -> bool:
    condinit = getattr(config, "condinit", None) or {}
    return config._attn_implementation in ATTENTION_VARIANTS or condinit.get("spectral_lambda") is not None


def _from_config(cls, config, *args, **kwargs):
    config = copy.deepcopy(config)  # HF's _from_config and our hooks write to it; the caller's object stays as is
    if "condinit" in kwargs:
        value = kwargs.pop("condinit")
        if isinstance(value, dict):  # what the user typed: refuse options the recipe never reads
            check_options_apply(value, attention=kwargs.get("attn_implementation")
                                or getattr(config, "_attn_implementation", None))
        resolved = resolve_condinit(value)
        config.condinit = resolved.to_dict() if resolved is not None else None
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if text is not config:  # multimodal: the language model, built (and initialised) as a sub-model, gets it
            text.condinit = config.condinit
    impl = kwargs.get("attn_implementation")
    variant = isinstance(impl, str) and impl in ATTENTION_VARIANTS
    # the whole model's layout (its init and variant trials) decides, before any work; a sub-model's config without
    # a model class of its own (AIMv2's text tower) is looked up by its post_init
    if (getattr(config, "condinit", None) or variant) and base_model_class(config) is not None:
        layout = get_layout(config)
        if variant:
            layout.check_variant(config, impl)
    scoped = _variant_on_language_model(config, kwargs)
    model = _original("_from_config")(cls, config, *args, **scoped)
    if scoped is not kwargs:  # recorded on the saved text config, so from_pretrained rebuilds the language model with it
        model.config.get_text_config().condinit_attention = kwargs["attn_implementation"]
    cfg = api.resolved_condinit(model.config)
    if cfg is not None and any(is_zero3_param(p) for p in model.parameters()):
        api.apply_init(model, cfg)
        _variant_hook("after_zero3_init")(model, get_layout(model), model.config)
    return model


def _variant_on_language_model(config, kwargs: dict) -> dict:
    """A variant named on a multimodal model (a separate ``text_config``) goes to its language model only; the other
    towers keep their default implementation (HF's per-sub-config ``attn_implementation`` dict, ``None`` = the
    default: SDPA where the tower supports it, else eager), so no holder is asked of a vision tower."""
    impl = kwargs.get("attn_implementation")
    if not isinstance(impl, str) or impl not in ATTENTION_VARIANTS:
        return kwargs  # nothing asked: the config is not even read (MusicGen's get_text_config() raises)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is config:
        return kwargs
    keys = [k for k in getattr(config, "sub_configs", {}) if getattr(config, k, None) is not None]
    text_keys = [k for k in keys if getattr(config, k) is text]
    if not text_keys:
        return kwargs
    return {**kwargs, "attn_implementation": {"": None, **{k: None for k in keys}, text_keys[0]: impl}}


def _config_from_dict(cls, config_dict, *args, **kwargs):
    stored = config_dict.get("condinit") if isinstance(config_dict, dict) else None
    if "condinit" in kwargs and stored is not None:
        kwargs["condinit"] = _keep_checkpoint_recipe(stored, kwargs["condinit"])
    return _original("from_dict")(cls, config_dict, *args, **kwargs)


def _config_get_config_dict(cls, *args, **kwargs):
    config_dict, kwargs = _original("get_config_dict")(cls, *args, **kwargs)
    return _variant_hook("plugin_config_dict")(config_dict), kwargs


def _save_pretrained(self, save_directory, *args, **kwargs):
    if kwargs.get("push_to_hub") and _variant_hook("portable_kind")(self) is not None:
        raise ValueError(
            "save_pretrained(push_to_hub=True) uploads before hf_condinit adds the code this checkpoint needs "
            "(condinit_modeling.py); save without push_to_hub and call model.push_to_hub(repo_id) instead."
        )
    result = _original("save_pretrained")(self, save_directory, *args, **kwargs)
    if _bound("save_pretrained", self, save_directory, *args, **kwargs).arguments.get("is_main_process", True):
        _variant_hook("write_portable")(self, save_directory)
    return result


def _keep_checkpoint_recipe(stored: dict, requested) -> dict:
    """``requested`` (any ``condinit=`` spelling) with the checkpoint's `FORWARD_OPTIONS`; ValueError on a conflict."""
    recorded = {k: stored[k] for k in FORWARD_OPTIONS if k in stored}
    resolved = resolve_condinit(requested)
    if resolved is None:
        if recorded.get("spectral_lambda") is not None:
            raise ValueError(
                f"condinit={requested!r} would drop the spectral conditioning this checkpoint was trained with "
                f"(spectral_lambda={recorded['spectral_lambda']!r}). Leave condinit= out to keep it, or load and call "
                "hf_condinit.attention.remove_spectral(model) to drop it on purpose."
            )
        return requested
    explicit = requested if isinstance(requested, dict) else {}
    for key, value in recorded.items():
        if key in explicit and explicit[key] != value:
            raise ValueError(
                f"This checkpoint was trained with condinit option {key}={value!r}, but condinit= asks for "
                f"{key}={explicit[key]!r}, which would change what the loaded model computes. Leave {key} out of "
                "condinit= to keep the checkpoint's value (hf_condinit.apply_spectral_conditioning / remove_spectral "
                "change spectral conditioning of a loaded model on purpose)."
            )
    return CondInitConfig.from_dict({**resolved.to_dict(), **recorded}).to_dict()


def _post_init(self, *args, **kwargs) -> None:
    config = self.config
    _check_variant_matches_checkpoint(config)
    cfg = api.resolved_condinit(config)
    if cfg is not None or _needs_variant(config):
        layout = get_layout(self)
        api.attention_blocks(self, layout)
        if cfg is not None and cfg.layout != layout.name:
            cfg.layout = layout.name
            config.condinit = cfg.to_dict()
        if _needs_variant(config):
            if config._attn_implementation in ATTENTION_VARIANTS:
                layout.check_variant(config, config._attn_implementation)
                config.condinit_attention = config._attn_implementation
            _variant_hook("inject")(self, layout, config)
    _original("post_init")(self, *args, **kwargs)


def _check_variant_matches_checkpoint(config) -> None:
    recorded = getattr(config, "condinit_attention", None)
    if recorded and recorded != config._attn_implementation:
        raise ValueError(
            f"This config records attention variant {recorded!r} (its extra parameters are part of the "
            f"checkpoint), but the model is being built with attn_implementation={config._attn_implementation!r}, "
            f"which would drop them. Pass attn_implementation={recorded!r}, or set config.condinit_attention = None "
            "to build without the variant on purpose."
        )


def _initialize_weights(self, module, *args, **kwargs):
    already = getattr(module, "_is_hf_initialized", False)
    _original("_initialize_weights")(self, module, *args, **kwargs)
    if already:
        return
    if hasattr(module, "reset_condinit_parameters"):
        if not any(getattr(t, "_is_hf_initialized", False) for t in (*module.parameters(), *module.buffers())):
            module.reset_condinit_parameters()
        return
    cfg = api.resolve_condinit(getattr(self.config, "condinit", None)) if hasattr(self, "config") else None
    if cfg is None and not _needs_variant(self.config):
        return
    ordinal = _block_ordinals(self).get(id(module))
    if ordinal is None or any(is_zero3_param(p) for p in module.parameters()):
        return  # not an attention block, or ZeRO-3 (handled after construction in `_from_config`)
    layout = get_layout(self)
    if cfg is not None:
        wrote: list = []
        api.init_attention_block(module, ordinal, layout, self.config, cfg, loaded="skip", wrote=wrote)
        if _PASSES:  # protect what was written from the rest of this init pass (`_initialize_weights_pass`)
            for tensor in wrote:
                if not getattr(tensor, "_is_hf_initialized", False):
                    tensor._is_hf_initialized = True
                    _PASSES[-1].append(tensor)
    if _needs_variant(self.config):
        _variant_hook("on_block_initialized")(module, layout, self.config)


_PASSES: list[list] = []  # one list per running init pass: the tensors the scheme wrote and flagged


def _initialize_weights_pass(self, *args, **kwargs):
    _PASSES.append([])
    try:
        return _original("initialize_weights")(self, *args, **kwargs)
    finally:
        for tensor in _PASSES.pop():
            tensor._is_hf_initialized = False


def _block_ordinals(model) -> dict[int, int]:
    """``id(block) -> ordinal`` for the model's attention blocks (cached on the model)."""
    cache = model.__dict__.get("_condinit_block_ordinals")
    if cache is None:
        blocks = get_layout(model).attention_modules(model)
        cache = {id(block): i for i, (_, block) in enumerate(blocks)}
        model.__dict__["_condinit_block_ordinals"] = cache
    return cache


def _check_and_adjust_attn_implementation(self, *args, **kwargs):
    name = "_check_and_adjust_attn_implementation"
    recorded = getattr(self.config, "condinit_attention", None)
    try:
        bound = _bound(name, self, *args, **kwargs)
    except TypeError:  # a call the original does not take: its own error
        return _original(name)(self, *args, **kwargs)
    attn_implementation = bound.arguments.get("attn_implementation")
    if attn_implementation is None and recorded:
        bound.arguments["attn_implementation"] = attn_implementation = recorded
    if bound.arguments.get("is_init_check") and isinstance(attn_implementation, str) \
            and attn_implementation in ATTENTION_VARIANTS:
        # before the blocks are built: a family that computes attention inline in the installed transformers may
        # look the name up in its own table of attention classes (Falcon, GPT-J in 5.17: KeyError)
        get_layout(self.config).check_variant(self.config, attn_implementation)
    try:
        return _original(name)(*bound.args, **bound.kwargs)
    except ValueError as err:  # an unknown name: transformers' list plus hf_condinit's, and the closest
        explained = unknown_attention_error(attn_implementation, err)
        if explained is err:
            raise
        raise explained from None


def _variant_hook(name: str):
    """A function of `hf_condinit.attention` called at a construction step (see docs/architecture.md)."""
    from . import attention

    return getattr(attention, name)
