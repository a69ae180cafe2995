"""Pieces shared by the example scripts (``run_clm.py``, ``run_mlm.py``, ``run_glue.py``).

- :class:`CondInitArguments`: the ``--init`` / ``--attention`` / method-option flags, mapping 1:1 to
  :class:`hf_condinit.config.CondInitConfig` (DESIGN.md §7.3.7); :meth:`CondInitArguments.condinit_dict` builds the
  ``condinit=`` dict for ``from_config`` (seeded from ``--seed`` unless ``--condinit_seed`` is given).
- :func:`parse_args_with_defaults`: ``HfArgumentParser`` parsing (command line or a single ``.json`` file) where a
  set of defaults replaces the dataclass defaults *only for flags the user did not give* (see below).
- :data:`LM_TRAINING_DEFAULTS`: the LM settings of METHODS.md §7.
- :func:`setup_logging`: the HF-example logging set-up; :func:`find_last_checkpoint`: the checkpoint to resume from
  when ``--output_dir`` already holds one.
- :func:`parse_config_overrides`: ``--config_overrides "key=value,..."`` cast with the types of a reference config.
- :func:`parse_and_set_up`: the start of ``run_mlm.py`` / ``run_glue.py`` (parse, check DeepSpeed, set up logging).
- :func:`log_deepspeed`, :func:`train_and_save`, :func:`evaluate_with_perplexity`: the train / save / evaluate tail
  that the three scripts share.
- :func:`validate_deepspeed_config`: contradictions between a DeepSpeed config and the flags, raised before any
  data or model work (the Trainer would only raise them when training starts).
- :class:`CondInitTrainer`: a ``Trainer`` whose weight-decay rule also exempts ``condinit_`` holder parameters.
- :func:`make_condition_number_callback`: wires ``--log_condition_number_every N`` to
  ``hf_condinit.callbacks.ConditionNumberCallback``.

What every script calls (one call each; see README "Writing a new script"):

- :class:`UsageError` / :func:`user_errors` / :func:`run_main`: a user error (bad flag, missing or bad file,
  impossible combination) prints one line ``<script>: error: ...`` on stderr and exits 2, as argparse does; a real
  bug keeps its traceback. ``with user_errors(output_dir):`` turns the ``ValueError`` / ``OSError`` raised by the
  checks inside it into a :class:`UsageError` and removes ``output_dir`` if the block created it.
- :func:`parse_and_set_up` (or :func:`parse_script_args` for a script with its own defaults): parse, apply
  :data:`SCRIPT_DEFAULTS` and the machine's defaults (no accelerator: no pinned memory; ``--deepspeed`` without an
  accelerator: ``--use_cpu``), make a flag imply its strategy (``--save_steps`` → ``--save_strategy steps``),
  check the DeepSpeed file early, give each arm its own ``--output_dir`` when none is given
  (:func:`default_output_dir`), set up quiet logging (:func:`setup_logging`).
- :func:`find_last_checkpoint`: the resume-or-stop policy for an ``--output_dir`` that already holds a run.
- :func:`check_attention_usable`: ``--attention`` against this machine and the model class, before any work.
- :func:`check_loaded_model_flags`: ``--init`` and the init options are refused for a loaded model.
- :class:`CondInitTrainer` adds :class:`hf_condinit.callbacks.NonFiniteLossCallback` (a non-finite loss stops the
  run with an error) and does not warn about tied weights missing from a checkpoint.

How "not set by the user" is detected: the defaults are installed as *parser* defaults with
``HfArgumentParser.set_defaults`` (argparse's own mechanism), so an explicit flag always wins and an absent flag
takes the LM default; for a ``.json`` argument file, the defaults are merged under the file's keys before
``parse_dict``. No value is compared against HF's own defaults (``--weight_decay 0.0`` given explicitly stays 0.0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .callbacks import DEFAULT_PROBE_LENGTH, DEFAULT_PROBE_SIZE

logger = logging.getLogger(__name__)

__all__ = [
    "UsageError",
    "user_errors",
    "run_main",
    "SCRIPT_DEFAULTS",
    "parse_script_args",
    "default_output_dir",
    "has_accelerator",
    "check_attention_usable",
    "check_loaded_model_flags",
    "CondInitArguments",
    "LM_TRAINING_DEFAULTS",
    "parse_args_with_defaults",
    "flags_given",
    "validate_deepspeed_config",
    "CondInitTrainer",
    "no_decay_parameter_names",
    "make_condition_number_callback",
    "make_throughput_callback",
    "known_attention_names",
    "known_init_names",
    "setup_logging",
    "select_splits",
    "with_causal_loss_type",
    "parse_config_overrides",
    "resolve_model_config",
    "find_last_checkpoint",
    "log_deepspeed",
    "train_and_save",
    "evaluate_with_perplexity",
    "parse_and_set_up",
]

# METHODS.md §7 "LM settings used by the project unless a user overrides them". bf16 is not forced: it depends on
# the hardware (pass --bf16 on GPUs that have it; the DeepSpeed configs use "auto").
LM_TRAINING_DEFAULTS: dict[str, Any] = {
    "optim": "adamw_torch",
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "weight_decay": 0.1,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,  # < 1: a fraction of the total steps (transformers 5 semantics)
    "max_grad_norm": 1.0,
    "learning_rate": 3e-4,
    "logging_steps": 50,
}

# ---------------------------------------------------------------------------------------------- user errors


class UsageError(ValueError):
    """A user error: a bad flag value, a missing or unreadable file, an impossible combination.

    :func:`run_main` prints it as one line and exits 2 (argparse's convention); any other exception is a bug and
    keeps its traceback. A ``ValueError`` subclass, so ``pytest.raises(ValueError)`` and callers catching
    ``ValueError`` keep working."""


@contextlib.contextmanager
def user_errors(output_dir: str | None = None):
    """Treat the ``ValueError`` / ``OSError`` raised inside the block as user errors (:class:`UsageError`).

    Wrap the checks a script makes before any model work (flags, files, data loading). With ``output_dir``: when the
    block raises a user error and the directory did not exist on entry, it is removed, so a failed start leaves
    nothing behind (e.g. a tokenizer saved before the data turned out too short)."""
    existed = output_dir is None or os.path.exists(output_dir)
    try:
        yield
    except Exception as err:
        if not isinstance(err, (UsageError, ValueError, OSError)):
            raise
        if not existed and os.path.isdir(output_dir):
            shutil.rmtree(output_dir, ignore_errors=True)
        if isinstance(err, UsageError):
            raise
        raise UsageError(str(err)) from err


def run_main(main: Callable, argv: list[str] | None = None, prog: str | None = None):
    """Run a script's ``main(argv)``: a :class:`UsageError` becomes ``<prog>: error: <message>`` (one line) on stderr
    and exit code 2; a :class:`hf_condinit.callbacks.NonFiniteLossError` one line and exit code 1; everything else
    propagates with its traceback. Use as ``if __name__ == "__main__": run_main(main)``."""
    from .callbacks import NonFiniteLossError

    prog = prog or os.path.basename(sys.argv[0])
    try:
        return main(argv)
    except UsageError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(1)


# ---------------------------------------------------------------------------------------------- machine and flags

#: Defaults of every script (explicit flags win): a non-finite loss must reach the logs, where
#: ``NonFiniteLossCallback`` stops the run (HF's default filter would replace it by the running mean).
SCRIPT_DEFAULTS: dict[str, Any] = {"logging_nan_inf_filter": False}

#: A flag given without its strategy turns the strategy on (the script defaults may have switched it off).
_IMPLIED_STRATEGY = {"save_steps": ("save_strategy", "steps"), "eval_steps": ("eval_strategy", "steps")}


def has_accelerator() -> bool:
    """Whether torch sees a GPU-like device (CUDA/ROCm, XPU, MPS, NPU) on this machine."""
    import torch

    if torch.cuda.is_available():
        return True
    for name in ("xpu", "mps", "npu"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return True
    return False


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


def check_deepspeed_file(path) -> None:
    """``--deepspeed FILE`` must be a readable JSON object; checked before ``TrainingArguments`` imports DeepSpeed."""
    if path is None or isinstance(path, dict):
        return
    if not os.path.isfile(path):
        raise UsageError(f"--deepspeed {path!r} is not a file; pass a DeepSpeed JSON config such as ds_configs/zero2.json.")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"--deepspeed {path!r} is not valid JSON ({err}); fix the file or use one of ds_configs/.") from None
    if not isinstance(config, dict):
        raise UsageError(f"--deepspeed {path!r} must hold a JSON object, not {type(config).__name__}.")


def _machine_defaults(given: set[str], deepspeed_file) -> dict[str, Any]:
    """Defaults that depend on this machine: no accelerator → no pinned memory (torch warns otherwise) and, with
    ``--deepspeed``, the CPU path (``--use_cpu``) instead of DeepSpeed failing on a batch-size mismatch."""
    out: dict[str, Any] = {}
    accelerator = has_accelerator()
    if not accelerator or "use_cpu" in given:
        out["dataloader_pin_memory"] = False
    if deepspeed_file and not accelerator and "use_cpu" not in given:
        out["use_cpu"] = True
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed then skips its accelerator probing and warning
        if os.environ.get("RANK", "0") == "0":  # once per run, not once per process
            print("No GPU found: running DeepSpeed on the CPU over gloo (as with --use_cpu).", file=sys.stderr)
    return out


def parse_script_args(parser, argv: list[str] | None, defaults: dict[str, Any] | None = None):
    """Every script's parsing: ``argv`` (flags or one ``.json`` file) into the parser's dataclasses, with
    :data:`SCRIPT_DEFAULTS`, the machine's defaults and ``defaults`` (in that order, later wins) replacing the
    dataclass defaults of the flags the user did not give. A flag implies its strategy (``--save_steps`` alone
    saves). The ``--deepspeed`` file is checked first. Every parse error is a :class:`UsageError`.

    Returns ``(parsed, given)``: the tuple of dataclasses and the set of field names the user gave."""
    argv = sys.argv[1:] if argv is None else list(argv)
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
        merged.update(_machine_defaults(given, deepspeed_file))
        merged.update(defaults or {})
        for flag, (strategy, value) in _IMPLIED_STRATEGY.items():
            if flag in given and strategy not in given and strategy in fields:
                merged[strategy] = value
        parsed = parse_args_with_defaults(parser, argv, {k: v for k, v in merged.items() if k not in given})
    return parsed, given


def default_output_dir(prefix: str, cond_args: "CondInitArguments", model_name_or_path: str | None = None) -> str:
    """``runs/<prefix>-<arm>``: one folder per ``--init`` / ``--attention`` / spectral arm (or per loaded model),
    so runs that differ only in the arm never share a folder. E.g. ``runs/clm-conditioned-sdpa``,
    ``runs/mlm-default-affine_scaled-spectral10``, ``runs/glue-rte-from-mlm_conditioned-sdpa``."""
    arm = f"from-{os.path.basename(os.path.normpath(model_name_or_path))}" if model_name_or_path else cond_args.init
    parts = [prefix, arm, cond_args.attention.replace("|", "-")]
    if cond_args.spectral_lambda is not None:
        parts.append(f"spectral{cond_args.spectral_lambda:g}")
    return os.path.join("runs", "-".join(parts))


def check_attention_usable(attention: str, model_class, config, use_cpu: bool = False) -> None:
    """Raise a :class:`UsageError` when ``--attention`` cannot run with ``model_class`` (built from ``config``) on this
    machine: HF's own check (flash-attention package, the model's support for flash / flex attention), plus a GPU
    for ``flash_attention_*``, and no ``paged|...`` (continuous-batching generation only) for training.
    ``model_class``: a concrete class, or an ``AutoModelFor...`` class resolved through its mapping. Builds nothing."""
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


def check_loaded_model_flags(cond_args: "CondInitArguments", argv: list[str] | None, model_name_or_path: str | None) -> None:
    """A loaded model's weights are never re-initialised: ``--init`` and the init options (``--value_init``,
    ``--qk_gain``, ``--mimetic_*``, ``--condinit_seed``, ``--spectral_*``) given on the command line ``argv``
    (``sys.argv[1:]`` when ``None``) are refused with ``--model_name_or_path``."""
    if not model_name_or_path:
        return
    names = ("init", "condinit_seed", *CondInitArguments._OPTION_FIELDS)
    refused = sorted(flags_given(sys.argv[1:] if argv is None else list(argv), names))
    if refused:
        flags = ", ".join("--" + n for n in refused)
        raise UsageError(f"{flags} cannot be used with --model_name_or_path {model_name_or_path} (loaded weights are "
                         f"never re-initialised); drop {'it' if len(refused) == 1 else 'them'} or train from scratch.")


_BUILTIN_ATTENTION = ("sdpa", "eager")
_FALLBACK_VARIANTS = ("affine_scaled", "attention_sink", "preconditioned")


def known_init_names() -> list[str]:
    """Init scheme names: the registry's (``hf_condinit.registry.INIT_SCHEMES``) or the built-in three."""
    names: list[str] = []
    try:
        import hf_condinit  # noqa: F401  (registers the schemes)
        from hf_condinit.config import INIT_METHODS
        from hf_condinit.registry import INIT_SCHEMES

        names = list(dict.fromkeys([*INIT_METHODS, *INIT_SCHEMES]))
    except ImportError:  # pragma: no cover - package partially installed
        names = ["default", "mimetic", "conditioned"]
    return names


