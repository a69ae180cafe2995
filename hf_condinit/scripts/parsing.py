"""Parsing of the scripts' flags: :func:`parse_and_set_up` (every script's first call) and the pieces under it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from .arguments import MODEL_DEFAULT, SCRIPT_DEFAULTS, CondInitArguments
from .deepspeed_checks import check_deepspeed_file, validate_deepspeed_config
from ..names import did_you_mean
from ..errors import UsageError, user_errors
from .flag_checks import check_model_paths, check_numeric_flags, check_written_folders
from .fsdp_compat import set_up_fsdp
from .launch import report_launch
from .logs import setup_logging
from .machine import machine_defaults

logger = logging.getLogger(__name__)


#: A flag given without its strategy turns the strategy on (the script defaults may have switched it off).
_IMPLIED_STRATEGY = {"save_steps": ("save_strategy", "steps"), "eval_steps": ("eval_strategy", "steps")}


def _flag_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name X`` / ``--name=X`` on the command line (the last one), else ``None``."""
    value = None
    for i, arg in enumerate(argv):
        for spelling in {f"--{name}", f"--{name.replace('_', '-')}"}:
            if arg == spelling and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(spelling + "="):
                value = arg.split("=", 1)[1]
    return value


#: The run modes of ``TrainingArguments``, in the order the scripts run them.
RUN_MODES = ("do_train", "do_eval", "do_predict")


def _raise_usage_error(message: str):
    """``ArgumentParser.error`` of the scripts' parsers: argparse's own errors (a value it cannot convert, a flag
    without its value, a value outside ``choices``) as one-line :class:`UsageError`s instead of the full usage text.
    A value starting with ``-`` that argparse does not read as a number (``--learning_rate -1e-3``) is taken for a
    flag: the message says to attach it with ``=``."""
    message = " ".join(message.split())
    if message.endswith("expected one argument"):
        flag = message.removeprefix("argument ").split(":")[0].split("/")[0]
        message += f" (a value starting with '-' must be attached with '=': {flag}=-1e-3)"
    raise UsageError(message + "; see --help.")


