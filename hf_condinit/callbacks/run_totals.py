"""The run's totals over every resumed segment: :class:`RunTotalsCallback`.

The stock Trainer's ``train_loss`` and ``train_runtime`` cover only the steps of the current ``train()`` call, so a
resumed run reports the loss of its last segment (7.03 against 7.43 uninterrupted in the example).
:class:`hf_condinit.scripts.trainer.CondInitTrainer` adds every training step's loss (the value the Trainer itself
accumulates) to this callback and stores :meth:`RunTotalsCallback.snapshot` in each checkpoint's
``trainer_state.json`` (``stateful_callbacks["hf_condinit_run_totals"]``); a resumed run starts from it.

Conventions: ``train_loss`` = (sum over every step of the run of the Trainer's step loss) / ``global_step``, the
stock Trainer's definition for an uninterrupted run. The sum is one float64 running sum (float32 on MPS, which has
no float64) in step order, carried through the checkpoint: a resumed segment adds its first step's loss to the sum
it resumed from, so a resumed run's ``train_loss`` equals the uninterrupted run's bit for bit (a segment summed on
its own and added at the end rounds differently); ``train_wall_seconds``: the wall time of every segment up to
its last checkpoint (the time a killed segment ran after it is lost with its steps) plus the current segment;
``train_cpu_seconds``: the same for this process's CPU time (user + system, every thread; on a machine shared with
other jobs a fairer measure of the work than wall time); ``train_segments``: how many ``train()`` calls the run took (1 + resumes).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

STATE_KEY = "hf_condinit_run_totals"


class RunTotalsCallback(TrainerCallback):
    """Loss sum, wall time and segment count of a run across resumes (see the module docstring)."""

    def __init__(self):
        self.loss_before = 0.0  # summed step losses of the earlier segments (None: resumed without totals)
        self.wall_before = 0.0
        self.cpu_before = 0.0
        self.segments = 1
        self._loss = None  # the run's summed step losses so far, a tensor on the training device (no sync per step)
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def add_loss(self, loss) -> None:
        """Add one ``training_step`` result (a 0-dim tensor) to the run's running sum."""
        import torch

        loss = loss.detach().to(torch.float32 if loss.device.type == "mps" else torch.float64)
        if self._loss is None:  # the segment's first step: start from the sum it resumed from
            self._loss = torch.tensor(self.loss_before or 0.0, dtype=loss.dtype, device=loss.device)
        self._loss = self._loss + loss

    def on_train_begin(self, args, state, control, **kwargs):
        self._loss, self._start, self._cpu_start = None, time.perf_counter(), time.process_time()
        saved = (state.stateful_callbacks or {}).get(STATE_KEY) if state.global_step > 0 else None
        self.cpu_before = (saved or {}).get("cpu_seconds", 0.0)  # 0 from a checkpoint of a version without it
        if saved:
            self.loss_before, self.wall_before, self.segments = saved["loss_sum"], saved["wall_seconds"], saved["segments"] + 1
        elif state.global_step > 0:  # resumed from a checkpoint without totals (an older version's): unknown
            self.loss_before, self.wall_before, self.segments = None, 0.0, 2
        else:
            self.loss_before, self.wall_before, self.segments = 0.0, 0.0, 1

    def snapshot(self) -> dict:
        """``{"loss_sum", "wall_seconds", "cpu_seconds", "segments"}`` up to now (kept in each checkpoint)."""
        if self.loss_before is None:
            loss_sum = None
        else:
            loss_sum = self.loss_before if self._loss is None else float(self._loss)
        return {"loss_sum": loss_sum, "wall_seconds": round(self.wall_before + time.perf_counter() - self._start, 3),
                "cpu_seconds": round(self.cpu_before + time.process_time() - self._cpu_start, 3),
                "segments": self.segments}

    def metrics(self, global_step: int) -> dict:
        """``train_loss`` (over the whole run; omitted when an older checkpoint lacked the totals),
        ``train_wall_seconds``, ``train_cpu_seconds`` and ``train_segments``."""
        snap = self.snapshot()
        out = {"train_wall_seconds": snap["wall_seconds"], "train_cpu_seconds": snap["cpu_seconds"],
               "train_segments": snap["segments"]}
        if snap["loss_sum"] is not None and global_step > 0:
            out["train_loss"] = snap["loss_sum"] / global_step
        return out