def known_attention_names() -> list[str]:
    """Attention implementations accepted by ``--attention``: sdpa, eager, hf_condinit's variants and anything
    registered with HF's ``AttentionInterface`` (flash_attention_2, flex_attention, ...)."""
    names = list(_BUILTIN_ATTENTION)
    try:
        import hf_condinit  # noqa: F401  (registers the variants)
        from hf_condinit.registry import ATTENTION_VARIANTS

        names += list(ATTENTION_VARIANTS)
    except ImportError:  # pragma: no cover
        pass
    try:
        from transformers import AttentionInterface

        names += list(AttentionInterface._global_mapping)
    except Exception:  # pragma: no cover - private attribute moved
        pass
    return list(dict.fromkeys(names))


@dataclass
class CondInitArguments:
    """Flags of the attention initialisation and variants; each option maps 1:1 to a ``CondInitConfig`` field.

    Options left at ``None`` are not passed, so ``CondInitConfig``'s own defaults apply (METHODS.md §1-5).
    """

    init: str = field(
        default="default",
        metadata={"help": "Attention init scheme: default (the model's own), mimetic, or conditioned (alias: "
                          "orthogonal)."},
    )
    attention: str = field(
        default="sdpa",
        metadata={
            "help": "Attention implementation: sdpa, eager, or an hf_condinit variant (affine_scaled, "
            "attention_sink, preconditioned); HF's flash_attention_2/3/4 and flex_attention where this machine and "
            "model support them (checked before any work)."
        },
    )
    condinit_seed: int | None = field(
        default=None, metadata={"help": "Seed of the init scheme's generators (default: --seed)."}
    )
    value_init: str | None = field(default=None, metadata={"help": "conditioned: 'block' (default) or 'per_head'."})
    qk_gain: float | None = field(default=None, metadata={"help": "conditioned: scale of the Q/K blocks (default 1)."})
    v_gain: float | None = field(default=None, metadata={"help": "conditioned: scale of the V identity (default 1)."})
    mimetic_alpha1: float | None = field(default=None, metadata={"help": "mimetic α1 (default 0.7)."})
    mimetic_beta1: float | None = field(default=None, metadata={"help": "mimetic β1 (default 0.7)."})
    mimetic_alpha2: float | None = field(default=None, metadata={"help": "mimetic α2 (default 0.4)."})
    mimetic_beta2: float | None = field(default=None, metadata={"help": "mimetic β2 (default 0.4)."})
    mimetic_vo_sign: int | None = field(default=None, metadata={"help": "mimetic sign of the VO identity (-1|+1)."})
    mimetic_dist: str | None = field(default=None, metadata={"help": "mimetic Z distribution: uniform|normal."})
    spectral_lambda: float | None = field(
        default=None, metadata={"help": "Enable spectral conditioning with this λ (paper's best: 10)."}
    )
    spectral_mode: str | None = field(default=None, metadata={"help": "spectral: identity (default) or svd."})
    affine_rho: float | None = field(default=None, metadata={"help": "affine_scaled: EMA factor of α_ma (0.9)."})
    affine_bias_length: str | None = field(default=None, metadata={"help": "affine_scaled: visible|full."})
    precond_eps: float | None = field(default=None, metadata={"help": "preconditioned: ε (1e-6)."})
    precond_scale: str | None = field(default=None, metadata={"help": "preconditioned: none|sqrt_d."})
    log_condition_number_every: int = field(
        default=0,
        metadata={"help": "Log the attention-Jacobian κ every N optimizer steps (and at step 0); 0 disables. Each "
                          "measurement costs many training steps (benchmarks/throughput.py): 500 or more."},
    )
    condition_number_probe_size: int = field(
        default=DEFAULT_PROBE_SIZE, metadata={"help": "Sequences in the κ probe batch (taken from the evaluation data)."}
    )
    condition_number_probe_length: int = field(
        default=DEFAULT_PROBE_LENGTH, metadata={"help": "Tokens per probe sequence for the κ diagnostic."}
    )
    log_throughput: bool = field(
        default=False,
        metadata={"help": "Add tokens/s, MFU (known GPUs) and peak accelerator memory to every training log line "
                          "(hf_condinit.callbacks.ThroughputCallback; keys throughput/...)."},
    )

    # Fields that are CondInitConfig options (same names).
    _OPTION_FIELDS = (
        "value_init", "qk_gain", "v_gain", "mimetic_alpha1", "mimetic_beta1", "mimetic_alpha2", "mimetic_beta2",
        "mimetic_vo_sign", "mimetic_dist", "spectral_lambda", "spectral_mode", "affine_rho", "affine_bias_length",
        "precond_eps", "precond_scale",
    )  # fmt: skip

    def __post_init__(self):
        if self.log_condition_number_every < 0:
            raise ValueError(f"--log_condition_number_every must be >= 0, got {self.log_condition_number_every}")
        self.validate_names()

    def validate_names(self) -> None:
        """Raise a :class:`UsageError` for an unknown ``--init`` or ``--attention`` name, listing the accepted ones
        (aliases included: ``orthogonal`` = ``conditioned``)."""
        from hf_condinit.config import INIT_METHOD_ALIASES

        inits = known_init_names()
        if self.init not in inits and self.init not in INIT_METHOD_ALIASES:
            aliases = "".join(f", {a} (alias of {b})" for a, b in INIT_METHOD_ALIASES.items())
            raise UsageError(f"unknown --init {self.init!r}; choose one of: {', '.join(inits)}{aliases}")
        atts = known_attention_names()
        if self.attention not in atts:
            raise UsageError(f"unknown --attention {self.attention!r}; choose one of: {', '.join(atts)}")

    def condinit_dict(self, seed: int) -> dict[str, Any]:
        """The ``condinit=`` dict for ``from_config``: method, seed, and every option the user set.

        Validated through ``CondInitConfig`` so a bad option (e.g. ``--value_init diagonal``) fails here, and an
        option the method or ``--attention`` never reads (``--init mimetic --value_init per_head``) is refused.
        """
        out: dict[str, Any] = {"method": self.init, "seed": self.condinit_seed if self.condinit_seed is not None else seed}
        for name in self._OPTION_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        from hf_condinit.config import CondInitConfig, check_options_apply

        with user_errors():
            CondInitConfig.from_dict(dict(out))  # raises with the accepted values
            check_options_apply(out, attention=self.attention)
        return out


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
        return parser.parse_dict({**defaults, **given})
    parser.set_defaults(**defaults)
    return parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)


