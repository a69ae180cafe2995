"""The flags' values checked right after parsing, before any work: the range of every numeric flag
(:func:`check_numeric_flags`), every folder a run writes (:func:`check_written_folders`) and every local path it
reads a model from (:func:`check_model_paths`).

A value out of range would otherwise crash mid-run (``--learning_rate -0.001``: a torch traceback after the
tokenizer was trained and saved; ``--per_device_train_batch_size 0``) or be taken silently (``--weight_decay -0.1``).
:data:`FLAG_RANGES` holds one rule per flag name, whichever dataclass the flag lives in (``TrainingArguments``, a
script's model / data arguments, :class:`~hf_condinit.scripts.arguments.CondInitArguments`); every numeric flag
must also be finite. Choice flags are checked where they are parsed: argparse's ``choices``, ``TrainingArguments``'
enums (``--lr_scheduler_type``, ``--optim``, the strategies), :meth:`CondInitArguments.validate_names` and
``CondInitConfig`` for the method options.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from ..errors import UsageError, check_writable_folder


@dataclass(frozen=True)
class Range:
    """An allowed interval ``[low, high]`` (``low_open`` / ``high_open``: the end itself excluded; ``None``: no
    bound), plus ``also`` (sentinel values outside it, such as ``max_steps = -1``) and ``integer_above_one`` (a float
    flag whose value, from 1 on, must be a whole number: ``warmup_steps`` is a fraction below 1, a step count above)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple = ()
    integer_above_one: bool = False

    def allows(self, value) -> bool:
        if value in self.also:
            return True
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return not (self.integer_above_one and value >= 1 and value != int(value))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        if self.integer_above_one:
            text += " (below 1: a fraction of the training steps; from 1: a whole number of steps)"
        return text + "".join(f" or {v}" for v in self.also)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)  # a probability or a fraction
SEED = Range(0, 2**32 - 1)  # numpy's seed range (HF's set_seed seeds numpy too)
STEPS = Range(0, low_open=True, integer_above_one=True)  # logging/save/eval steps: < 1 is a fraction of the run

#: flag name → allowed values. A flag whose value is ``None`` (not set) is never checked.
FLAG_RANGES: dict[str, Range] = {
    # TrainingArguments (optimiser)
    "learning_rate": NON_NEGATIVE,  # 0 is allowed: a run that must leave the weights as built (tests use it)
    "weight_decay": NON_NEGATIVE,
    "adam_beta1": Range(0, 1, high_open=True),
    "adam_beta2": Range(0, 1, high_open=True),
    "adam_epsilon": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,  # 0: no clipping
    "label_smoothing_factor": Range(0, 1, high_open=True),
    "neftune_noise_alpha": NON_NEGATIVE,
    # TrainingArguments (length of the run, batches)
    "warmup_steps": Range(0, integer_above_one=True),
    "num_train_epochs": POSITIVE,
    "max_steps": Range(1, also=(-1,)),  # -1: --num_train_epochs decides
    "per_device_train_batch_size": AT_LEAST_ONE,
    "per_device_eval_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "eval_accumulation_steps": AT_LEAST_ONE,
    "torch_empty_cache_steps": AT_LEAST_ONE,
    "logging_steps": STEPS,
    "eval_steps": STEPS,
    "save_steps": STEPS,
    "eval_delay": NON_NEGATIVE,
    "save_total_limit": AT_LEAST_ONE,
    "seed": SEED,
    "data_seed": SEED,
    "dataloader_num_workers": NON_NEGATIVE,
    "dataloader_prefetch_factor": AT_LEAST_ONE,
    "ddp_bucket_cap_mb": AT_LEAST_ONE,
    "ddp_timeout": POSITIVE,
    "local_rank": Range(-1),  # set by the launchers
    # the scripts' data and model flags
    "tokenizer_vocab_size": AT_LEAST_ONE,
    "pad_vocab_to_multiple_of": AT_LEAST_ONE,
    "validation_split_percentage": Range(0, 100, high_open=True),
    "train_val_split": Range(0, 1, high_open=True),
    "block_size": AT_LEAST_ONE,
    "max_seq_length": AT_LEAST_ONE,
    "max_train_samples": AT_LEAST_ONE,
    "max_eval_samples": AT_LEAST_ONE,
    "max_predict_samples": AT_LEAST_ONE,
    "preprocessing_num_workers": AT_LEAST_ONE,
    "mlm_probability": Range(0, 1, low_open=True, high_open=True),
    "random_crop_padding": NON_NEGATIVE,
    "synthetic_train_examples": AT_LEAST_ONE,
    "synthetic_eval_examples": AT_LEAST_ONE,
    "mqar_pairs": AT_LEAST_ONE,
    "mqar_queries": AT_LEAST_ONE,
    "mqar_keys": AT_LEAST_ONE,
    "mqar_values": AT_LEAST_ONE,
    # CondInitArguments (CondInitConfig checks the method options again, with the same bounds)
    "condinit_seed": SEED,
    "qk_gain": POSITIVE,
    "v_gain": POSITIVE,
    "spectral_lambda": NON_NEGATIVE,
    "affine_rho": UNIT,
    "precond_eps": POSITIVE,
    "log_condition_number_every": NON_NEGATIVE,
    "condition_number_probe_size": AT_LEAST_ONE,
    "condition_number_probe_length": Range(2),  # κ of a 1-token causal head is trivially 1
    "save_minutes": NON_NEGATIVE,  # 0: no time-based checkpoints
}

