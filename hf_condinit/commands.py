"""How a command of the package runs and ends: :func:`run_main` (a user error is one line and exit code 2) and
:func:`end_process_group`. The example scripts and ``hf-condinit-study`` end through it (docs/development.md)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from .errors import UsageError


def run_main(main: Callable, argv: list[str] | None = None, prog: str | None = None):
    """Run a script's ``main(argv)``: a :class:`UsageError` becomes ``<prog>: error: <message>`` (one line) on stderr
    and exit code 2; a :class:`hf_condinit.callbacks.NonFiniteLossError` or a
    :class:`~.checkpoints.CheckpointSaveError` (e.g. a full disk) one line and exit code 1; a
    :class:`hf_condinit.callbacks.TrainingPreempted` (a signal stopped training after a checkpoint) one line
    ``<prog>: <message>`` and exit code :data:`hf_condinit.callbacks.PREEMPTED_EXIT_CODE` (75); everything else
    propagates with its traceback. A normal return clears the ``--output_dir`` lock's record (:mod:`.locks`).
    On a normal return and on a preemption's exit (every rank ends there together) the process group of a distributed
    run is ended first (:func:`end_process_group`); the error exits leave it (one rank may stop alone).
    Use as ``if __name__ == "__main__": run_main(main)``."""
    from . import locks
    from .callbacks import PREEMPTED_EXIT_CODE, NonFiniteLossError, TrainingPreempted
    from .checkpoints import CheckpointSaveError

    prog = prog or os.path.basename(sys.argv[0])
    try:
        result = main(argv)
    except UsageError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)
    except (NonFiniteLossError, CheckpointSaveError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(1)
    except TrainingPreempted as err:
        end_process_group()  # every rank stops at the same checkpoint (the stop is agreed on by all ranks)
        print(f"{prog}: {err}", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)
    end_process_group()
    locks.unlock_all(clear=True)  # a normal end: the next run in the folder finds no record of a failed one
    return result


def end_process_group() -> None:
    """End a distributed run's ``torch.distributed`` default process group, when there is one, while the interpreter
    is whole: a barrier, then :func:`torch.distributed.destroy_process_group`. Call it on every rank.

    A gloo process group left to interpreter finalisation can abort a rank after a finished run ("terminate called
    without an active exception", SIGABRT: a worker thread still drops work that holds tensors, which needs the GIL;
    pytorch/pytorch#190489), and the launcher then reports a failed run. Destroying it joins those threads; on
    torch 2.5 the join holds the GIL, so a worker still dropping finished work deadlocks it: the barrier (gloo's waits
    for all earlier work) and a short sleep first let the workers finish, with the GIL free. A barrier that fails (a
    peer already gone) leaves the group to the interpreter, as before. A no-op without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        dist.barrier()
    except RuntimeError:  # DistBackendError included: a peer is gone, so the run failed anyway
        return
    time.sleep(0.05)
    dist.destroy_process_group()
