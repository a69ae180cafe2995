"""The SLURM array script of a study: one array task per slot of the plan (:func:`hf_condinit.study.plan.slots`).

Task ``i`` runs ``python -m hf_condinit.study --out OUT --slot i``: it resolves slot ``i`` and runs its cell, waiting
while the cell's learning rate is not decided yet (a slot waits only on slots before it, and SLURM starts array tasks
in order). A task whose cell is finished, failed or held by a live worker ends at once, so resubmitting the same
script after a preemption, a time limit or a crash runs only what is unfinished. The batch shell ``exec``s Python, so
SLURM's SIGTERM reaches the worker, which passes it on to the run (it saves a checkpoint and exits 75).
"""

from __future__ import annotations

import os
import shlex
import sys

from .plan import Plan, slots

__all__ = ["sbatch_script"]


def sbatch_script(plan: Plan, out: str, options: list[str] = (), poll: float = 30.0) -> str:
    """The script's text; ``options``: extra ``#SBATCH`` options (``--gpus-per-task=1``, ``--time=04:00:00``);
    ``poll``: seconds between two looks of a waiting task."""
    out = os.path.abspath(out)
    n = len(slots(plan))
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=study-{os.path.basename(out)}",
             f"#SBATCH --array=0-{n - 1}",
             f"#SBATCH --output={out}/logs/slurm-%A_%a.out",
             *[f"#SBATCH {o}" for o in options],
             f"# {n} slots of the study in {out} (python -m hf_condinit.study --out {out} --report when done)",
             f"cd {shlex.quote(plan.workdir)}",
             f"exec {shlex.quote(sys.executable)} -m hf_condinit.study --out {shlex.quote(out)} "
             f'--poll_seconds {poll:g} --slot "$SLURM_ARRAY_TASK_ID"']
    return "\n".join(lines) + "\n"