def validate_deepspeed_config(training_args, cond_args: CondInitArguments | None = None) -> None:
    """Check a DeepSpeed config against the flags before any work is done.

    Raises ``ValueError`` for: values that contradict ``TrainingArguments`` (batch sizes, gradient accumulation,
    clipping, optimizer/scheduler hyper-parameters, bf16/fp16: HF records these in
    ``hf_deepspeed_config.mismatches`` while parsing but only raises at the first ``train()`` step), a missing or
    unknown ZeRO stage, fp16 and bf16 both enabled, and a DeepSpeed ``optimizer`` block together with hf_condinit
    holder parameters (that path hands DeepSpeed one parameter group, so weight decay would hit the holders and
    the biases/norms; remove the block to use the Trainer's optimizer with the no-decay groups).
    """
    if not getattr(training_args, "deepspeed", None):
        return
    hf_ds = getattr(training_args, "hf_deepspeed_config", None)
    if hf_ds is None:  # pragma: no cover
        return
    problems = list(getattr(hf_ds, "mismatches", []))
    cfg = hf_ds.config
    zero = cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        problems.append(f"- ds zero_optimization.stage={stage!r} is not one of 0, 1, 2, 3")
    if hf_ds.is_true("fp16.enabled") and hf_ds.is_true("bf16.enabled"):
        problems.append("- ds fp16.enabled and bf16.enabled are both true")
    if (hf_ds.is_true("fp16.enabled") or hf_ds.is_true("bf16.enabled")) and getattr(training_args, "use_cpu", False):
        if hf_ds.is_true("fp16.enabled"):
            problems.append("- ds fp16.enabled=true but --use_cpu: DeepSpeed has no fp16 on CPU; use bf16 or fp32")
    if cond_args is not None and "optimizer" in cfg:
        uses_holders = cond_args.attention not in _BUILTIN_ATTENTION or cond_args.spectral_lambda is not None
        if uses_holders:
            problems.append(
                f"- ds config has an 'optimizer' block, which gives DeepSpeed a single parameter group, so weight "
                f"decay would apply to the condinit_ holder parameters of --attention {cond_args.attention}; "
                f"remove the block (the Trainer then builds AdamW with the no-decay groups)"
            )
        else:
            logger.warning(
                "The DeepSpeed config has an 'optimizer' block: DeepSpeed will decay every parameter (biases and "
                "norms included) and may JIT-compile its optimizer. Remove the block to use the Trainer's AdamW."
            )
    if problems:
        raise UsageError(
            f"The DeepSpeed config {training_args.deepspeed!r} contradicts the command-line flags: "
            + "; ".join(p.removeprefix("- ") for p in problems)
            + ". Set those DeepSpeed values to \"auto\" (the Trainer fills them from the flags) or change the flags."
        )


