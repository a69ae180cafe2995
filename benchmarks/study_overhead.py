"""What ``python -m hf_condinit.study`` costs on top of its cells: the same cells run by the study and run directly.

The cells are ``tests/study_fake_run.py`` (a stand-in training command that starts Python, writes a finished run's
files and exits: about the cost of starting a process), so nearly all of a cell's time is what any launcher pays,
and the difference is the study's own bookkeeping: planning and checking the command, claims, reading the cells'
state between cells, the progress lines and the report (tables, paired verdicts, power, two figures).

For each ``--seeds`` value, per repetition: (1) ``python -m hf_condinit.study`` on a fresh folder (one worker, a
2-rate grid, 2 arms), wall and CPU seconds of the whole process tree; (2) the very cells the study ran, in its
order, each started directly with ``subprocess.run`` (the baseline); (3) ``--report`` alone on the finished folder.
Overhead = (1) − (2); its part that grows with the cells is the slope between the two sizes (overhead difference ÷
cell difference), the rest is paid once per study (its start, the command check, the report). Each figure is the
smallest of the repetitions. Wall times on a shared machine carry its load; CPU times (``getrusage`` of the
children) do not wait for a core.

    python benchmarks/study_overhead.py [--seeds 2 8] [--repeats 2] [--out benchmarks/results/study_overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from hf_condinit.study.cells import cell_command  # noqa: E402
from hf_condinit.study.plan import Cell, Plan  # noqa: E402

FAKE = os.path.join(REPO, "tests", "study_fake_run.py")
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=REPO,
           OMP_NUM_THREADS="1")


def _timed(fn):
    """Wall and child CPU seconds (user + system of waited-for children) of ``fn()``."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    fn()
    r1, t1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def one_repeat(seeds: int, work: str) -> dict:
    study_out, direct_out = os.path.join(work, "study"), os.path.join(work, "direct")
    cmd = [sys.executable, "-m", "hf_condinit.study", "--out", study_out, "--arms", "default", "mimetic", "--seeds",
           str(seeds), "--lr", "1e-3", "3e-3", "--poll_seconds", "0.2", "--", FAKE]
    study_wall, study_cpu = _timed(lambda: subprocess.run(cmd, env=ENV, cwd=REPO, check=True,
                                                          stdout=subprocess.DEVNULL))
    plan = Plan.load(study_out)
    with open(os.path.join(study_out, "report.json"), encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["state"] == "finished"]
    def direct():
        for c in cells:
            subprocess.run(cell_command(plan, Cell(c["arm"], c["seed"], c["lr"]), direct_out), env=ENV,
                           cwd=plan.workdir, check=True, stdout=subprocess.DEVNULL)

    direct_wall, direct_cpu = _timed(direct)
    report_wall, report_cpu = _timed(lambda: subprocess.run(
        [sys.executable, "-m", "hf_condinit.study", "--out", study_out, "--report"], env=ENV, cwd=REPO, check=True,
        stdout=subprocess.DEVNULL))
    return dict(cells=len(cells), study_wall_s=study_wall, study_cpu_s=study_cpu, direct_wall_s=direct_wall,
                direct_cpu_s=direct_cpu, report_wall_s=report_wall, report_cpu_s=report_cpu,
                overhead_wall_s=study_wall - direct_wall, overhead_cpu_s=study_cpu - direct_cpu,
                overhead_wall_per_cell_s=(study_wall - direct_wall) / len(cells),
                overhead_cpu_per_cell_s=(study_cpu - direct_cpu) / len(cells))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs=2, default=[2, 8], help="two study sizes (seeds per arm)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "study_overhead"))
    args = p.parse_args(argv)
    command = f"python benchmarks/study_overhead.py --seeds {args.seeds[0]} {args.seeds[1]} --repeats {args.repeats}"
    reps = {s: [] for s in args.seeds}
    for _ in range(args.repeats):
        for seeds in args.seeds:
            with tempfile.TemporaryDirectory() as work:
                reps[seeds].append(one_repeat(seeds, work))
            print(json.dumps(dict(seeds=seeds, **reps[seeds][-1])), flush=True)
    best = {}
    for s, rs in reps.items():
        b = {k: min(r[k] for r in rs) for k in ("cells", "study_wall_s", "study_cpu_s", "direct_wall_s",
                                                "direct_cpu_s", "report_wall_s", "report_cpu_s")}
        best[s] = dict(b, **{f"overhead_{u}_s": b[f"study_{u}_s"] - b[f"direct_{u}_s"] for u in ("wall", "cpu")})
    small, big = (best[s] for s in args.seeds)
    dc = big["cells"] - small["cells"]
    slope = {u: (big[f"overhead_{u}_s"] - small[f"overhead_{u}_s"]) / dc for u in ("wall", "cpu")}
    lines = ["| | " + " | ".join(f"{b['cells']} cells: wall s | CPU s" for b in (small, big)) + " |",
             "|---|---:|---:|---:|---:|"]
    for label, key in [("study (report included)", "study"), ("the same cells started directly (baseline)", "direct"),
                       ("overhead: study − direct", "overhead"), ("of it: `--report` alone", "report")]:
        lines.append(f"| {label} | " + " | ".join(f"{b[key + '_wall_s']:.1f} | {b[key + '_cpu_s']:.1f}"
                                                   for b in (small, big)) + " |")
    lines.append("| study ÷ direct | " + " | ".join(f"{b['study_wall_s'] / b['direct_wall_s']:.2f} | "
                                                    f"{b['study_cpu_s'] / b['direct_cpu_s']:.2f}"
                                                    for b in (small, big)) + " |")
    md = "\n".join([f"Command: `{command}` (smallest of {args.repeats} repetitions; {time.strftime('%Y-%m-%d')}, "
                    f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}). Cells: tests/study_fake_run.py, a "
                    "process start and a few files each.", "", *lines, "",
                    f"Overhead per additional cell: {slope['wall']:.2f} s wall, {slope['cpu']:.2f} s CPU; paid once "
                    f"per study: {small['overhead_wall_s'] - slope['wall'] * small['cells']:.1f} s wall, "
                    f"{small['overhead_cpu_s'] - slope['cpu'] * small['cells']:.1f} s CPU."]) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "record.json"), "w", encoding="utf-8") as f:
        json.dump(dict(command=command, repeats={str(k): v for k, v in reps.items()},
                       best={str(k): v for k, v in best.items()}, per_cell=slope, load=os.getloadavg()[0]), f,
                  indent=1)
    with open(os.path.join(args.out, "record.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
