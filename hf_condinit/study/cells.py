"""Running a study's cells: the state of each cell on disk, claims, one run of the wrapped command, the worker loop.

Files under ``<out>`` (``key``: :attr:`hf_condinit.study.plan.Cell.key`):

- ``arms/<arm>/seed<S>_lr<LR>/``: the run folder, the command's ``--output_dir``. A cell is **finished** when it holds
  ``train_results.json`` and the study's metric in ``eval_results.json`` / ``all_results.json``.
- ``failed/<key>.json``: the record of a **failed** cell: the command exited with a code other than 0, 2 and 75 and
  was not killed by a signal (a non-finite loss exits 1). A failed cell is not rerun; it counts as worse than any
  finished one on the grid; delete the record to retry it.
- ``claims/<key>.lock``: the cell's claim (:mod:`hf_condinit.locks`), held with ``flock`` by the worker running
  the cell **and** by the command itself (the lock's file descriptor is passed to it), so a claim stays alive while
  either lives and the kernel drops it when both are gone: a dead claim is simply taken again. The file names the
  host and PID of its claimant; the worker removes it when the cell's command has ended.
- ``logs/<key>.log``: the command's output, appended on every attempt.

A cell whose command exits 75 (preempted: ``run_clm.py`` saved a checkpoint; docs/pretraining.md, "Faults and
preemption") or dies by a signal is unfinished: the next worker reruns it into the same folder, and the scripts
resume there. Exit code 2 is a user error of the command: the worker stops with that line; so does a command that
exits 0 without leaving a finished run (no training, or no ``metric`` among its results). Before a plan is saved,
:func:`check_command` runs the command's own argument parser on every arm's first cell. The command runs with
the parent-death signal SIGTERM (Linux), so a worker killed outright takes its run down with it (the run saves a
checkpoint and exits 75), and a SIGTERM / SIGINT to the worker is passed on to the run and ends the worker with
exit 75 once the run has stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

from ..reporting.runs import lower_is_better, read_final_metrics
from ..locks import claimed, is_claimed
from .files import write_json
from .plan import WAIT, Cell, Plan, resolve, slots
from .recipes import parse_recipe

__all__ = ["PREEMPTED", "StudyPreempted", "cell_command", "cell_state", "check_command", "claimants",
           "failure_of", "outcome_of", "progress", "run_worker"]

PREEMPTED = 75


class StudyPreempted(Exception):
    """The worker got SIGTERM / SIGINT; its running cell stopped (and saved what it could)."""


def cell_command(plan: Plan, cell: Cell, out: str) -> list[str]:
    """The command line of one cell: the wrapped command (a ``.py`` first word runs with this Python) plus the
    arm's flags, ``--seed``, ``--learning_rate`` (when the study sets it) and ``--output_dir``."""
    cmd = list(plan.command)
    if cmd[0].endswith(".py"):
        cmd.insert(0, sys.executable)
    return cmd + _cell_flags(cell, out)


def _cell_flags(cell: Cell, out: str) -> list[str]:
    flags = parse_recipe(cell.arm).flags() + ["--seed", str(cell.seed)]
    if cell.lr is not None:
        flags += ["--learning_rate", f"{cell.lr:g}"]
    return flags + ["--output_dir", os.path.abspath(cell.folder(out))]


#: Run in a fresh Python by :func:`check_command`: loads the script (argv[1]) as a module, calls its ``parse(argv)``
#: on each argv of the JSON list argv[2]; prints ``STUDY_CHECK <json>`` (per argv: the parsed ``do_train``, or None
#: where the result has none), or the parser's error as its last line and exit 2.
_CHECK = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_study_command_check", sys.argv[1])
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
spec.loader.exec_module(module)
if not callable(getattr(module, "parse", None)):
    print("STUDY_CHECK null")
    sys.exit(0)

def do_train(parsed, depth=0):
    if hasattr(parsed, "do_train"):
        return bool(parsed.do_train)
    if isinstance(parsed, (tuple, list)) and depth < 2:
        return next((d for d in (do_train(x, depth + 1) for x in parsed) if d is not None), None)
    return None