def no_decay_parameter_names(model) -> set[str]:
    """Names of the parameters kept out of weight decay: every ``condinit_`` holder parameter, and every
    parameter with fewer than 2 dimensions (biases, LayerNorm/RMSNorm weights, sink logits): nanoGPT's rule.
    Under ZeRO-3 the real shape is read from ``ds_shape`` (partitioned parameters are flat).

    Adds the names from ``hf_condinit.attention.no_decay_parameter_names`` when that helper exists."""
    names = set()
    for n, p in model.named_parameters():
        shape = getattr(p, "ds_shape", None)
        ndim = len(shape) if shape is not None else p.ndim
        if ndim < 2 or "condinit_" in n:
            names.add(n)
    try:
        from hf_condinit.attention import no_decay_parameter_names as helper
    except ImportError:
        helper = None
    if helper is not None:
        names |= set(helper(model))
    return names


try:
    from transformers import Trainer as _Trainer
except ImportError:  # pragma: no cover
    _Trainer = object


class CondInitTrainer(_Trainer):
    """``Trainer`` whose weight-decay groups exclude ``condinit_`` holders, biases and norms
    (:func:`no_decay_parameter_names`), which stops a run whose loss becomes non-finite
    (:class:`hf_condinit.callbacks.NonFiniteLossCallback`, added to every instance) and which does not warn about
    tied weights (``lm_head.weight``) that a checkpoint leaves out by design. Otherwise the stock Trainer."""

    def __init__(self, *args, callbacks=None, **kwargs):
        from .callbacks import NonFiniteLossCallback

        super().__init__(*args, callbacks=[*(callbacks or []), NonFiniteLossCallback()], **kwargs)

    def get_decay_parameter_names(self, model) -> list[str]:
        skip = no_decay_parameter_names(model)
        return [n for n, _ in model.named_parameters() if n not in skip]

    def _issue_warnings_after_load(self, load_result) -> None:
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        if tied and set(load_result.missing_keys) <= tied:
            self.model.tie_weights()
            load_result = load_result._replace(missing_keys=[])
        super()._issue_warnings_after_load(load_result)