def parse_script_args(parser, argv: list[str] | None, defaults: dict[str, Any] | None = None):
    """Every script's parsing: ``argv`` (flags or one ``.json`` file) into the parser's dataclasses, with
    :data:`SCRIPT_DEFAULTS`, the machine's defaults and ``defaults`` (in that order, later wins) replacing the
    dataclass defaults of the flags the user did not give. A flag implies its strategy (``--save_steps`` alone
    saves). The ``--deepspeed`` file is checked first. Every parse error, and every numeric flag out of its range
    (:func:`hf_condinit.scripts.flag_checks.check_numeric_flags`), is a :class:`UsageError`.

    Returns ``(parsed, given)``: the tuple of dataclasses and the set of field names the user gave."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser.error = _raise_usage_error
    with user_errors():
        fields = {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype)}
        given = flags_given(argv, fields)
        if len(argv) == 1 and argv[0].endswith(".json"):
            with open(argv[0], encoding="utf-8") as f:
                deepspeed_file = json.load(f).get("deepspeed")
        else:
            deepspeed_file = _flag_value(argv, "deepspeed")
        check_deepspeed_file(deepspeed_file)
        merged = {k: v for k, v in SCRIPT_DEFAULTS.items() if k in fields}
        merged.update(machine_defaults(given, deepspeed_file))
        merged.update(defaults or {})
        for flag, (strategy, value) in _IMPLIED_STRATEGY.items():
            if flag in given and strategy not in given and strategy in fields:
                merged[strategy] = value
        parsed = parse_args_with_defaults(parser, argv, {k: v for k, v in merged.items() if k not in given})
        check_numeric_flags(parsed)
    return parsed, given


def set_run_modes(training_args, given: set[str], supported: tuple[str, ...] = ("do_train", "do_eval")) -> None:
    """The run modes (``--do_train`` / ``--do_eval`` / ``--do_predict``) a script does. None given: every one of
    ``supported`` except ``do_predict`` (train and evaluate, as ``run_clm.py`` always did). Raises a
    :class:`UsageError` for a mode the script does not support, or when the flags given switch every mode off (the
    run would do nothing)."""
    unsupported = [m for m in RUN_MODES if m not in supported and getattr(training_args, m, False)]
    if unsupported:
        raise UsageError(f"--{unsupported[0]} is not supported by this script; it supports "
                         f"{', '.join('--' + m for m in supported)}.")
    if any(getattr(training_args, m, False) for m in supported):
        return
    if not given & set(RUN_MODES):
        for mode in supported:
            setattr(training_args, mode, mode != "do_predict")
        return
    raise UsageError(f"nothing to do: {', '.join('--' + m for m in supported)} are all off; pass at least one of them "
                     f"(or none: train and evaluate).")


def default_output_dir(prefix: str, cond_args: "CondInitArguments", model_name_or_path: str | None = None) -> str:
    """``runs/<prefix>-<arm>``: one folder per ``--init`` / ``--attention`` / spectral arm (or per loaded model),
    so runs that differ only in the arm never share a folder. E.g. ``runs/clm-conditioned-sdpa``,
    ``runs/mlm-default-affine_scaled-spectral10``, ``runs/glue-rte-from-mlm_conditioned-sdpa``. ``--attention
    default`` is named ``sdpa``: what transformers asks for first (a model without SDPA falls back to eager), so the
    arm keeps the folder it has with ``--attention sdpa``."""
    arm = f"from-{os.path.basename(os.path.normpath(model_name_or_path))}" if model_name_or_path else cond_args.init
    attention = "sdpa" if cond_args.attention == MODEL_DEFAULT else cond_args.attention
    parts = [prefix, arm, attention.replace("|", "-")]
    if cond_args.spectral_lambda is not None:
        parts.append(f"spectral{cond_args.spectral_lambda:g}")
    return os.path.join("runs", "-".join(parts))


def flags_given(argv: list[str], names) -> set[str]:
    """Which of ``names`` (dataclass field names) appear on the command line ``argv`` (``--name``, ``--name=x``,
    or the dashed alias); for a single ``.json`` argument, which are keys of that file."""
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(argv[0]) as f:
            keys = set(json.load(f))
        return {n for n in names if n in keys}
    given = set()
    for n in names:
        for spelling in {n, n.replace("_", "-")}:
            flag = f"--{spelling}"
            if any(a == flag or a.startswith(flag + "=") for a in argv):
                given.add(n)
    return given


def parse_args_with_defaults(parser, argv: list[str] | None, defaults: dict[str, Any]):
    """Parse ``argv`` (a list of flags, or one ``.json`` path) into the parser's dataclasses, with ``defaults``
    replacing the dataclass defaults for every flag the user did not give."""
    argv = sys.argv[1:] if argv is None else list(argv)
    fields = {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype)}
    unknown = set(defaults) - fields
    if unknown:
        raise KeyError(f"defaults for unknown fields: {sorted(unknown)}")
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(os.path.abspath(argv[0]), encoding="utf-8") as f:
            given = json.load(f)
        unknown = [k for k in given if k not in fields]
        if unknown:
            raise UsageError(f"{argv[0]}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], sorted(fields))}; "
                             f"see --help.")
        return parser.parse_dict({**defaults, **given})
    parser.set_defaults(**defaults)
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False,
                                                            return_remaining_strings=True)
    if remaining:
        raise UsageError(unknown_argument_message(parser, remaining))
    return tuple(parsed)


def unknown_argument_message(parser, remaining: list[str]) -> str:
    """The one-line error for what argparse left over: the first unknown flag with the closest known one
    (``unknown flag --learnig_rate (did you mean --learning_rate?)``), or the first stray value."""
    flags = [a for a in remaining if a.startswith("-")]
    if not flags:
        return f"unexpected argument {remaining[0]!r} (every value follows its --flag); see --help."
    flag = flags[0].split("=", 1)[0]
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    return f"unknown flag {flag}{did_you_mean(flag, known, quote='')}; see --help."


def parse_and_set_up(
    dataclass_types,
    argv: list[str] | None,
    logger_: logging.Logger | None = None,
    output_prefix: str | Callable[[tuple], str] | None = None,
    defaults: dict[str, Any] | None = None,
    run_modes: tuple[str, ...] = ("do_train", "do_eval"),
):
    """The start of every script: :func:`parse_script_args` (``argv``: ``sys.argv[1:]`` when ``None``; flags or one
    ``.json``) into ``dataclass_types`` (one of them :class:`CondInitArguments`, the last a ``TrainingArguments``),
    then: without ``--output_dir``, ``default_output_dir(output_prefix, ...)`` (``output_prefix`` may be a function
    of the parsed tuple); every folder the run writes (``--output_dir``, ``--cache_dir``) and every local model
    path it reads (``--model_name_or_path``, ``--tokenizer_name``) checked (:mod:`.flag_checks`); the run modes
    (:func:`set_run_modes`: with no ``--do_*`` flag, train and evaluate; ``run_modes``: the ones the script
    supports); the DeepSpeed config checked against the flags; FSDP2 refused on torch < 2.6 and accelerate < 1.16
    patched (:func:`hf_condinit.scripts.fsdp_compat.set_up_fsdp`); logging set up;
    the launch reported (:func:`hf_condinit.scripts.launch.report_launch`: launcher, world size, device, one line);
    the training arguments logged at info level. Raises :class:`UsageError` for every user error found.

    Returns ``(dataclasses, attention_given)``: the parsed tuple, and whether ``--attention`` was given explicitly
    (a loaded checkpoint otherwise keeps the attention implementation it was saved with)."""
    from transformers import HfArgumentParser

    parsed, given = parse_script_args(HfArgumentParser(dataclass_types), argv, defaults)
    cond_args = next(a for a in parsed if isinstance(a, CondInitArguments))
    training_args = parsed[-1]
    if output_prefix is not None and "output_dir" not in given:
        prefix = output_prefix(parsed) if callable(output_prefix) else output_prefix
        model = next((getattr(a, "model_name_or_path") for a in parsed if hasattr(a, "model_name_or_path")), None)
        training_args.output_dir = default_output_dir(prefix, cond_args, model)
    check_written_folders(parsed)
    check_model_paths(parsed)
    set_run_modes(training_args, given, run_modes)
    if training_args.deepspeed:
        validate_deepspeed_config(training_args, cond_args)
    set_up_fsdp(training_args)
    setup_logging(training_args, logger_)
    report_launch(training_args)
    (logger_ or logger).info(f"Training/evaluation parameters {training_args}")
    return parsed, "attention" in given
