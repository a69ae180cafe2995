"""Kill ``run_clm.py`` at random moments, damage its checkpoints, rerun the same command, and check the rerun ends with
the uninterrupted run.

One uninterrupted run (tiny GPT-2 on TinyStories, ``--max_steps`` = ``--steps``, ``--save_steps`` = ``--every``,
one thread, evaluated at the end on 32 blocks of the same text) gives the reference: the final weights, ``eval_loss`` and ``train_loss``. Then
``--kills`` times, in turn, a fresh ``--output_dir``, the same command started, and one fault:

- ``SIGKILL in training``: once a random step is logged, plus 0-50 ms;
- ``SIGKILL in a save``: the 1st, 2nd or 3rd save, the moment its staging folder appears, plus 0-40 ms;
- ``SIGTERM in training``: the clean stop (checkpoint, exit 75);
- ``SIGKILL after the last checkpoint``: once ``checkpoint-<max_steps>`` appears, plus 0-300 ms (the final model, the
  result files, the evaluation);
- ``SIGKILL in the final writes``: the moment the final ``model.safetensors``, ``train_results.json``,
  ``trainer_state.json`` or ``eval_results.json`` appears in ``--output_dir``;

then, once per file of a checkpoint (its manifest included), ``corrupt <file>``: the run SIGKILLed once its 4th
checkpoint appears, and 4 KiB of random bytes (half the file when it is smaller) written over that file of the newest
checkpoint at a random offset, its size unchanged. Then the same command again, to the end (once more if it fails).

Recorded per fault: the step the run had reached, the step the rerun resumed from, the steps lost, the exit codes,
whether the rerun skipped a damaged checkpoint (the warning naming it), and whether the run ended bit-identical to
the reference (weights tensor by tensor, ``eval_loss``, ``train_loss``). The goal: every run ends equal, a damaged
checkpoint is refused by name, 0 silent differences, 0 runs that never finish.

    python benchmarks/fault_injection.py --kills 30 --steps 20 --every 5   # writes benchmarks/results/faults/record.{json,md}, lost.png
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
KILLS = ("SIGKILL in training", "SIGKILL in a save", "SIGTERM in training", "SIGKILL after the last checkpoint",
         "SIGKILL in the final writes")
FINAL_FILES = ("model.safetensors", "train_results.json", "trainer_state.json", "eval_results.json")
CORRUPT_AFTER = 4  # checkpoints written before a corruption's kill
RESUME_LINE = re.compile(r"resuming from \S*checkpoint-(\d+)")
SKIP_LINE = re.compile(r"skipping \S*(checkpoint-\d+): (\S+)")


def command(out: Path, steps: int, every: int) -> list[str]:
    return [sys.executable, str(ROOT / "run_clm.py"), "--output_dir", str(out), "--use_cpu", "--report_to", "none",
            "--disable_tqdm", "true", "--seed", "3", "--model_config", "gpt2-tiny", "--train_file", str(TINYSTORIES),
            "--block_size", "64", "--tokenizer_vocab_size", "512", "--max_steps", str(steps),
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--do_train", "--save_strategy", "steps",
            "--save_steps", str(every), "--logging_steps", "1", "--max_train_samples", "400", "--do_eval",
            "--validation_file", str(TINYSTORIES), "--max_eval_samples", "32", "--per_device_eval_batch_size", "8"]


def environment() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")


def logged_steps(log: str) -> int:
    """The number of training steps a run logged (``--logging_steps 1``: one loss line per step)."""
    return sum(1 for line in log.splitlines() if line.startswith("{'loss'"))


def start(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, object]:
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(), cwd=ROOT), log


def _wait_for_training(proc, log) -> None:
    while logged_steps(open(log.name).read()) == 0 and proc.poll() is None:
        time.sleep(0.05)


def _wait_for_step(proc, log, target: int) -> None:
    while logged_steps(open(log.name).read()) < target and proc.poll() is None:
        time.sleep(0.005)


def _wait_for_path(proc, path: Path, poll: float = 0.001) -> None:
    while not path.exists() and proc.poll() is None:
        time.sleep(poll)


def one_fault(fault: str, out: Path, cmd: list[str], rng: random.Random, steps: int, every: int) -> dict:
    """Start ``cmd`` and inject ``fault`` (see the module docstring); return what happened (the rerun is the
    caller's). A corruption's target file is in ``fault`` (``corrupt <file>``)."""
    proc, log = start(cmd, out.parent / f"{out.name}-killed.log")
    begun = time.monotonic()
    _wait_for_training(proc, log)
    sig, detail = signal.SIGKILL, None
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
    elif fault == "SIGKILL after the last checkpoint":
        _wait_for_path(proc, out / f"checkpoint-{steps}", 0.002)
        time.sleep(rng.uniform(0, 0.3))
    elif fault == "SIGKILL in the final writes":
        detail = rng.choice(FINAL_FILES)
        _wait_for_path(proc, out / f"checkpoint-{steps}", 0.002)
        _wait_for_path(proc, out / detail)
    elif fault.startswith("corrupt "):
        _wait_for_path(proc, out / f"checkpoint-{min(CORRUPT_AFTER, steps // every - 1) * every}", 0.002)
    else:
        _wait_for_step(proc, log, rng.randrange(1, steps - 1))
        time.sleep(rng.uniform(0, 0.05))
        sig = signal.SIGKILL if fault.startswith("SIGKILL") else signal.SIGTERM
    steps_before = logged_steps(open(log.name).read())
    if proc.poll() is None:
        proc.send_signal(sig)
    code = proc.wait(timeout=600)
    log.close()
    complete = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    rec = {"fault": fault, "seconds_after_start": round(time.monotonic() - begun, 2), "step_reached": steps_before,
           "exit_code": code, "checkpoints_left": complete}
    if detail:
        rec["killed_at"] = detail
    if fault.startswith("corrupt "):
        rec["corrupted"] = corrupt(out / f"checkpoint-{complete[-1]}" / fault.split(" ", 1)[1], rng)
    return rec


def corrupt(path: Path, rng: random.Random) -> dict:
    """Write 4 KiB of random bytes (half the file when smaller) over ``path`` at a random offset; same size."""
    size = path.stat().st_size
    n = min(4096, max(size // 2, 1))
    offset = rng.randrange(0, size - n + 1)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(rng.randbytes(n))
    assert path.stat().st_size == size
    return {"file": path.name, "bytes": n, "offset": offset, "size": size}


def finals(out: Path) -> dict:
    """The run's final weights, ``eval_loss`` and ``train_loss`` (None where missing or unreadable)."""
    def read(what):
        try:
            return what()
        except (OSError, ValueError, KeyError):
            return None

    return {"weights": read(lambda: load_file(out / "model.safetensors")),
            "eval_loss": read(lambda: json.loads((out / "eval_results.json").read_text())["eval_loss"]),
            "train_loss": read(lambda: json.loads((out / "train_results.json").read_text())["train_loss"])}


def compare(reference: dict, got: dict) -> dict:
    ref_w, w = reference["weights"], got["weights"]
    return {"weights_equal": w is not None and ref_w.keys() == w.keys() and all(torch.equal(ref_w[k], w[k]) for k in ref_w),
            "eval_loss_equal": got["eval_loss"] == reference["eval_loss"],
            "train_loss_equal": got["train_loss"] == reference["train_loss"],
            "train_loss_difference": None if got["train_loss"] is None else got["train_loss"] - reference["train_loss"]}


def rerun(cmd: list[str], log_path: Path) -> tuple[int, str]:
    proc, log = start(cmd, log_path)
    code = proc.wait(timeout=900)
    log.close()
    return code, open(log.name).read()


def checkpoint_files(out: Path, every: int) -> list[str]:
    """The files of the reference's first checkpoint (the corruptions' targets), the manifest last."""
    first = out / f"checkpoint-{every}"
    names = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    manifest = "checkpoint_manifest.json"
    return [n for n in names if n != manifest] + [manifest]


def run(args) -> dict:
    prov = provenance()  # the code this process loaded, before any run
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="faults-", dir=args.work))
    ref_out = work / "reference"
    began = time.monotonic()
    code, text = rerun(command(ref_out, args.steps, args.every), work / "reference.log")
    assert code == 0, text[-3000:]
    ref_seconds = time.monotonic() - began
    reference = finals(ref_out)
    faults = [KILLS[i % len(KILLS)] for i in range(args.kills)]
    faults += [f"corrupt {name}" for name in checkpoint_files(ref_out, args.every)]
    kills = []
    for i, fault in enumerate(faults):
        out = work / f"kill{i:02d}"
        cmd = command(out, args.steps, args.every)
        rec = one_fault(fault, out, cmd, rng, args.steps, args.every)
        rec["rerun_exit_code"], text = rerun(cmd, work / f"kill{i:02d}-rerun.log")
        if rec["exit_code"] == 0:  # the run had finished before the kill: the rerun must refuse (exit 2)
            rec["finished_before_the_kill"] = True
        elif rec["rerun_exit_code"] != 0:
            rec["second_rerun_exit_code"], text2 = rerun(cmd, work / f"kill{i:02d}-rerun2.log")
            text += text2
        resumed = RESUME_LINE.search(text)
        skipped = SKIP_LINE.findall(text)
        rec["resumed_from"] = int(resumed.group(1)) if resumed else 0
        rec["skipped"] = [f"{c}: {f}" for c, f in skipped]
        rec["steps_lost"] = 0 if rec["exit_code"] == 0 else max(rec["step_reached"] - rec["resumed_from"], 0)
        rec.update(compare(reference, finals(out)))
        rec["equal_to_uninterrupted"] = rec["weights_equal"] and rec["eval_loss_equal"] and rec["train_loss_equal"]
        finished = rec["rerun_exit_code"] == 0 or rec.get("second_rerun_exit_code") == 0 or (
            rec.get("finished_before_the_kill") and rec["rerun_exit_code"] == 2)
        rec["never_finished"] = not finished
        rec["silent"] = finished and not rec["equal_to_uninterrupted"]
        if fault.startswith("corrupt "):
            target = f"checkpoint-{rec['checkpoints_left'][-1]}: {fault.split(' ', 1)[1]}"
            rec["refused_by_name"] = target in rec["skipped"]
        rec["folders"] = sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", "damaged-")))
        kills.append(rec)
        print(f"{i + 1}/{len(faults)}: {fault:34s} step {rec['step_reached']:3d} -> resumed from "
              f"{rec['resumed_from']:3d} (lost {rec['steps_lost']}), exit {rec['exit_code']}, rerun exit "
              f"{rec['rerun_exit_code']}, skipped {rec['skipped']}, equal: {rec['equal_to_uninterrupted']} "
              f"(train_loss {rec['train_loss_difference']})", flush=True)
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    cmd_line = "python benchmarks/fault_injection.py " + " ".join(
        f"--{k} {v}" for k, v in (("kills", args.kills), ("steps", args.steps), ("every", args.every),
                                   ("seed", args.seed)))
    return {**prov, "command": cmd_line, "steps": args.steps, "save_steps": args.every, "seed": args.seed,
            "reference_seconds": round(ref_seconds, 1), "reference_eval_loss": reference["eval_loss"],
            "reference_train_loss": reference["train_loss"], "kills": kills}


