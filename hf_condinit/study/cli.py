"""The command line of ``python -m hf_condinit.study`` (console script ``hf-condinit-study``).

::

    hf-condinit-study --out STUDY --arms default conditioned [--seeds 3] [--lr 1e-3 3e-3 ...] [--metric eval_loss]
                      [--workers N] -- COMMAND ...        # plan (study.json) and run every cell, then the report
    hf-condinit-study --out STUDY                         # go on with the saved plan (a restart)
    hf-condinit-study --out STUDY --report                # report.md / report.json / figures from finished cells
    hf-condinit-study --out STUDY --export DEST           # the study's record without weights, and its report
    hf-condinit-study --out STUDY --submit [--slurm_option=--gpus-per-task=1 ...]   # the study as SLURM jobs
    hf-condinit-study --out STUDY --slurm [--slurm_option=...] > submit.sh         # the same, as a script to bash

``COMMAND`` is anything that takes ``--init``, ``--attention``, ``--seed``, ``--learning_rate`` and ``--output_dir``
(the example scripts: a first word ending in ``.py`` runs with this Python); the study adds those flags per cell, so
the command must not set them (``--learning_rate`` only without ``--lr``), nor an option an arm's recipe sets, nor a
flag of the study itself. The first run of a folder checks the command (its script's own parser, ``--do_train``)
and writes its plan; a later command on the folder may repeat the plan's flags, leave them out, or grow the plan
(more ``--seeds``, ``--arms``, ``--lr`` rates, ``--lr_extend``: only the new cells run), while a change that would
invalidate finished cells is refused. ``--workers N`` runs N worker processes (GPU i mod the visible count each when
GPUs are visible, else cores ÷ N torch threads each), replaces one that dies and prints progress lines; a user error
of the study or of the command is one line and exit 2; a SIGTERM / SIGINT stops the running cells (they save a
checkpoint) and exits 75; a study that ends with a failed or unfinished cell exits 1.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time

from ..commands import run_main
from ..errors import UsageError
from .cells import PREEMPTED, StudyPreempted, check_command, claimants, progress, run_worker
from .plan import Plan, grow, slots
from .recipes import parse_recipe

__all__ = ["console", "main"]

#: Flags the study sets on every cell.
STUDY_FLAGS = ("init", "attention", "seed", "output_dir")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2 through run_main, as every user error
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hf-condinit-study", description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --out STUDY [options] [-- COMMAND ...]")
    p.add_argument("--out", required=True, help="the study's folder: study.json, arms/ (the run folders), report.md")
    p.add_argument("--arms", nargs="+", help="recipes, the first is the baseline (conditioned, mimetic, "
                                             "conditioned:v_gain=0.25, default+affine_scaled, ...)")
    p.add_argument("--seeds", type=int, help="seeds 0 .. N-1 per arm (default 3)")
    p.add_argument("--lr", nargs="+", type=float, help="learning rates: one for every arm, or a grid (each arm's "
                                                       "rate chosen at --select_seed)")
    p.add_argument("--metric", help="final metric the verdict and the grid use (default eval_loss)")
    p.add_argument("--select_seed", type=int, help="seed that chooses each arm's rate on the grid (default 0)")
    p.add_argument("--lr_extend", type=int, help="how many times a grid may grow past an edge (default 1)")
    p.add_argument("--effect", help="the effect the report's seeds-needed figure is for: in the metric's units "
                                    "(0.02) or in %% of the baseline's mean (default 1%%)")
    p.add_argument("--plateau", type=float, help="the report's plateau rule: an arm whose metric gains less than "
                                                 "this over the last fifth of training, on average over its "
                                                 "seeds, is on a plateau; in the metric's units (default 0.005: "
                                                 "half a point of an accuracy in [0, 1])")
    p.add_argument("--workers", type=int, default=1, help="worker processes running cells at once (default 1)")
    p.add_argument("--threads", type=int, help="torch threads per worker (OMP_NUM_THREADS; default on the CPU "
                                               "with several workers: the cores ÷ workers)")
    p.add_argument("--poll_seconds", type=float, default=30.0,
                   help="how often a waiting worker looks again (default 30)")
    p.add_argument("--progress_seconds", type=float, default=30.0,
                   help="at most this often a progress line (done / running / left cells, time left) when a cell "
                        "finished (default 30; 0: none)")
    p.add_argument("--child_worker", action="store_true", help=argparse.SUPPRESS)  # a worker of --workers N
    p.add_argument("--no_report", action="store_true", help="run cells only; no report at the end")
    p.add_argument("--skip_check", action="store_true",
                   help="save a new or grown plan without running the command's parser on it first (e.g. a GPU "
                        "command planned on a machine without that GPU)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="write the report from the finished cells; run nothing")
    mode.add_argument("--export", metavar="DEST",
                      help="copy the study's record without weights or checkpoints (study.json, failed cells' "
                           "records, each cell's results, trainer_state.json, config, card and plots) to the new "
                           "folder DEST and write its report there; run nothing")
    mode.add_argument("--submit", action="store_true", help="submit the study to SLURM (sbatch: one job array per "
                                                            "round, then the report) and print the job ids")
    mode.add_argument("--slurm", action="store_true", help="print a bash script that submits what --submit does")
    mode.add_argument("--slot", type=int, help="run slot K only (what a SLURM array's task K runs)")
    p.add_argument("--slurm_option", action="append", default=[],
                   help="an extra sbatch option for --submit / --slurm, e.g. --slurm_option=--gpus-per-task=1 "
                        "(repeatable)")
    return p


def _flag_name(token: str) -> str | None:
    return token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None


def _check_arms(arms: list[str], command: list[str], lr_given: bool) -> None:
    """``ValueError`` for arms the study cannot run, or a command that sets what the study sets per cell, or that
    holds a flag of the study itself (written after ``--``)."""
    if len(arms) < 2:
        raise ValueError("--arms: give at least two recipes (the first is the baseline), e.g. --arms default "
                         "conditioned")
    if len(set(arms)) != len(arms):
        raise ValueError(f"--arms: a recipe is given twice ({' '.join(arms)})")
    recipes = [parse_recipe(a) for a in arms]
    if len({r.slug for r in recipes}) != len(recipes):
        raise ValueError("--arms: two recipes have the same folder name; write them differently")
    if not command:
        raise ValueError("no command: put it after --, e.g. -- run_clm.py --model_config gpt2-tiny --max_steps 200")
    own = {_flag_name(o) for a in _parser()._actions for o in a.option_strings} - {None, "help"}
    stray = sorted({n for n in map(_flag_name, command) if n in own})
    if stray:
        raise ValueError(f"{', '.join('--' + n for n in stray)} after -- goes to the command, but it is a flag of "
                         "the study: put it before --")
    taken = set(STUDY_FLAGS) | ({"learning_rate"} if lr_given else set())
    taken |= {k for r in recipes for k, _ in r.options}
    clash = sorted({n for n in map(_flag_name, command) if n in taken})
    if clash:
        raise ValueError(f"the command sets {', '.join('--' + c for c in clash)}, which the study sets per cell; "
                         "remove it from the command")


def _new_plan(args, command: list[str]) -> Plan:
    """The plan the flags describe; ``ValueError`` for a bad one."""
    _check_arms(args.arms or [], command, bool(args.lr))
    seeds = 3 if args.seeds is None else args.seeds
    select = 0 if args.select_seed is None else args.select_seed
    extend = 1 if args.lr_extend is None else args.lr_extend
    if seeds < 1 or not 0 <= select < seeds or extend < 0:
        raise ValueError(f"--seeds {seeds} must be ≥ 1, --select_seed {select} one of them, "
                         f"--lr_extend {extend} ≥ 0")
    lrs = list(args.lr or [])
    if any(not x > 0 for x in lrs) or len(set(lrs)) != len(lrs):
        raise ValueError(f"--lr {' '.join(map(str, lrs))}: rates must be distinct and > 0")
    workdir = os.getcwd()
    if command[0].endswith(".py") and not os.path.isfile(os.path.join(workdir, command[0])):
        raise ValueError(f"the command's script {command[0]} is not in {workdir}")
    return Plan(arms=list(args.arms), seeds=seeds, lrs=lrs, command=command, workdir=workdir,
                metric=args.metric or "eval_loss", select_seed=select, lr_extend=extend,
                effect=args.effect or "1%", plateau=0.005 if args.plateau is None else args.plateau)


def _check_effect(effect: str | None) -> None:
    if effect is None:
        return
    try:
        value = float(effect[:-1]) if effect.endswith("%") else float(effect)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--effect {effect}: give an effect > 0 in the metric's units (0.02) or in % of the "
                         "baseline's mean (1%)")


def _plan(args, command: list[str], log) -> Plan:
    """The saved plan of ``--out``, grown by the flags given (:func:`hf_condinit.study.plan.grow`), or, for a new
    folder, the plan of the flags. A new or grown plan is checked (:func:`check_command`) before it is saved, so a
    refused one leaves ``--out`` as it was (no folder, for a new study)."""
    _check_effect(args.effect)
    if args.plateau is not None and not (math.isfinite(args.plateau) and args.plateau >= 0):
        raise ValueError(f"--plateau {args.plateau}: give a gain ≥ 0 in the metric's units (e.g. 0.005)")
    saved = Plan.load(args.out)
    if saved is None:
        if args.report or args.export or args.slot is not None:
            raise ValueError(f"{args.out}: no study there ({os.path.join(args.out, 'study.json')} is missing)")
        plan = _new_plan(args, command)
    else:
        asked = {"arms": args.arms, "seeds": args.seeds, "lrs": args.lr, "metric": args.metric,
                 "select_seed": args.select_seed, "lr_extend": args.lr_extend, "effect": args.effect,
                 "plateau": args.plateau}
        plan = grow(saved, asked, command)
        if plan.arms != saved.arms:
            _check_arms(plan.arms, plan.command, plan.grid or bool(plan.lrs))
        if plan == saved:
            return saved
    if (saved is None or plan.arms != saved.arms) and not args.skip_check:
        skipped = check_command(plan, args.out)
        if skipped:
            log(f"the command's flags are not checked before the first cell: {skipped}")
    plan.save(args.out)
    if saved is not None and plan.history != saved.history:
        log(f"the plan grew: {plan.history[-1]['added']}")
    return plan


def _threads(args, gpus: list[str]) -> str | None:
    """``OMP_NUM_THREADS`` for each worker: ``--threads``, else on the CPU with several workers the usable cores ÷
    workers (at least 1) unless ``OMP_NUM_THREADS`` is set already; None: leave it."""
    if args.threads is not None:
        return str(args.threads)
    if gpus or args.workers < 2 or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return str(max(1, cores // args.workers))


#: How many dead workers a study run replaces, per worker asked for (a cell that kills its worker every time, e.g.
#: out of memory, must not loop forever).
REPLACEMENTS_PER_WORKER = 2


def _run_workers(args, plan: Plan, log) -> int:
    """``--workers N``: N processes of this command, each one worker, watched: a worker that dies (a signal, or an
    exit other than 0, 2 and 75) is named with the cell it held, which is put back (its run ends with the worker and
    its claim with the run) and the worker replaced (at most ``REPLACEMENTS_PER_WORKER × N`` times); a progress line
    when cells finish (at most every ``--progress_seconds``, and every 10 minutes anyway). Returns 2 when a worker
    stopped on a user error, 75 when the study was stopped by a signal, else 0 (the caller checks the cells)."""
    gpus = _visible_gpus()
    threads = _threads(args, gpus)
    procs: dict[int, subprocess.Popen] = {}

    def start(i: int) -> None:
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {}),
                   **({"OMP_NUM_THREADS": threads} if threads else {}))
        cmd = [sys.executable, "-m", "hf_condinit.study", "--out", args.out, "--workers", "1", "--no_report",
               "--child_worker", "--poll_seconds", str(args.poll_seconds)]
        procs[i] = subprocess.Popen(cmd, env=env)
        log(f"worker {i + 1} of {args.workers}: pid {procs[i].pid}"
            + (f", GPU {env['CUDA_VISIBLE_DEVICES']}" if gpus else "")
            + (f", {threads} torch thread(s)" if threads else ""))

    stopping: list[int] = []

    def forward(signum, frame):
        stopping.append(signum)
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    codes, replaced, held = [], 0, {}
    t0, first = time.monotonic(), progress(plan, args.out)
    shown, last_shown = first, t0
    try:
        for i in range(args.workers):
            start(i)
        while procs:
            time.sleep(min(1.0, args.poll_seconds))
            seen = held  # the cells the workers held a moment ago: another worker may take a dead one's cell now
            held = claimants(args.out)
            for i, p in list(procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del procs[i]
                codes.append(rc)
                if rc in (0, 2) or stopping:
                    continue
                how = f"by signal {signal.Signals(-rc).name}" if rc < 0 else f"with exit code {rc}"
                cell = held.get(p.pid) or seen.get(p.pid)
                where = f" while running cell {cell}; the cell is put back" if cell else ""
                if replaced < REPLACEMENTS_PER_WORKER * args.workers:
                    replaced += 1
                    log(f"worker {i + 1} (pid {p.pid}) died {how}{where}; starting another in its place")
                    start(i)
                else:
                    log(f"worker {i + 1} (pid {p.pid}) died {how}{where}; {replaced} workers replaced already, "
                        "not replacing it")
            now = time.monotonic()
            if args.progress_seconds > 0 and now - last_shown >= args.progress_seconds:
                counts = progress(plan, args.out)
                if counts != shown or now - last_shown >= 600:
                    log(_progress_line(counts, first["done"], now - t0))
                    shown, last_shown = counts, now
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if 2 in codes:
        raise UsageError("a worker stopped on a user error (its line is above)")
    return PREEMPTED if stopping else 0


def _progress_line(counts: dict, done_before: int, elapsed: float) -> str:
    """``progress: D done, R running, L left; about T left`` (T: the cells still to do at this run's rate of
    finishing them, once one has finished)."""
    line = f"progress: {counts['done']} cells done, {counts['running']} running, {counts['left']} left"
    finished = counts["done"] - done_before
    if finished > 0 and counts["running"] + counts["left"]:
        eta = elapsed / finished * (counts["running"] + counts["left"])
        line += f"; about {_duration(eta)} left"
    return line


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _visible_gpus() -> list[str]:
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring. Returns 0, 1 (a cell failed or is left unfinished) or exits through
    ``run_main`` (2: user error, 75: stopped by a signal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    args = _parser().parse_args(own)
    log = lambda msg: print(f"hf-condinit-study: {msg}", flush=True)  # noqa: E731
    try:
        if args.workers < 1 or (args.threads is not None and args.threads < 1):
            raise ValueError(f"--workers {args.workers} and --threads {args.threads}: each must be ≥ 1")
        plan = _plan(args, command, log)
        if args.export:
            from .export import export_record
            from .report import write_report

            copied = export_record(args.out, args.export)
            report = write_report(plan, args.export)
            log(f"copied {len(copied)} files of {args.out} to {args.export} (no weights, no checkpoints) and wrote "
                f"its report.md and report.json" + "".join(f", {f}" for f in report["figures"]))
            return 0
        if args.slurm or args.submit or args.slot is not None:
            from . import slurm

            if args.slurm:
                sys.stdout.write(slurm.submit_script(plan, args.out, args.slurm_option))
                return 0
            if args.slot is not None:
                return slurm.run_task(plan, args.out, args.slot, log)
            if not slurm.submit(plan, args.out, args.slurm_option, log):
                log(f"nothing left to run in {args.out}")
            return 0
        if not args.report:
            if args.workers > 1:
                code = _run_workers(args, plan, log)
                if code:
                    return code
            else:
                if args.threads is not None:
                    os.environ["OMP_NUM_THREADS"] = str(args.threads)
                t0, first = time.monotonic(), progress(plan, args.out)
                show = (lambda: log(_progress_line(progress(plan, args.out), first["done"], time.monotonic() - t0))
                        ) if args.progress_seconds > 0 and not args.child_worker else None
                counts = run_worker(plan, args.out, poll=args.poll_seconds, log=log, after_cell=show)
                log(f"{counts['ran']} cell(s) run: {counts['finished']} finished, {counts['failed']} failed, "
                    f"{counts['unfinished']} not finished; {len(slots(plan))} slots in the plan")
        if args.report or not args.no_report:
            from .report import write_report

            report = write_report(plan, args.out)
            log(f"wrote {os.path.join(args.out, 'report.md')} and report.json"
                + "".join(f", {f}" for f in report["figures"]))
        if not (args.report or args.child_worker or args.slot is not None):
            counts = progress(plan, args.out)
            if counts["failed"] or counts["running"] or counts["left"]:
                log(f"not every cell finished: {counts['failed']} failed, {counts['running'] + counts['left']} not finished "
                    f"(report.md lists them; rerun the same command to go on): exit 1")
                return 1
    except StudyPreempted as e:
        log(str(e))
        sys.exit(PREEMPTED)
    except ValueError as e:
        raise UsageError(str(e)) from e
    return 0


def console() -> None:
    """The console script ``hf-condinit-study``: :func:`main` with the scripts' error convention (one line, exit 2)."""
    sys.exit(run_main(main, prog="hf-condinit-study"))