def make_condition_number_callback(cond_args: CondInitArguments, dataset, trainer=None, probe_inputs=None):
    """``hf_condinit.callbacks.ConditionNumberCallback`` for ``--log_condition_number_every N`` (``None`` when 0).

    The probe (``--condition_number_probe_size`` sequences × ``--condition_number_probe_length`` tokens) is built by
    the callback from the first examples of ``dataset`` (real tokens, distinct first tokens), unless ``probe_inputs``
    gives it (e.g. a (B, C, H, W) image batch for a vision model; ``dataset`` is then unused); κ goes through
    ``trainer.log`` (keys ``kappa/...``) and to ``<output_dir>/condition_number.jsonl``.
    """
    if not cond_args.log_condition_number_every:
        return None
    from hf_condinit.callbacks import ConditionNumberCallback

    callback = ConditionNumberCallback(
        probe_inputs,
        dataset=None if probe_inputs is not None else dataset,
        probe_size=cond_args.condition_number_probe_size,
        probe_length=cond_args.condition_number_probe_length,
        every_n_steps=cond_args.log_condition_number_every,
    )
    if trainer is not None:
        trainer.add_callback(callback)
        callback.bind(trainer)
    return callback


def make_throughput_callback(cond_args: CondInitArguments, trainer):
    """``hf_condinit.callbacks.ThroughputCallback`` for ``--log_throughput`` (``None`` when off), added to ``trainer``
    first so that the ``report_to`` integrations see its keys."""
    if not cond_args.log_throughput:
        return None
    from hf_condinit.callbacks import add_throughput_callback

    return add_throughput_callback(trainer)