found = []
for argv in json.loads(sys.argv[2]):
    try:
        found.append(do_train(module.parse(argv)))
    except SystemExit as e:  # argparse: its message is on stderr already
        sys.exit(2 if e.code else 0)
    except Exception as e:  # a ValueError is the scripts' user error (UsageError): its message says it all
        print(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
print("STUDY_CHECK " + json.dumps(found))
"""


def check_command(plan: Plan, out: str) -> str | None:
    """Check the wrapped command before anything is saved: its script (the first word ending in ``.py``, with the
    words after it) is loaded in a fresh Python and its own ``parse(argv)`` (the example scripts' parser) runs on
    every arm's first cell. ``ValueError`` with the parser's line when it refuses a cell, or when the parsed
    training arguments do not train (``--do_train`` missing while another ``--do_*`` is given). Returns None, or
    why nothing was checked (no ``.py`` script, or one without ``parse``)."""
    at = next((i for i, w in enumerate(plan.command) if w.endswith(".py")), None)
    if at is None:
        return "no .py script in the command"
    script = os.path.join(plan.workdir, plan.command[at])
    first = slots(plan)[0][1]  # a ("cell", Cell) slot: the grid's first, or the one rate's
    argvs = [plan.command[at + 1:] + _cell_flags(Cell(a, first.seed, first.lr), out) for a in plan.arms]
    proc = subprocess.run([sys.executable, "-c", _CHECK, script, json.dumps(argvs)], cwd=plan.workdir,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise ValueError(f"the command's own parser refused it ({plan.command[at]} exited {proc.returncode}): "
                         f"{lines[-1] if lines else '(no output)'} (nothing saved; when the cells run on another "
                         "machine, e.g. with a GPU this one lacks, --skip_check saves the plan unchecked)")
    found = next((json.loads(line.split(" ", 1)[1]) for line in reversed(proc.stdout.splitlines())
                  if line.startswith("STUDY_CHECK ")), None)
    if found is None:
        return f"{plan.command[at]} has no parse(argv) function"
    if False in found:
        raise ValueError("the command does not train (it has another --do_* flag but not --do_train): add "
                         "--do_train (and --do_eval for the metric)")
    return None


def _path(out: str, kind: str, cell: Cell) -> str:
    ext = {"failed": "json", "claims": "lock", "logs": "log"}[kind]
    return os.path.join(out, kind, f"{cell.key}.{ext}")


def cell_state(plan: Plan, cell: Cell, out: str) -> tuple[str, float | None]:
    """``("finished", metric)``, ``("failed", None)`` or ``("todo", None)`` (module docstring)."""
    folder = cell.folder(out)
    if os.path.isfile(os.path.join(folder, "train_results.json")):
        value = read_final_metrics(folder).get(plan.metric)
        if value is not None:
            return "finished", float(value)
    if os.path.isfile(_path(out, "failed", cell)):
        return "failed", None
    return "todo", None


def outcome_of(plan: Plan, out: str):
    """``outcome(cell)`` for :func:`hf_condinit.study.plan.arm_rates`: the metric with the sign that makes lower
    better, ``inf`` for a failed (or non-finite) run, None when unfinished."""
    sign = 1.0 if lower_is_better(plan.metric) else -1.0

    def outcome(cell: Cell):
        state, value = cell_state(plan, cell, out)
        if state == "todo":
            return None
        return sign * value if state == "finished" and math.isfinite(value) else float("inf")

    return outcome


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a killed worker leaves its run going, which finishes or holds the claim until it ends


@contextlib.contextmanager
def _forward_signals(proc_ref: list):
    """SIGTERM / SIGINT during the block go to the running command (``proc_ref[0]``) and are remembered."""
    got: list[int] = []

    def handler(signum, frame):
        got.append(signum)
        if proc_ref and proc_ref[0].poll() is None:
            proc_ref[0].send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_cell(plan: Plan, cell: Cell, out: str, fd: int, log=print) -> str:
    """Run one claimed cell (``fd``: its claim); returns its state afterwards. Raises ``ValueError`` when the command
    exits 2 (a user error) and :class:`StudyPreempted` when the worker was told to stop."""
    cmd = cell_command(plan, cell, out)
    log_path = _path(out, "logs", cell)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    log(f"run {cell.key}: {' '.join(cmd)}")
    proc_ref: list = []
    with open(log_path, "a", encoding="utf-8") as logf, _forward_signals(proc_ref) as got:
        logf.write(f"\n$ {' '.join(cmd)}\n")
        logf.flush()
        proc_ref.append(subprocess.Popen(cmd, cwd=plan.workdir, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, pass_fds=(fd,), preexec_fn=_die_with_parent))
        rc = proc_ref[0].wait()
    if rc == 2:
        raise ValueError(f"cell {cell.key}: the command exited 2 (a user error): {_last_line(log_path)} (log: "
                         f"{log_path})")
    if rc not in (0, PREEMPTED) and rc > 0:
        write_json(_path(out, "failed", cell), dict(cell=cell.key, exit_code=rc, error=_last_line(log_path),
                                                    command=cmd, at=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    state = cell_state(plan, cell, out)[0]
    if rc == 0 and state == "todo":
        raise ValueError(f"cell {cell.key}: the command ended (exit 0) without train_results.json and "
                         f"{plan.metric} in {cell.folder(out)}: does it train and evaluate (e.g. --do_train "
                         "--do_eval), and is --metric one of its eval results?")
    log(f"{cell.key}: exit {rc}, {state}")
    if got:
        raise StudyPreempted(f"signal {signal.Signals(got[0]).name}: {cell.key} stopped (exit {rc}); rerun the same "
                             "command to go on")
    return state


def failure_of(out: str, cell: Cell) -> dict:
    """The record of a failed cell: ``exit_code``, ``error`` (the command's last output line), ``command``, ``at``."""
    with open(_path(out, "failed", cell), encoding="utf-8") as f:
        return json.load(f)


def progress(plan: Plan, out: str) -> dict:
    """Where the study stands: ``done`` (cells finished or failed), ``failed`` (of those), ``running`` (unfinished
    cells a live process claims), ``left`` (every other slot that has or may get a cell: unfinished cells, slots
    waiting on a rate; an upper bound while a grid extension is undecided)."""
    outcome = outcome_of(plan, out)
    counts = dict(done=0, failed=0, running=0, left=0)
    for slot in slots(plan):
        cell = resolve(plan, slot, outcome)
        if cell is None:
            continue
        if cell == WAIT:
            counts["left"] += 1
        elif (state := cell_state(plan, cell, out)[0]) != "todo":
            counts["done"] += 1
            counts["failed"] += state == "failed"
        else:
            counts["running" if is_claimed(_path(out, "claims", cell)) else "left"] += 1
    return counts


def claimants(out: str) -> dict[int, str]:
    """PID -> cell key of every claim file under ``out`` that names a process of this host as its claimant (a
    worker's cell; the file stays after its worker died, until the next claimant writes its own name)."""
    folder, host, found = os.path.join(out, "claims"), socket.gethostname(), {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                words = f.read().split()
        except OSError:
            continue
        if words[:3] == ["host", host, "pid"] and len(words) > 3 and words[3].isdigit():
            found[int(words[3])] = name.removesuffix(".lock")
    return found


def _last_line(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_worker(plan: Plan, out: str, *, only: int | None = None, poll: float = 30.0, log=print,
               after_cell=None) -> dict:
    """Run slots until none is left: every slot (or slot ``only``, a SLURM array task) in order, each resolved cell
    that is not finished, failed or claimed by a live process. Waits (``poll`` seconds at a time) while a slot waits
    on an arm's rate or on a cell another live worker holds; a cell it ran that is still unfinished (exit 75, killed)
    is not run again by this worker. ``after_cell()`` is called after each cell it ran. Returns counts: ``ran``,
    ``finished``, ``failed``, ``unfinished``."""
    work = slots(plan)
    if only is not None:
        if not 0 <= only < len(work):
            raise ValueError(f"array task {only}: the study has {len(work)} slots (0-{len(work) - 1})")
        work = [work[only]]
    counts = dict(ran=0, finished=0, failed=0, unfinished=0)
    tried: set = set()  # a cell this worker ran and that is still unfinished is left to the next worker
    while True:
        outcome = outcome_of(plan, out)
        busy = False
        for slot in work:
            cell = resolve(plan, slot, outcome)
            if cell is None or cell in tried:
                continue
            if cell == WAIT or cell_state(plan, cell, out)[0] != "todo":
                busy |= cell == WAIT and not counts["unfinished"]  # not on a cell this worker gave up on
                continue
            with claimed(_path(out, "claims", cell)) as fd:
                if fd is None:
                    busy = True
                    continue
                if cell_state(plan, cell, out)[0] == "todo":  # another worker finished it while we looked
                    state = run_cell(plan, cell, out, fd, log)
                    tried.add(cell)
                    counts["ran"] += 1
                    counts["unfinished" if state == "todo" else state] += 1
            if after_cell is not None:
                after_cell()
            break  # the state changed: resolve the slots again from the first
        else:
            if not busy:
                return counts
            time.sleep(poll)
