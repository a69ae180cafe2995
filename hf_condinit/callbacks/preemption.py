"""A clean stop on SIGTERM / SIGINT / SIGUSR1: :class:`PreemptionCallback`, :class:`TrainingPreempted`.

SLURM (``--signal``), Kubernetes and ``torchrun`` send SIGTERM (or SIGUSR1) before they kill a job; Ctrl-C sends
SIGINT. While training, the first such signal only sets a flag: at the end of the current optimizer step every rank
agrees on it (one all-reduce per step in a distributed run), the Trainer saves a checkpoint (atomically,
:mod:`hf_condinit.checkpoints`) and stops, and :func:`hf_condinit.scripts.lifecycle.train_and_save` raises
:class:`TrainingPreempted`, which :func:`hf_condinit.commands.run_main` prints as one line before exiting with
:data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: "try again"). Rerunning the same command resumes from that
checkpoint.

A second SIGINT (Ctrl-C twice) ends the process at once; a repeated SIGTERM / SIGUSR1 is logged and ignored, because
launchers repeat them: SLURM signals every process of a job step and ``torchrun`` forwards its own SIGTERM to its
workers, which would otherwise cut the save short (the launcher's later SIGKILL still ends a save that takes too
long). Either way the previous checkpoint is intact: a checkpoint becomes visible only once complete.
"""

from __future__ import annotations

import logging
import os
import signal

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, the same command may be run again
SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)


class TrainingPreempted(Exception):
    """Training stopped early on a signal after saving ``checkpoint``; rerun the same command to resume."""

    def __init__(self, signal_name: str, checkpoint: str, step: int, max_steps: int):
        self.signal_name, self.checkpoint, self.step, self.max_steps = signal_name, checkpoint, step, max_steps
        super().__init__(
            f"{signal_name} received: saved {checkpoint} at step {step} of {max_steps} and stopped; rerun the same "
            f"command to resume from it (exit code {PREEMPTED_EXIT_CODE})"
        )


class PreemptionCallback(TrainerCallback):
    """Turn SIGTERM / SIGINT / SIGUSR1 during ``trainer.train()`` into a checkpoint and a clean stop.

    The handlers are installed when training begins (main thread only) and the previous ones restored when it ends
    (:meth:`restore_handlers`, which :class:`~hf_condinit.scripts.trainer.CondInitTrainer` also calls when training
    ends in an exception).
    ``received`` names the first signal (``None`` until one arrives); ``stopped_early(state)`` says whether training
    ended on it before ``max_steps``."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            if signum == signal.SIGINT:  # Ctrl-C twice: stop now (the last complete checkpoint is intact)
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            else:
                logger.warning(f"{signal.Signals(signum).name} received again: already stopping after this step")
            return
        self.received = signal.Signals(signum).name
        logger.warning(f"{self.received} received: saving a checkpoint at the end of this step, then stopping")

    def on_train_begin(self, args, state, control, **kwargs):
        self.received = None
        try:
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        except ValueError:  # not the main thread: signals cannot be caught here
            self._previous = {}

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the handlers that were there before training began (a no-op when none are installed). Training
        that ends in an exception never reaches ``on_train_end``: its caller calls this, or the next Ctrl-C of a
        notebook would still go to this callback's flag."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _agreed(self, args) -> bool:
        """Whether any rank has received a signal (every rank gets the same answer)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return self.received is not None
        flag = torch.tensor([1.0 if self.received else 0.0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0 and self.received is None:
            self.received = "a signal on another rank"
        return flag.item() > 0

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed(args):
            control.should_save = True
            control.should_training_stop = True
        return control

    def stopped_early(self, state) -> bool:
        """Whether training stopped on a signal before its last step."""
        return self.received is not None and state.global_step < state.max_steps