#: Numeric flags with no range beyond being finite: the mimetic coefficients (the paper's are 0.7 / 0.4; any real
#: value defines a target) and the sign of the VO identity (``CondInitConfig`` accepts only -1 / +1).
FREE_NUMERIC_FLAGS = frozenset({"mimetic_alpha1", "mimetic_beta1", "mimetic_alpha2", "mimetic_beta2", "mimetic_vo_sign"})


def numeric_fields(dataclass_type) -> list[str]:
    """Names of the ``int`` / ``float`` fields of ``dataclass_type`` (``bool`` excluded; ``X | None`` included)."""
    out = []
    for f in dataclasses.fields(dataclass_type):
        text = f.type if isinstance(f.type, str) else f.type.__name__ if isinstance(f.type, type) else str(f.type)
        words = set(text.replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split())
        if f.init and words & {"int", "float"} and "bool" not in words and "list" not in words and "dict" not in words:
            out.append(f.name)
    return out


def check_numeric_flags(parsed) -> None:
    """Raise a :class:`UsageError` naming the first numeric flag of the parsed dataclasses ``parsed`` that is not
    finite or outside its :data:`FLAG_RANGES` rule, with the allowed values."""
    for args in parsed:
        for name in numeric_fields(type(args)):
            value = getattr(args, name, None)
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                raise UsageError(f"--{name} {value}: must be a finite number.")
            rule = FLAG_RANGES.get(name)
            if rule is not None and not rule.allows(value):
                raise UsageError(f"--{name} {value:g}: must be {rule.describe()}.")


#: The flags naming a folder a script writes into (whichever dataclass holds them), checked before any work.
WRITTEN_FOLDER_FLAGS = ("output_dir", "cache_dir")


def check_written_folders(parsed) -> None:
    """:func:`check_writable_folder` on every :data:`WRITTEN_FOLDER_FLAGS` field set in the parsed dataclasses."""
    for args in parsed:
        for name in WRITTEN_FOLDER_FLAGS:
            value = getattr(args, name, None)
            if isinstance(value, str) and value:
                check_writable_folder(value, f"--{name}")


#: The flags naming a model or tokenizer to load: a local folder or a hub id.
MODEL_PATH_FLAGS = ("model_name_or_path", "tokenizer_name")


def looks_like_local_path(value: str) -> bool:
    """Whether ``value`` can only be a local folder, not a hub id: it starts with ``/``, ``.`` or ``~``, holds a
    backslash or more than one ``/``, is not a valid repo id (``huggingface_hub.utils.validate_repo_id``), or its
    first component is a folder here (``runs/clm-x`` with ``runs/`` present)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if value.startswith(("/", ".", "~")) or "\\" in value or value.count("/") > 1:
        return True
    try:
        validate_repo_id(value)
    except HFValidationError:
        return True
    return "/" in value and os.path.isdir(value.split("/", 1)[0])


def check_model_paths(parsed) -> None:
    """Raise a :class:`UsageError` (one line) for a :data:`MODEL_PATH_FLAGS` value that names a local folder
    (:func:`looks_like_local_path`) that does not exist, instead of transformers' "Repo id must be in the form", and
    for a ``--model_name_or_path`` folder whose own code needs ``--trust_remote_code`` (:func:`check_remote_code`)."""
    for args in parsed:
        for name in MODEL_PATH_FLAGS:
            value = getattr(args, name, None)
            if isinstance(value, str) and value and not os.path.exists(os.path.expanduser(value)) \
                    and looks_like_local_path(value):
                raise UsageError(f"--{name} {value}: no such folder; pass the folder of a saved model (a run's "
                                 f"--output_dir) or a hub id such as org/name.")
        check_remote_code(getattr(args, "model_name_or_path", None), getattr(args, "trust_remote_code", False))


def check_remote_code(folder: str | None, trust_remote_code: bool) -> None:
    """Raise a :class:`UsageError` (one line) when the local model ``folder`` needs its own code (``auto_map`` in its
    config.json and a ``model_type`` transformers does not know: HF's rule for ``trust_remote_code``) and
    ``--trust_remote_code`` is not given. The plugin's own portable checkpoints (``condinit_modeling.py``) load
    without it: the config hook of :mod:`hf_condinit.hooks` reads them back as their base type."""
    if trust_remote_code or not isinstance(folder, str) or not os.path.isfile(os.path.join(folder, "config.json")):
        return
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config, _ = PretrainedConfig.get_config_dict(folder)
    auto_map = config.get("auto_map") or {}
    if auto_map and config.get("model_type") not in CONFIG_MAPPING:
        files = sorted({ref.split("--")[-1].split(".")[0] + ".py" for ref in auto_map.values() if isinstance(ref, str)})
        raise UsageError(f"--model_name_or_path {folder} runs its own model code ({', '.join(files)}, auto_map in its "
                         f"config.json); pass --trust_remote_code to run it (only for code you have read).")