def setup_logging(training_args, logger_: logging.Logger | None = None) -> None:
    """HF-example logging: one stdout handler, per-process level (main process: info, others: warning), and quiet:
    torch's and DeepSpeed's warnings that say nothing to act on are silenced (:func:`_silence_noise`)."""
    import datasets
    import transformers

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    (logger_ or logger).setLevel(log_level)
    datasets.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    transformers.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    if training_args.disable_tqdm:  # no progress bars asked for: none from the data pipeline or saving either
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    _silence_noise()


def _silence_noise() -> None:
    """Warnings runs printed although nothing was wrong: pinned memory without an accelerator (the scripts also
    default ``--dataloader_pin_memory`` off there), DeepSpeed's deprecated-collective warnings, and DeepSpeed's
    import in runs without ``--deepspeed``."""
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
    # DeepSpeed's own collectives call torch.distributed functions torch has deprecated: nothing a user can change
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    _defer_deepspeed_import()


def _defer_deepspeed_import() -> None:
    """Do not import DeepSpeed in a run without ``--deepspeed`` (seconds of start-up and its "Setting accelerator"
    lines): accelerate's ``unwrap_model`` imports it whenever it is installed, only to test whether the model is a
    ``DeepSpeedEngine``. A model can only be one once DeepSpeed is imported (``--deepspeed`` imports it while
    parsing), so that test is asked first."""
    try:
        import accelerate.utils.other as accelerate_other
    except ImportError:  # pragma: no cover
        return
    available = accelerate_other.is_deepspeed_available
    if getattr(available, "deferred", False):
        return

    def imported_and_available() -> bool:
        return "deepspeed" in sys.modules and available()

    imported_and_available.deferred = True
    accelerate_other.is_deepspeed_available = imported_and_available


