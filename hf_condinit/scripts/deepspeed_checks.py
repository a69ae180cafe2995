"""DeepSpeed config checks made before any work (the ZeRO stage is reported by :mod:`.launch`)."""

from __future__ import annotations

import json
import logging
import os

from ..registry import ATTENTION_VARIANTS
from .arguments import CondInitArguments
from ..errors import UsageError

logger = logging.getLogger(__name__)


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
        uses_holders = cond_args.attention in ATTENTION_VARIANTS or cond_args.spectral_lambda is not None
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
