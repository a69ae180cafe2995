"""Kill ``run_clm.py`` at random moments, rerun the same command, and check the rerun ends with the uninterrupted model.

One uninterrupted run (tiny GPT-2 on TinyStories, ``--max_steps 40 --save_steps 5``, one thread) gives the reference
weights. Then ``--kills`` times: a fresh ``--output_dir``, the same command started, and one fault at a random
moment: ``SIGKILL`` during training (once a random step is logged, plus 0-50 ms), ``SIGKILL`` during a checkpoint
save (the 1st, 2nd or 3rd: the moment its staging folder appears, plus 0-40 ms), or ``SIGTERM`` during training (the clean stop: checkpoint, exit 75); then the same command again,
to the end. Recorded per kill: the fault, the step the run had reached (its last logged step), the step the rerun
resumed from (its log line), the steps lost (their difference), the exit codes, and whether the rerun's final
``model.safetensors`` equals the reference's bit for bit. The goal: every rerun equal, no step lost on SIGTERM, and
at most the steps since the last checkpoint on SIGKILL.

    python benchmarks/fault_injection.py --kills 24    # writes benchmarks/results/faults/record.{json,md}, lost.png
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from _common import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "faults"
TINYSTORIES = ROOT.parent / "shared" / "data" / "tinystories" / "TinyStories-train.sample-2MiB.txt"
FAULTS = ("SIGKILL in training", "SIGKILL in a save", "SIGTERM in training")
STEP_LINE = re.compile(r"'epoch': '([0-9.]+)'")
RESUME_LINE = re.compile(r"resuming from \S*checkpoint-(\d+)")


def command(out: Path, steps: int, every: int) -> list[str]:
    return [sys.executable, str(ROOT / "run_clm.py"), "--output_dir", str(out), "--use_cpu", "--report_to", "none",
            "--disable_tqdm", "true", "--seed", "3", "--model_config", "gpt2-tiny", "--train_file", str(TINYSTORIES),
            "--block_size", "64", "--tokenizer_vocab_size", "512", "--max_steps", str(steps),
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--do_train", "--save_strategy", "steps",
            "--save_steps", str(every), "--logging_steps", "1", "--max_train_samples", "400"]


def environment() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")


def logged_steps(log: str) -> int:
    """The number of training steps a run logged (``--logging_steps 1``: one loss line per step)."""
    return sum(1 for line in log.splitlines() if line.startswith("{'loss'"))


def start(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, object]:
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(), cwd=ROOT), log


def one_fault(fault: str, out: Path, cmd: list[str], rng: random.Random, steps: int) -> dict:
    """Start ``cmd``, inject ``fault`` (in training: once a random step in [1, steps - 2] is logged, plus 0-50 ms),
    return what happened (the rerun is the caller's)."""
    proc, log = start(cmd, out.parent / f"{out.name}-killed.log")
    begun = time.monotonic()
    text = ""
    while logged_steps(text) == 0 and proc.poll() is None:  # wait for training to begin
        time.sleep(0.05)
        text = open(log.name).read()
    if fault == "SIGKILL in a save":
        staging = out / ".checkpoint-staging"
        target = rng.randrange(1, 4)  # the 1st, 2nd or 3rd save of the run
        seen = 0
        while proc.poll() is None:
            if staging.exists():
                seen += 1
                if seen == target:
                    time.sleep(rng.uniform(0, 0.04))
                    break
                while staging.exists() and proc.poll() is None:
                    time.sleep(0.001)
            time.sleep(0.001)
        sig = signal.SIGKILL
    else:
        target = rng.randrange(1, steps - 1)
        while logged_steps(open(log.name).read()) < target and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        sig = signal.SIGKILL if fault.startswith("SIGKILL") else signal.SIGTERM
    steps_before = logged_steps(open(log.name).read())
    if proc.poll() is None:
        proc.send_signal(sig)
    code = proc.wait(timeout=600)
    log.close()
    text = open(log.name).read()
    complete = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    return {"fault": fault, "seconds_after_start": round(time.monotonic() - begun, 2), "step_reached": steps_before,
            "exit_code": code, "checkpoints_left": sorted(complete)}


def run(args) -> dict:
    prov = provenance()  # the code this process loaded, before any run
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="faults-", dir=args.work))
    ref_out = work / "reference"
    began = time.monotonic()
    proc, log = start(command(ref_out, args.steps, args.every), work / "reference.log")
    assert proc.wait() == 0, open(log.name).read()[-3000:]
    ref_seconds = time.monotonic() - began
    reference = load_file(ref_out / "model.safetensors")
    kills = []
    for i in range(args.kills):
        fault = FAULTS[i % len(FAULTS)]
        out = work / f"kill{i:02d}"
        cmd = command(out, args.steps, args.every)
        rec = one_fault(fault, out, cmd, rng, args.steps)
        proc, log = start(cmd, work / f"kill{i:02d}-rerun.log")
        rec["rerun_exit_code"] = proc.wait(timeout=900)
        text = open(log.name).read()
        resumed = RESUME_LINE.search(text)
        rec["resumed_from"] = int(resumed.group(1)) if resumed else 0
        rec["steps_lost"] = max(rec["step_reached"] - rec["resumed_from"], 0)
        final = out / "model.safetensors"
        rec["equal_to_uninterrupted"] = final.exists() and all(
            torch.equal(a, b) for a, b in zip(reference.values(), load_file(final).values()))
        rec["folders"] = sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", "damaged-")))
        kills.append(rec)
        print(f"kill {i + 1}/{args.kills}: {fault:22s} step {rec['step_reached']:3d} -> resumed from "
              f"{rec['resumed_from']:3d} (lost {rec['steps_lost']}), exit {rec['exit_code']}, rerun exit "
              f"{rec['rerun_exit_code']}, equal: {rec['equal_to_uninterrupted']}", flush=True)
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    cmd_line = "python benchmarks/fault_injection.py " + " ".join(
        f"--{k} {v}" for k, v in (("kills", args.kills), ("steps", args.steps), ("every", args.every),
                                   ("seed", args.seed)))
    return {**prov, "command": cmd_line, "steps": args.steps, "save_steps": args.every, "seed": args.seed,
            "reference_seconds": round(ref_seconds, 1), "kills": kills}


