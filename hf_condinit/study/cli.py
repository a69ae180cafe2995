"""The command line of ``python -m hf_condinit.study`` (console script ``hf-condinit-study``).

::

    hf-condinit-study --out STUDY --arms default conditioned [--seeds 3] [--lr 1e-3 3e-3 ...] [--metric eval_loss]
                      [--workers N] -- COMMAND ...        # plan (study.json) and run every cell, then the report
    hf-condinit-study --out STUDY                         # go on with the saved plan (a restart)
    hf-condinit-study --out STUDY --report                # report.md / report.json / figures from finished cells
    hf-condinit-study --out STUDY --slurm [--slurm_option=--gpus-per-task=1 ...] > study.sbatch

``COMMAND`` is anything that takes ``--init``, ``--attention``, ``--seed``, ``--learning_rate`` and ``--output_dir``
(the example scripts: a first word ending in ``.py`` runs with this Python); the study adds those flags per cell, so
the command must not set them (``--learning_rate`` only without ``--lr``), nor an option an arm's recipe sets. The
first run of a folder writes its plan; a later command on the folder may repeat the plan's flags or leave them out,
but a changed one is refused. ``--workers N`` runs N worker processes (GPU i mod the visible count each when GPUs are
visible); a user error of the study or of the command is one line and exit 2; a SIGTERM / SIGINT stops the running
cells (they save a checkpoint) and exits 75.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from ..scripts.errors import UsageError, run_main
from .cells import PREEMPTED, StudyPreempted, run_worker
from .plan import Plan, slots
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
    p.add_argument("--workers", type=int, default=1, help="worker processes running cells at once (default 1)")
    p.add_argument("--poll_seconds", type=float, default=30.0,
                   help="how often a waiting worker looks again (default 30)")
    p.add_argument("--no_report", action="store_true", help="run cells only; no report at the end")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="write the report from the finished cells; run nothing")
    mode.add_argument("--slurm", action="store_true", help="print the SLURM array script; run nothing")
    mode.add_argument("--slot", type=int, help="run slot K only (what the SLURM array's task K runs)")
    p.add_argument("--slurm_option", action="append", default=[],
                   help="an extra #SBATCH option for --slurm, e.g. --slurm_option=--gpus-per-task=1 (repeatable)")
    return p


def _flag_name(token: str) -> str | None:
    return token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None


def _new_plan(args, command: list[str]) -> Plan:
    """The plan the flags describe; ``ValueError`` for a bad one."""
    if not args.arms or len(args.arms) < 2:
        raise ValueError("--arms: give at least two recipes (the first is the baseline), e.g. --arms default "
                         "conditioned")
    if len(set(args.arms)) != len(args.arms):
        raise ValueError(f"--arms: a recipe is given twice ({' '.join(args.arms)})")
    recipes = [parse_recipe(a) for a in args.arms]
    if len({r.slug for r in recipes}) != len(recipes):
        raise ValueError("--arms: two recipes have the same folder name; write them differently")
    if not command:
        raise ValueError("no command: put it after --, e.g. -- run_clm.py --model_config gpt2-tiny --max_steps 200")
    taken = set(STUDY_FLAGS) | ({"learning_rate"} if args.lr else set())
    taken |= {k for r in recipes for k, _ in r.options}
    clash = sorted({n for n in map(_flag_name, command) if n in taken})
    if clash:
        raise ValueError(f"the command sets {', '.join('--' + c for c in clash)}, which the study sets per cell; "
                         "remove it from the command")
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
                metric=args.metric or "eval_loss", select_seed=select, lr_extend=extend)


def _plan(args, command: list[str]) -> Plan:
    """The saved plan of ``--out`` (checked against any flag given) or, for a new folder, the plan of the flags,
    saved."""
    saved = Plan.load(args.out)
    given = {k: getattr(args, k) for k in ("arms", "seeds", "lr", "metric", "select_seed", "lr_extend")}
    if saved is None:
        if args.report or args.slot is not None:
            raise ValueError(f"{args.out}: no study there ({os.path.join(args.out, 'study.json')} is missing)")
        plan = _new_plan(args, command)
        plan.save(args.out)
        return plan
    asked = {"arms": saved.arms, "seeds": saved.seeds, "lr": saved.lrs, "metric": saved.metric,
             "select_seed": saved.select_seed, "lr_extend": saved.lr_extend}
    changed = [f"--{k} was {asked[k]}, now {v}" for k, v in given.items() if v is not None and v != asked[k]]
    if command and command != saved.command:
        changed.append(f"the command was {' '.join(saved.command)!r}, now {' '.join(command)!r}")
    if changed:
        raise ValueError(f"{os.path.join(args.out, 'study.json')} was planned with other flags ({'; '.join(changed)}): "
                         "use another --out, or the same flags (--out alone goes on with the saved plan)")
    return saved


def _run_workers(args, log) -> int:
    """``--workers N``: N processes of this command, each one worker; returns the exit code."""
    gpus = _visible_gpus()
    procs = []
    for i in range(args.workers):
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {}))
        cmd = [sys.executable, "-m", "hf_condinit.study", "--out", args.out, "--workers", "1", "--no_report",
               "--poll_seconds", str(args.poll_seconds)]
        procs.append(subprocess.Popen(cmd, env=env))
        log(f"worker {i + 1} of {args.workers}: pid {procs[-1].pid}" + (f", GPU {env['CUDA_VISIBLE_DEVICES']}"
                                                                         if gpus else ""))

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        codes = [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if 2 in codes:
        raise UsageError("a worker stopped on a user error (its line is above)")
    return PREEMPTED if PREEMPTED in codes else max(codes)


def _visible_gpus() -> list[str]:
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring. Returns 0, or exits through ``run_main`` (2: user error, 75: stopped
    by a signal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    args = _parser().parse_args(own)
    log = lambda msg: print(f"hf-condinit-study: {msg}", flush=True)  # noqa: E731
    try:
        if args.workers < 1:
            raise ValueError(f"--workers {args.workers}: must be ≥ 1")
        plan = _plan(args, command)
        if args.slurm:
            from .slurm import sbatch_script

            sys.stdout.write(sbatch_script(plan, args.out, args.slurm_option, args.poll_seconds))
            return 0
        if not args.report:
            if args.workers > 1:
                code = _run_workers(args, log)
                if code:
                    return code
            else:
                counts = run_worker(plan, args.out, only=args.slot, poll=args.poll_seconds, log=log)
                log(f"{counts['ran']} cell(s) run: {counts['finished']} finished, {counts['failed']} failed, "
                    f"{counts['unfinished']} not finished; {len(slots(plan))} slots in the plan")
        if args.report or not (args.no_report or args.slot is not None):
            from .report import write_report

            report = write_report(plan, args.out)
            log(f"wrote {os.path.join(args.out, 'report.md')} and report.json"
                + "".join(f", {f}" for f in report["figures"]))
    except StudyPreempted as e:
        log(str(e))
        sys.exit(PREEMPTED)
    except ValueError as e:
        raise UsageError(str(e)) from e
    return 0


def console() -> None:
    """The console script ``hf-condinit-study``: :func:`main` with the scripts' error convention (one line, exit 2)."""
    sys.exit(run_main(main, prog="hf-condinit-study"))