def with_causal_loss_type(model):
    """Set ``model.loss_type = "ForCausalLM"`` where transformers leaves it ``None`` (5.24 derives it from the class
    name, and ``GPT2LMHeadModel`` has no ``ForCausalLM`` in it). Without it the ``Trainer`` counts all N labels of a
    row in ``num_items_in_batch`` instead of the N − 1 shifted targets, so its training and evaluation losses are
    (N − 1)/N times the mean next-token cross-entropy (1.6 % low at N = 64)."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model


def select_splits(lm_datasets, training_args, max_train_samples: int | None = None, max_eval_samples: int | None = None):
    """``(train_dataset, eval_dataset)`` for ``--do_train`` / ``--do_eval`` (``None`` when not requested), truncated to
    ``--max_train_samples`` / ``--max_eval_samples``. Raises ``ValueError`` when evaluation has no data."""
    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = lm_datasets["train"]
        if max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), max_train_samples)))
    if training_args.do_eval:
        if "validation" not in lm_datasets:
            raise ValueError("--do_eval needs validation data: pass --validation_file or --validation_split_percentage > 0")
        eval_dataset = lm_datasets["validation"]
        if max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), max_eval_samples)))
        if len(eval_dataset) == 0:
            raise ValueError("the validation set has no full block; give more validation text or a smaller block size")
    return train_dataset, eval_dataset


_TRUE, _FALSE = ("true", "1"), ("false", "0")


def parse_config_overrides(text: str | None, reference_config) -> dict[str, Any]:
    """Parse ``--config_overrides`` (``"key=value,key=value"``) into a dict of typed values.

    Each value is cast with the type of the same attribute of ``reference_config`` (as
    ``PreTrainedConfig.update_from_string`` does): ``bool`` accepts ``true/false/1/0`` (any case), ``int`` and
    ``float`` are converted, an attribute whose reference value is ``None`` takes an int, else a float, else the
    string, and any other type keeps the string. Empty items (``"a=1,,b=2"``) are skipped; a later key wins.

    Raises ``ValueError`` naming ``--config_overrides`` for an item without ``=``, a key that is not an attribute of
    ``reference_config``, a value that is not a boolean / int / float where one is needed.
    """
    overrides: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--config_overrides: {item!r} is not of the form key=value.")
        key, value = (s.strip() for s in item.split("=", 1))
        if not hasattr(reference_config, key):
            raise ValueError(f"--config_overrides: {type(reference_config).__name__} has no attribute {key!r}.")
        old = getattr(reference_config, key)
        if isinstance(old, bool):
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError(f"--config_overrides: {key}={value!r} is not a boolean (true/false/1/0).")
            overrides[key] = value.lower() in _TRUE
        elif isinstance(old, (int, float)):
            try:
                overrides[key] = type(old)(value)
            except ValueError:
                raise ValueError(f"--config_overrides: {key}={value!r} is not {type(old).__name__}.") from None
        elif old is None:
            for cast in (int, float, str):
                try:
                    overrides[key] = cast(value)
                    break
                except ValueError:
                    continue
        else:
            overrides[key] = value
    return overrides


def resolve_model_config(name: str, config_dir: str, config_overrides: str | None = None,
                         cache_dir: str | None = None, token: str | None = None):
    """The config of a new model from ``--model_config`` (``run_clm.py``, ``run_image_classification.py``), with
    ``--config_overrides`` applied (:func:`parse_config_overrides`). Returns ``(config, where)``.

    ``name``: a config in ``config_dir`` (with or without ``.json``), a path (a file, or a directory holding
    ``config.json``), else a hub id (cache or network). Raises ``ValueError`` listing the configs of ``config_dir``
    when it is none of these, or for a bad ``config_overrides``."""
    from transformers import AutoConfig

    candidates = [name]
    if not os.path.isabs(name):
        candidates += [os.path.join(config_dir, name), os.path.join(config_dir, name + ".json")]
    path = next((p for p in candidates if os.path.isfile(p) or os.path.isfile(os.path.join(p, "config.json"))), None)
    if path is not None:
        config = AutoConfig.from_pretrained(path)
    else:
        local = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".json")) if os.path.isdir(config_dir) else []
        try:
            config, path = AutoConfig.from_pretrained(name, cache_dir=cache_dir, token=token), name
        except (OSError, ValueError) as err:
            raise ValueError(
                f"--model_config {name!r} is not a config in {config_dir} ({', '.join(local)}), not a local path, and "
                f"could not be loaded from the hub ({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from err
    if config_overrides:
        logger.info(f"Overriding config: {config_overrides}")
        config.update(parse_config_overrides(config_overrides, config))
    return config, path


def find_last_checkpoint(training_args, logger_: logging.Logger | None = None) -> str | None:
    """The checkpoint to resume from, by the policy that a rerun never destroys an earlier run. Call it before any
    data or model work; pass its result to ``trainer.train(resume_from_checkpoint=...)``.

    - ``--resume_from_checkpoint DIR`` (or ``last``/``latest``/``true``: the newest ``checkpoint-*`` in
      ``--output_dir``): that checkpoint; a missing one is a :class:`UsageError`.
    - not training, or ``--output_dir`` missing or empty: ``None`` (a fresh run).
    - ``--output_dir`` holds ``checkpoint-*`` of an unfinished run (no ``train_results.json``): the newest one;
      the run **resumes**, and says so in one line (with how to start over instead).
    - ``--output_dir`` holds a finished run, or files without a checkpoint: :class:`UsageError` naming both ways
      on (a new ``--output_dir``, or ``--resume_from_checkpoint`` to continue that run).
    """
    from transformers.trainer_utils import get_last_checkpoint

    out = training_args.output_dir
    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "latest", "true"):
        found = get_last_checkpoint(out) if os.path.isdir(out) else None
        if found is None:
            raise UsageError(f"--resume_from_checkpoint {resume}: no checkpoint-* in --output_dir {out}.")
        return found
    if resume is not None:
        if not os.path.isdir(resume):
            raise UsageError(f"--resume_from_checkpoint {resume!r} is not a directory.")
        return resume
    if not training_args.do_train or not os.path.isdir(out) or not os.listdir(out):
        return None
    last = get_last_checkpoint(out)
    if last is not None and not os.path.exists(os.path.join(out, "train_results.json")):
        (logger_ or logger).warning(
            f"--output_dir {out} holds an unfinished run: resuming from {last} (for a fresh run, pass a new "
            f"--output_dir or delete {out})."
        )
        return last
    what = "a finished run" if os.path.exists(os.path.join(out, "train_results.json")) else "files but no checkpoint"
    hint = f"--resume_from_checkpoint {last}" if last else "--resume_from_checkpoint <checkpoint>"
    raise UsageError(
        f"--output_dir {out} already holds {what}; pass a new --output_dir (or delete that one), or {hint} to "
        f"continue it."
    )


def log_deepspeed(trainer, training_args, logger_: logging.Logger | None = None) -> None:
    """Log (warning level, every rank) whether DeepSpeed is on, its ZeRO stage and the world size."""
    if training_args.deepspeed:
        stage = training_args.hf_deepspeed_config.get_value("zero_optimization.stage", 0)
        (logger_ or logger).warning(
            f"DeepSpeed enabled: {trainer.is_deepspeed_enabled}, ZeRO stage {stage}, world size {training_args.world_size}"
        )


def train_and_save(trainer, train_dataset, resume_from_checkpoint=None, block_size: int | None = None) -> dict:
    """``trainer.train`` (resuming from ``resume_from_checkpoint`` when given), then save the model (and the
    tokenizer: the checkpoint is self-contained), the ``train`` metrics and the trainer state. With ``block_size``
    (tokens per sample) the metrics gain ``train_tokens_per_second``. Returns the metrics.

    The run's report (``loss.png``, ``kappa.png``, model card ``README.md``) is written when training ends and the
    card refreshed after the script's final evaluation (``hf_condinit.callbacks.RunReportCallback``)."""
    from .callbacks import RunReportCallback

    RunReportCallback.attach(trainer)
    train_result = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.save_model()
    metrics = dict(train_result.metrics)
    metrics["train_samples"] = len(train_dataset)
    if block_size and "train_samples_per_second" in metrics:
        metrics["train_tokens_per_second"] = round(metrics["train_samples_per_second"] * block_size, 1)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def evaluate_with_perplexity(trainer, eval_dataset) -> dict:
    """``trainer.evaluate`` plus ``perplexity = exp(eval_loss)`` (``inf`` on overflow), logged through the Trainer
    (``report_to``) and saved to ``<output_dir>/eval_results.json``. Returns the metrics."""
    metrics = trainer.evaluate()
    metrics["eval_samples"] = len(eval_dataset)
    try:
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
    except OverflowError:
        metrics["perplexity"] = float("inf")
    trainer.log({"perplexity": metrics["perplexity"]})
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def parse_and_set_up(
    dataclass_types,
    argv: list[str] | None,
    logger_: logging.Logger | None = None,
    output_prefix: str | Callable[[tuple], str] | None = None,
    defaults: dict[str, Any] | None = None,
):
    """The start of every script: :func:`parse_script_args` (``argv``: ``sys.argv[1:]`` when ``None``; flags or one
    ``.json``) into ``dataclass_types`` (one of them :class:`CondInitArguments`, the last a ``TrainingArguments``),
    then: without ``--output_dir``, ``default_output_dir(output_prefix, ...)`` (``output_prefix`` may be a function
    of the parsed tuple); the DeepSpeed config checked against the flags; logging set up; the training arguments
    logged at info level. Raises :class:`UsageError` for every user error found.

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
    if training_args.deepspeed:
        validate_deepspeed_config(training_args, cond_args)
    setup_logging(training_args, logger_)
    (logger_ or logger).info(f"Training/evaluation parameters {training_args}")
    return parsed, "attention" in given