def summarize(record: dict) -> list[dict]:
    rows = []
    for fault in FAULTS:
        ks = [k for k in record["kills"] if k["fault"] == fault]
        if ks:
            lost = [k["steps_lost"] for k in ks]
            rows.append({"fault": fault, "kills": len(ks), "equal": sum(k["equal_to_uninterrupted"] for k in ks),
                         "reruns_exit_0": sum(k["rerun_exit_code"] == 0 for k in ks),
                         "lost_mean": round(sum(lost) / len(lost), 2), "lost_max": max(lost),
                         "exit_codes": sorted({k["exit_code"] for k in ks})})
    return rows


def markdown(record: dict) -> str:
    rows = summarize(record)
    total = len(record["kills"])
    equal = sum(k["equal_to_uninterrupted"] for k in record["kills"])
    lines = [f"# Faults and preemption: {equal} of {total} reruns ended equal to the uninterrupted run",
             "", f"`{record['command']}` (commit {(record.get('commit') or '?')[:7]}, torch {record['versions']['torch']}; "
             f"{record['steps']} steps, a checkpoint every {record['save_steps']}).", "",
             "| fault | kills | rerun equal (bit for bit) | rerun exit 0 | steps lost: mean | max | exit codes of the killed run |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['fault']} | {r['kills']} | {r['equal']} | {r['reruns_exit_0']} | {r['lost_mean']} | "
                     f"{r['lost_max']} | {', '.join(map(str, r['exit_codes']))} |")
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for fault, marker in zip(FAULTS, "oxs"):
        ks = [k for k in record["kills"] if k["fault"] == fault]
        ax.scatter([k["step_reached"] for k in ks], [k["steps_lost"] for k in ks], marker=marker, label=fault)
    ax.set_xlabel("step reached when the fault came")
    ax.set_ylabel("steps lost")
    ax.set_title(f"checkpoint every {record['save_steps']} steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="where the runs go (a temporary folder by default)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if not TINYSTORIES.exists():
        parser.error(f"needs {TINYSTORIES} (the project's shared data)")
    record = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record, indent=1))
    (out / "record.md").write_text(markdown(record))
    plot(record, out / "lost.png")
    print(markdown(record))


if __name__ == "__main__":
    main()
