"""A checkpoint every so many minutes of training: :class:`PeriodicCheckpointCallback`.

A kill that gives no chance to save (SIGKILL, the out-of-memory killer, a lost machine) costs the work since the last
checkpoint. ``--save_steps`` bounds that in steps; this callback bounds it in wall time, whatever a step costs: at
the end of the first optimizer step at least ``every_seconds`` after training began (or resumed) or after the last
save (any save: ``--save_steps``'s, a signal's, its own), it asks the Trainer for a checkpoint. None at the run's
last step, whose final save follows. How many checkpoints are kept is ``--save_total_limit``'s. In a distributed run
the ranks agree on each save (one all-reduce per step while the callback is on). Scripts: ``--save_minutes M``
(docs/pretraining.md, "Faults and preemption").
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class PeriodicCheckpointCallback(TrainerCallback):
    """Save a checkpoint every ``every_seconds`` of wall time (module docstring); ``every_seconds`` must be > 0.
    ``clock``: the time source in seconds (``time.monotonic``)."""

    def __init__(self, every_seconds: float, clock=time.monotonic):
        if not every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
        self.every_seconds, self.clock = float(every_seconds), clock
        self.last = clock()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = self.clock()

    def _due(self, args) -> bool:
        """Whether any rank's interval has passed (every rank gets the same answer)."""
        due = self.clock() - self.last >= self.every_seconds
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return due
        import torch

        flag = torch.tensor([1.0 if due else 0.0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def on_step_end(self, args, state, control, **kwargs):
        if self._due(args) and state.global_step < state.max_steps:
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = self.clock()