def _kind(fault: str) -> str:
    return "same-size corruption of one checkpoint file" if fault.startswith("corrupt ") else fault


def summarize(record: dict) -> list[dict]:
    rows = []
    for kind in (*KILLS, _kind("corrupt ")):
        ks = [k for k in record["kills"] if _kind(k["fault"]) == kind]
        if ks:
            lost = [k["steps_lost"] for k in ks]
            rows.append({"fault": kind, "kills": len(ks), "equal": sum(k["equal_to_uninterrupted"] for k in ks),
                         "refused_by_name": sum(k.get("refused_by_name", False) for k in ks),
                         "finished_before": sum(k.get("finished_before_the_kill", False) for k in ks),
                         "silent": sum(k["silent"] for k in ks), "never": sum(k["never_finished"] for k in ks),
                         "lost_mean": round(sum(lost) / len(lost), 2), "lost_max": max(lost),
                         "exit_codes": sorted({k["exit_code"] for k in ks}),
                         "rerun_exit_codes": sorted({k["rerun_exit_code"] for k in ks})})
    return rows


def markdown(record: dict) -> str:
    rows = summarize(record)
    ks = record["kills"]
    equal = sum(k["equal_to_uninterrupted"] for k in ks)
    lines = [f"# Faults and preemption: {equal} of {len(ks)} runs ended equal to the uninterrupted run",
             "", f"`{record['command']}` (commit {(record.get('commit') or '?')[:7]}, torch {record['versions']['torch']}; "
             f"{record['steps']} steps, a checkpoint every {record['save_steps']}, an evaluation at the end). Equal: "
             f"the final weights tensor by tensor, `eval_loss` and `train_loss`, all bit for bit.", "",
             "| fault | runs | ended equal | damaged checkpoint refused by name | finished before the kill | silent "
             "| never finished | steps lost: mean | max | exit codes of the faulted run | of the rerun |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['fault']} | {r['kills']} | {r['equal']} | {r['refused_by_name']} | {r['finished_before']} "
                     f"| {r['silent']} | {r['never']} | {r['lost_mean']} | {r['lost_max']} | "
                     f"{', '.join(map(str, r['exit_codes']))} | {', '.join(map(str, r['rerun_exit_codes']))} |")
    corrupted = [k for k in ks if k["fault"].startswith("corrupt ")]
    if corrupted:
        lines += ["", "Corrupted files (each in the newest checkpoint, 4 KiB or half the file, same size): "
                  + ", ".join(f"`{k['corrupted']['file']}` ({'refused' if k.get('refused_by_name') else 'NOT refused'})"
                              for k in corrupted) + "."]
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for kind, marker in zip((*KILLS, _kind("corrupt ")), "oxs^vD"):
        ks = [k for k in record["kills"] if _kind(k["fault"]) == kind]
        ax.scatter([k["step_reached"] for k in ks], [k["steps_lost"] for k in ks], marker=marker, label=kind)
    ax.set_xlabel("step reached when the fault came")
    ax.set_ylabel("steps lost")
    ax.set_title(f"checkpoint every {record['save_steps']} steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30,
                        help="kills, each kind in turn (then one corruption per checkpoint file)")
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
