"""A run's life after parsing: resume or stop (:func:`find_last_checkpoint`), the folder's lock
(:func:`claim_output_dir`), the splits, train and save (a signal ends it with :class:`TrainingPreempted`), evaluate."""

from __future__ import annotations

import logging
import math
import os

from ..versions import RESUME_MIN_TORCH, torch_below
from .. import locks
from ..checkpoints import STAGING_DIR, check_checkpoint, checkpoints_newest_first, newest_complete_checkpoint
from ..errors import UsageError
from .machine import machine_summary

logger = logging.getLogger(__name__)


def find_last_checkpoint(training_args, logger_: logging.Logger | None = None) -> str | None:
    """The checkpoint to resume from, by the policy that a rerun never destroys an earlier run. Call it before any
    data or model work; pass its result to ``trainer.train(resume_from_checkpoint=...)``.

    - ``--output_dir`` in use by a live run (:mod:`hf_condinit.locks`): :class:`UsageError` naming it.
    - ``--resume_from_checkpoint DIR`` (or ``last``/``latest``/``true``: the newest complete ``checkpoint-*`` in
      ``--output_dir``): that checkpoint; a missing, incomplete or damaged one
      (:func:`hf_condinit.checkpoints.check_checkpoint`, content verified) is a :class:`UsageError` saying what is
      wrong. A checkpoint at the run's last step trains nothing: the run finishes from it
      (:meth:`.trainer.CondInitTrainer._run_epoch`).
    - not training, or ``--output_dir`` missing or empty (but for the lock and a killed save's staging folder):
      ``None`` (a fresh run).
    - ``--output_dir`` holds ``checkpoint-*`` of an unfinished run (not :func:`run_finished`: killed in training or
      in its final writes): the newest *complete, readable* one, content verified (each newer damaged one skipped
      with one warning, never deleted); the run **resumes** (from a checkpoint at its last step it trains nothing and
      writes the final files), and says so in one line (with how to start over instead). When none is complete, the
      run starts over in the folder (the damaged ones are kept, and moved aside if a new checkpoint needs the name).
    - ``--output_dir`` holds files of a run of this plugin that died without a checkpoint (its lock record left
      behind, :func:`hf_condinit.locks.dead_holder`): ``None``, the run starts over, with one warning.
    - ``--output_dir`` holds a finished run, or other files without a checkpoint: :class:`UsageError` naming both ways
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
    log = logger_ or logger
    out = training_args.output_dir
    locks.refuse_if_busy(out)
    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "latest", "true"):
        found = newest_complete_checkpoint(out, log)
        if found is None:
            raise UsageError(f"--resume_from_checkpoint {resume}: no complete checkpoint-* in --output_dir {out}.")
        return found
    if resume is not None:
        if not os.path.isdir(resume):
            raise UsageError(f"--resume_from_checkpoint {resume!r} is not a directory.")
        problem = check_checkpoint(resume, verify_content=True)
        if problem:
            raise UsageError(f"--resume_from_checkpoint {resume}: {problem}; name an earlier checkpoint.")
        return resume
    own = {locks.LOCK_NAME, STAGING_DIR}
    if not training_args.do_train or not os.path.isdir(out) or not set(os.listdir(out)) - own:
        return None
    finished = run_finished(out)
    if not finished and checkpoints_newest_first(out):
        last = newest_complete_checkpoint(out, log)
        if last is None:
            log.warning(f"--output_dir {out} holds an unfinished run without a complete checkpoint: starting over "
                        f"(its checkpoint folders are kept)")
            return None
        log.warning(
            f"--output_dir {out} holds an unfinished run: resuming from {last} (for a fresh run, pass a new "
            f"--output_dir or delete {out})."
        )
        return last
    died = None if finished else locks.dead_holder(out)
    if died:
        log.warning(f"--output_dir {out} holds a run that stopped without a checkpoint ({died.get('command')}, PID "
                    f"{died.get('pid')} on {died.get('host')}): starting over")
        return None
    last = newest_complete_checkpoint(out, log, verify_content=False)
    what = "a finished run" if finished else "files but no checkpoint"
    hint = f"--resume_from_checkpoint {last}" if last else "--resume_from_checkpoint <checkpoint>"
    raise UsageError(
        f"--output_dir {out} already holds {what}; pass a new --output_dir (or delete that one), or {hint} to "
        f"continue it."
    )


def run_finished(output_dir: str) -> bool:
    """Whether ``output_dir`` holds a finished run: its ``train_results.json`` is written and the script that wrote
    it returned normally, which clears the lock's record last (:func:`hf_condinit.locks.dead_holder`, cleared by
    :func:`hf_condinit.commands.run_main` after the final model, the results and the evaluation). A run killed while
    writing its final files is unfinished: a rerun writes them again (from its last checkpoint when it has one)."""
    return os.path.exists(os.path.join(output_dir, "train_results.json")) and not locks.dead_holder(output_dir)


def claim_output_dir(training_args) -> None:
    """Take ``--output_dir``'s lock for this run (:func:`hf_condinit.locks.lock_output_dir`: one run per folder;
    rank 0 takes it for every rank). Call it first inside the script's ``with user_errors(training_args.output_dir):`` block, where the
    run starts writing: a second run into the folder then stops with one line (exit 2) before any work."""
    locks.lock_output_dir(training_args.output_dir)


def select_splits(lm_datasets, training_args, max_train_samples: int | None = None, max_eval_samples: int | None = None,
                  streaming: bool = False, cache_dir: str | None = None):
    """``(train_dataset, eval_dataset)`` for ``--do_train`` / ``--do_eval`` (``None`` when not requested), truncated to
    ``--max_train_samples`` / ``--max_eval_samples``. Raises ``ValueError`` when evaluation has no data. With
    ``streaming`` (``--streaming``): :func:`hf_condinit.data.streaming.streamed_splits` (the validation blocks are read,
    and written to ``cache_dir``'s cache, here)."""
    if streaming:
        from ..data.streaming import streamed_splits

        return streamed_splits(lm_datasets, training_args, max_train_samples, max_eval_samples, cache_dir)
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
    card refreshed after the script's final evaluation (``hf_condinit.callbacks.RunReportCallback``).

    With a :class:`~.trainer.CondInitTrainer`: a signal (SIGTERM / SIGINT / SIGUSR1) during training saves a
    checkpoint, and ``trainer.train`` raises :class:`hf_condinit.callbacks.TrainingPreempted` instead of finishing
    the run (no final model, no ``train_results.json``: the rerun resumes); ``train_loss``, ``train_wall_seconds`` and
    ``train_segments`` cover every resumed segment (:class:`hf_condinit.callbacks.RunTotalsCallback`; the stock
    Trainer's figures for the last segment alone stay as ``train_runtime`` and ``train_samples_per_second``)."""
    from ..callbacks import RunReportCallback

    RunReportCallback.attach(trainer)
    train_result = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.save_model()
    metrics = dict(train_result.metrics)
    totals = getattr(trainer, "run_totals", None)
    if totals is not None:
        metrics.pop("train_loss", None)
        metrics.update(totals.metrics(trainer.state.global_step))
    metrics["train_samples"] = train_samples(trainer, train_dataset)
    if block_size and "train_samples_per_second" in metrics:
        metrics["train_tokens_per_second"] = round(metrics["train_samples_per_second"] * block_size, 1)
    metrics.update(throughput_context())
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def train_samples(trainer, train_dataset) -> int:
    """The training set's size, or for a stream (no length, ``--streaming``) the samples the run's steps consumed."""
    if hasattr(train_dataset, "__len__"):
        return len(train_dataset)
    args = trainer.args
    return trainer.state.global_step * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size


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
