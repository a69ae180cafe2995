"""A study on SLURM: one job array per round of the plan (:func:`hf_condinit.study.plan.rounds`), each submitted
after the one before, then a job that writes the report.

Task ``i`` of an array runs slot ``i`` (:func:`run_task`: ``python -m hf_condinit.study --out OUT --slot i``, in an
``srun`` step). Round ``r + 1`` is submitted with ``--dependency=afterok:<round r>`` and ``--kill-on-invalid-dep=yes``,
so a task starts only once every slot its cell depends on is done: no task holds an allocation while it waits, and a
task whose slot would still wait (run out of order) stops at once with exit 2. A task whose cell is left unfinished
exits 1, so the rounds after it are cancelled rather than started on a grid that is not decided.

Preemption and time limits: every job is ``--requeue`` (a cluster with ``PreemptMode=REQUEUE`` puts a preempted
task back in the queue) and ``--signal=TERM@180`` (SIGTERM three minutes before the time limit). A SIGTERM of the
step (that signal, ``scancel --signal=TERM JOB_TASK``, a preemption's) reaches the study, which passes it on to the
run: it saves a checkpoint and exits 75. The task then requeues itself (``scontrol requeue``) if its job is still
running — not after a ``scancel`` — and exits 75; the requeued task runs the same slot again, and the cell resumes
from its checkpoint. Every job writes to ``OUT/logs/slurm-<job>_<task>.out`` (appended across requeues); that
folder is created before anything is submitted.

Only the slots not done when the jobs are written are in them (a slot whose cell is finished or failed, or that needs
no cell, is left out), so submitting again after a cancel, a failure or a crash runs only what is left.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from .cells import StudyPreempted, cell_state, outcome_of, run_worker
from .plan import WAIT, Cell, Plan, resolve, rounds, slots

__all__ = ["SIGNAL_SECONDS", "jobs", "run_task", "submit", "submit_script"]

#: Seconds before the time limit at which SLURM sends SIGTERM (``--signal=TERM@...``): the time a run has to save.
SIGNAL_SECONDS = 180


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (sbatch's ``--array``)."""
    parts, start = [], None
    for k, i in enumerate(indices):
        start = i if start is None else start
        if k + 1 == len(indices) or indices[k + 1] != i + 1:
            parts.append(f"{start}" if start == i else f"{start}-{i}")
            start = None
    return ",".join(parts)


def _pending(plan: Plan, out: str, indices: list[int]) -> list[int]:
    """The slots among ``indices`` that still have work: a cell to run, or a rate not decided yet."""
    outcome = outcome_of(plan, out)
    work = slots(plan)
    keep = []
    for i in indices:
        cell = resolve(plan, work[i], outcome)
        if cell == WAIT or (isinstance(cell, Cell) and cell_state(plan, cell, out)[0] == "todo"):
            keep.append(i)
    return keep


def jobs(plan: Plan, out: str, options: list[str] = ()) -> list[tuple[str, list[str]]]:
    """The study's jobs in order, each ``(label, sbatch arguments)`` without ``--dependency`` (each job depends on
    the one before it); ``options``: the user's extra sbatch options (``--partition=gpu``, ``--gpus-per-task=1``,
    ``--time=04:00:00``), after the study's own so they can override them. Empty when nothing is left to run."""
    out = os.path.abspath(out)
    logs = os.path.join(out, "logs")
    python = shlex.quote(sys.executable)
    base = [f"--job-name=study-{os.path.basename(out)}", f"--chdir={plan.workdir}", "--open-mode=append",
            "--requeue", f"--signal=TERM@{SIGNAL_SECONDS}", "--kill-on-invalid-dep=yes"]
    task = f'exec srun --ntasks=1 {python} -m hf_condinit.study --out {shlex.quote(out)} --slot "$SLURM_ARRAY_TASK_ID"'
    every = rounds(plan)
    todo = [(r, idx) for r, idx in enumerate(_pending(plan, out, idx) for idx in every) if idx]
    result = [(f"round {r + 1} of {len(every)}: slots {_ranges(idx)}",
               [*base, f"--output={logs}/slurm-%A_%a.out", *options, f"--array={_ranges(idx)}", f"--wrap={task}"])
              for r, idx in todo]
    if result:
        report = f"exec {python} -m hf_condinit.study --out {shlex.quote(out)} --report"
        result.append(("report", [*base, f"--output={logs}/slurm-%j.out", *options, f"--wrap={report}"]))
    return result


