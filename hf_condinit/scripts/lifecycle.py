"""A run's life after parsing: resume or stop (:func:`find_last_checkpoint`), the splits, train and save, evaluate."""

from __future__ import annotations

import logging
import math
import os

from ..versions import RESUME_MIN_TORCH, torch_below
from .errors import UsageError
from .machine import machine_summary

logger = logging.getLogger(__name__)


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

    A resume on torch < `hf_condinit.versions.RESUME_MIN_TORCH` is a :class:`UsageError` too (transformers refuses to
    load the checkpoint's optimizer state there, after the model is built).
    """
    last = _checkpoint_to_resume(training_args, logger_)
    if last is not None and torch_below(RESUME_MIN_TORCH):
        import torch

        raise UsageError(
            f"resuming from {last} needs torch>={RESUME_MIN_TORCH} (found {torch.__version__}: transformers refuses to "
            f"load a checkpoint's optimizer state below it, CVE-2025-32434): pip install -U 'torch>={RESUME_MIN_TORCH}',"
            f" or pass a new --output_dir to start over."
        )
    return last


def _checkpoint_to_resume(training_args, logger_: logging.Logger | None) -> str | None:
    """`find_last_checkpoint`'s policy, without the torch check."""
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


def throughput_context() -> dict:
    """What a training throughput depends on beyond the run, recorded beside it in ``train_results.json``:
    ``train_machine`` (:func:`.machine.machine_summary`), ``train_torch_threads`` (``torch.get_num_threads()``: set
    ``OMP_NUM_THREADS`` to change it) and ``train_load_average`` (the 1-minute load average at the end of training,
    POSIX only: other jobs on the machine slow the run down)."""
    import torch

    out = {"train_machine": machine_summary(), "train_torch_threads": torch.get_num_threads()}
    if hasattr(os, "getloadavg"):
        out["train_load_average"] = round(os.getloadavg()[0], 2)
    return out


def train_and_save(trainer, train_dataset, resume_from_checkpoint=None, block_size: int | None = None) -> dict:
    """``trainer.train`` (resuming from ``resume_from_checkpoint`` when given), then save the model (and the
    tokenizer: the checkpoint is self-contained), the ``train`` metrics and the trainer state. With ``block_size``
    (tokens per sample) the metrics gain ``train_tokens_per_second``; every run records the machine, thread count
    and load its speed was measured under (:func:`throughput_context`). Returns the metrics.

    The run's report (``loss.png``, ``kappa.png``, model card ``README.md``) is written when training ends and the
    card refreshed after the script's final evaluation (``hf_condinit.callbacks.RunReportCallback``)."""
    from ..callbacks import RunReportCallback

    RunReportCallback.attach(trainer)
    train_result = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.save_model()
    metrics = dict(train_result.metrics)
    metrics["train_samples"] = len(train_dataset)
    if block_size and "train_samples_per_second" in metrics:
        metrics["train_tokens_per_second"] = round(metrics["train_samples_per_second"] * block_size, 1)
    metrics.update(throughput_context())
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
