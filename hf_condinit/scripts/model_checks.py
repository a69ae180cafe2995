"""Checks of the model flags against the machine and the model class, made before any work."""

from __future__ import annotations

import sys
import warnings

from .arguments import MODEL_DEFAULT, CondInitArguments
from ..errors import UsageError
from .machine import has_accelerator
from .parsing import flags_given


def check_attention_usable(attention: str, model_class, config, use_cpu: bool = False) -> None:
    """Raise a :class:`UsageError` when ``--attention`` cannot run with ``model_class`` (built from ``config``) on this
    machine: HF's own check (flash-attention package, the model's support for flash / flex attention), plus a GPU
    for ``flash_attention_*``, and no ``paged|...`` (continuous-batching generation only) for training.
    ``model_class``: a concrete class, or an ``AutoModelFor...`` class resolved through its mapping. Builds nothing.
    ``--attention default`` (or ``None``) is transformers' own choice, which always resolves: nothing to check."""
    if attention in (None, MODEL_DEFAULT):
        return
    if attention.startswith("paged|"):
        raise UsageError(f"--attention {attention} is for generation with continuous batching, not training; "
                         f"use sdpa or eager.")
    if hasattr(model_class, "_model_mapping"):
        try:
            model_class = model_class._model_mapping[type(config)]
        except KeyError:
            raise UsageError(f"{model_class.__name__} has no model for config type {type(config).__name__}.") from None
    if attention.startswith("flash_attention") and (use_cpu or not has_accelerator()):
        raise UsageError(f"--attention {attention} needs a GPU ({'--use_cpu given' if use_cpu else 'none found'}); "
                         f"use sdpa or eager.")
    probe = object.__new__(model_class)  # HF's check reads only class attributes and .config
    probe.__dict__["config"] = config
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe._check_and_adjust_attn_implementation(attention, is_init_check=True)
    except (ValueError, ImportError) as err:
        first = str(err).split(". ")[0].rstrip(".")
        raise UsageError(f"--attention {attention} cannot be used with {model_class.__name__} here: {first}.") from None


def recipe_applies(cond_args: CondInitArguments, config) -> bool:
    """Whether a new model of ``config`` gets hf_condinit's recipe (``condinit=``, recorded in ``config.condinit``):
    True when hf_condinit has an attention layout for its type. False when it has none and no flag of
    :meth:`CondInitArguments.plugin_flags` was given: the script then builds the model as transformers does (no
    ``condinit=``, transformers' attention), so every model type HF's example scripts train (Mamba, RWKV, FNet, ...:
    docs/coverage.md) trains the same way. Raises a :class:`UsageError` naming the flags and the reason when they
    were given on such a type. Builds at most the miniatures of the layout proof (cached per type)."""
    from hf_condinit.layouts import LayoutError, get_layout

    try:
        get_layout(config)
    except LayoutError as err:
        flags = cond_args.plugin_flags()
        if not flags:
            return False
        reason = " ".join(str(err).split()).rstrip(".")
        raise UsageError(f"{', '.join(flags)}: {reason}; without {'it' if len(flags) == 1 else 'them'} "
                         f"{getattr(config, 'model_type', 'the model')} trains as transformers builds it.") from None
    return True


def check_loaded_model_flags(cond_args: "CondInitArguments", argv: list[str] | None, model_name_or_path: str | None) -> None:
    """A loaded model's weights are never re-initialised: ``--init`` and the init options (``--value_init``,
    ``--qk_gain``, ``--mimetic_*``, ``--condinit_seed``, ``--spectral_*``) given on the command line ``argv``
    (``sys.argv[1:]`` when ``None``) are refused with ``--model_name_or_path``."""
    if not model_name_or_path:
        return
    names = ("init", "condinit_seed", *CondInitArguments.OPTION_FIELDS)
    refused = sorted(flags_given(sys.argv[1:] if argv is None else list(argv), names))
    if refused:
        flags = ", ".join("--" + n for n in refused)
        raise UsageError(f"{flags} cannot be used with --model_name_or_path {model_name_or_path} (loaded weights are "
                         f"never re-initialised); drop {'it' if len(refused) == 1 else 'them'} or train from scratch.")