def submit_script(plan: Plan, out: str, options: list[str] = ()) -> str:
    """A bash script that submits :func:`jobs` (``bash`` it; it prints each job's id). Creates ``OUT/logs``."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    todo = jobs(plan, out, options)
    out = os.path.abspath(out)
    lines = ["#!/bin/bash",
             f"# The study in {out} on SLURM: {len(todo)} jobs, each after the one before (python -m hf_condinit.study",
             "# --slurm; docs/study.md). Run it with bash. Submitting again later runs only what is left then.",
             "set -euo pipefail"]
    if not todo:
        lines.append(f"echo 'nothing left to run in {out}'")
    dep = ""
    for label, args in todo:
        lines.append(f"job=$(sbatch --parsable{dep} {' '.join(map(shlex.quote, args))})")
        lines.append(f"job=${{job%%;*}}; echo {shlex.quote(label)}: job $job")
        dep = " --dependency=afterok:$job"
    return "\n".join(lines) + "\n"


def submit(plan: Plan, out: str, options: list[str] = (), log=print) -> list[tuple[str, str]]:
    """Submit :func:`jobs` with ``sbatch``; returns ``(label, job id)`` per job. Creates ``OUT/logs``. ``ValueError``
    (one line) when ``sbatch`` is missing or refuses a job; the jobs already submitted are then cancelled."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    done: list[tuple[str, str]] = []
    for label, args in jobs(plan, out, options):
        dep = [f"--dependency=afterok:{done[-1][1]}"] if done else []
        try:
            proc = subprocess.run(["sbatch", "--parsable", *dep, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        except FileNotFoundError:
            raise ValueError("--submit: no sbatch here; run it on a SLURM login node, or print the script with "
                             "--slurm") from None
        if proc.returncode:
            if done:
                subprocess.run(["scancel", *[j for _, j in done]])
            lines = proc.stdout.strip().splitlines() or ["(no output)"]
            raise ValueError(f"--submit: sbatch refused the {label} job: {lines[-1]}"
                             + (f" (cancelled the jobs submitted before it: {' '.join(j for _, j in done)})"
                                if done else ""))
        done.append((label, proc.stdout.strip().split(";")[0]))
        log(f"{label}: job {done[-1][1]}")
    return done


def _requeue_self(log) -> None:
    """Put this SLURM job back in the queue while it is still running (a signal, a coming time limit); not once it
    was cancelled or is ending (``JobState`` other than RUNNING)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True).stdout
    state = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")), "unknown")
    if state != "RUNNING":
        log(f"SLURM job {job} is {state}: not requeued")
        return
    done = subprocess.run(["scontrol", "requeue", job], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log(f"SLURM job {job} requeued" if done.returncode == 0 else
        f"SLURM job {job}: scontrol requeue failed: {done.stdout.strip()}")


def run_task(plan: Plan, out: str, index: int, log=print) -> int:
    """Run slot ``index`` (an array task); returns the exit code: 0 when its cell is finished or failed (or it has
    none), 1 when the cell is left unfinished. ``ValueError`` when the slot's rate is not decided yet (the task ran
    before its round); :class:`StudyPreempted` after a SIGTERM, once the job is requeued (under SLURM)."""
    work = slots(plan)
    if not 0 <= index < len(work):
        raise ValueError(f"--slot {index}: the study has {len(work)} slots (0-{len(work) - 1})")
    cell = resolve(plan, work[index], outcome_of(plan, out))
    if cell == WAIT:
        raise ValueError(f"--slot {index}: its arm's learning rate is not chosen yet (the slots of the rounds before "
                         "it are not all done); submit the study with --submit or the script of --slurm, which run "
                         "each round after the one before")
    try:
        run_worker(plan, out, only=index, log=log)
    except StudyPreempted:
        _requeue_self(log)
        raise
    if isinstance(cell, Cell) and cell_state(plan, cell, out)[0] == "todo":
        log(f"slot {index}: {cell.key} is not finished (its log: {os.path.join(out, 'logs', cell.key + '.log')})")
        return 1
    return 0
