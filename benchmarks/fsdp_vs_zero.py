"""FSDP2 vs DeepSpeed ZeRO-2/ZeRO-3 vs DDP vs one process: ``run_clm.py`` step time and per-rank peak memory on CPU.

Every engine trains the same model on the same global batch with the project's own entry point (``run_clm.py``,
its LM defaults: AdamW, clipping 1.0), one launch per engine:

==============================  ==========================================================================
engine                          launch
==============================  ==========================================================================
``single``                      ``python run_clm.py`` (1 process, the whole global batch)
``ddp``                         ``torchrun --nproc_per_node 2 run_clm.py`` (replicated model)
``zero2`` / ``zero3``           ``... --deepspeed ds_configs/zero2.json`` / ``zero3.json``
``fsdp2_shard_grad_op``         ``... --fsdp --fsdp_config fsdp_configs/gpt2-472m.json``
``fsdp2_full_shard``            ``... --fsdp --fsdp_config fsdp_configs/gpt2-1.72b.json`` with activation
                                checkpointing off (ZeRO-3 has none either; it is a compute-for-memory trade)
==============================  ==========================================================================

Two processes over gloo, or one; ``OMP_NUM_THREADS=1`` in every process (on a shared machine a second thread per
process makes the timing swing tenfold). FSDP on CPU needs :func:`hf_condinit.scripts.launch.enable_cpu_fsdp`
(accelerate 1.16 trains ``--fsdp`` as DDP on CPU otherwise); each launch's own line (``launched by ...``) is recorded
to show what ran.

Measured on every rank, per optimizer step (``on_step_begin`` → ``on_step_end``: forward, backward, communication,
clipping, AdamW step), after ``--warmup`` steps: the wall time and the process CPU time (user + system; less
sensitive than wall time to other jobs on a shared machine, and it counts the work of the sharding: gathers,
reduce-scatters, copies); reported as medians over the steps (wall: rank 0; CPU: mean of the ranks' medians). And
the peak resident memory during training (``VmHWM`` reset at ``on_train_begin``, read at ``on_train_end``: model,
gradients, optimizer state, activations, communication buffers, plus the framework) and the resident memory when
training begins.

    python benchmarks/fsdp_vs_zero.py    # writes benchmarks/results/fsdp_vs_zero/record.{json,md}

The worker mode (``--worker``, started by the launches above) runs ``run_clm.main`` with a measuring callback added.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _procmem import reset_peak_rss, status_kib  # noqa: E402

MODEL = ["--model_config", "gpt2-small-cpu", "--config_overrides", "n_embd=512,n_head=8"]  # 4 × 512, ~12.6M in blocks
ENGINES = ("single", "ddp", "zero2", "zero3", "fsdp2_shard_grad_op", "fsdp2_full_shard")


def engine_flags(engine: str) -> list[str]:
    """The sharding flags of ``engine`` (module docstring)."""
    if engine in ("single", "ddp"):
        return []
    if engine in ("zero2", "zero3"):
        return ["--deepspeed", os.path.join(REPO, "ds_configs", f"{engine}.json")]
    if engine == "fsdp2_shard_grad_op":
        return ["--fsdp", "--fsdp_config", os.path.join(REPO, "fsdp_configs", "gpt2-472m.json")]
    with open(os.path.join(REPO, "fsdp_configs", "gpt2-1.72b.json")) as f:
        config = {**json.load(f), "activation_checkpointing": False}
    return ["--fsdp", "--fsdp_config", json.dumps(config)]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_engine(engine: str, args, work: str) -> dict:
    """Launch one engine; returns its measurements (see the module docstring)."""
    out = os.path.join(work, engine)
    ranks = 1 if engine == "single" else 2
    script = [
        "--use_cpu", *MODEL, "--do_train", "--max_steps", str(args.steps), "--logging_steps", str(args.steps),
        "--per_device_train_batch_size", str(args.global_batch // ranks), "--synthetic_train_examples", "4096",
        "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "0", "--output_dir", out, *engine_flags(engine),
    ]  # fmt: skip
    me = os.path.abspath(__file__)
    if ranks == 1:
        cmd = [sys.executable, me, "--worker", *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", _free_port(),
               me, "--worker", *script]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{log[-6000:]}")
    with open(os.path.join(out, "trainer_state.json")) as f:
        history = json.load(f)["log_history"]
    ranks_data = []
    for r in range(ranks):
        with open(os.path.join(out, f"measure-rank{r}.json")) as f:
            ranks_data.append(json.load(f))
    launch = next(line.split(": ", 1)[1] for line in log.splitlines() if "launched by" in line)
    return {
        "engine": engine, "processes": ranks, "launch_line": launch, "flags": engine_flags(engine),
        "wall_seconds_per_step_median": statistics.median(ranks_data[0]["wall"][args.warmup:]),
        "cpu_seconds_per_step_median": statistics.mean(statistics.median(d["cpu"][args.warmup:]) for d in ranks_data),
        "peak_rss_mib_per_rank": [d["peak_rss_mib"] for d in ranks_data],
        "rss_at_train_begin_mib_per_rank": [d["rss_at_train_begin_mib"] for d in ranks_data],
        "per_rank_steps": ranks_data,
        "train_loss": next(e["train_loss"] for e in history if "train_loss" in e),
        "launch_seconds": round(time.time() - t0, 1),
    }


def worker(script_args: list[str]) -> None:
    """``run_clm.main(script_args)`` under FSDP on CPU, each rank writing ``memory-rank<r>.json`` to the output dir."""
    import importlib.util

    from transformers import TrainerCallback

    from hf_condinit.scripts.launch import enable_cpu_fsdp

    enable_cpu_fsdp()
    spec = importlib.util.spec_from_file_location("run_clm", os.path.join(REPO, "run_clm.py"))
    run_clm = importlib.util.module_from_spec(spec)
    sys.modules["run_clm"] = run_clm
    spec.loader.exec_module(run_clm)

    class Measure(TrainerCallback):
        """Per-step wall and CPU time, peak RSS during training: ``<output_dir>/measure-rank<r>.json``."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.wall, self.cpu, self.begin = [], [], status_kib("VmRSS")
            if not reset_peak_rss():
                raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs): the peak would span the process")

        def on_step_begin(self, args, state, control, **kwargs):
            self.t = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            self.wall.append(time.perf_counter() - self.t[0])
            self.cpu.append(time.process_time() - self.t[1])

        def on_train_end(self, args, state, control, **kwargs):
            path = os.path.join(args.output_dir, f"measure-rank{os.environ.get('RANK', '0')}.json")
            with open(path, "w") as f:
                json.dump({"peak_rss_mib": round(status_kib("VmHWM") / 1024, 1),
                           "rss_at_train_begin_mib": round(self.begin / 1024, 1),
                           "wall": [round(t, 4) for t in self.wall], "cpu": [round(t, 4) for t in self.cpu]}, f)

    original = run_clm.train_and_save

    def train_and_save(trainer, *args, **kwargs):
        trainer.add_callback(Measure())
        return original(trainer, *args, **kwargs)

    run_clm.train_and_save = train_and_save
    run_clm.main(script_args)


def markdown(record: dict) -> str:
    lines = [
        "# FSDP2 vs DeepSpeed ZeRO vs DDP vs one process (CPU)",
        "",
        f"Command: `{record['command']}` ({record['date']}, {record['machine']}).",
        "",
        f"Model: {record['model']}; global batch {record['global_batch']} × {record['block_size']} tokens; "
        f"{record['steps']} AdamW steps, medians over the steps after the first {record['warmup']}; one thread "
        "per process.",
        "",
        "| engine | processes | launch line | wall s / step | CPU s / step (per process) | peak RSS per rank (MiB) | "
        "RSS at train begin (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in record["engines"]:
        lines.append(
            f"| {r['engine']} | {r['processes']} | {r['launch_line'].split(', ', 2)[-1]} | "
            f"{r['wall_seconds_per_step_median']:.3f} | {r['cpu_seconds_per_step_median']:.3f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['peak_rss_mib_per_rank'])} | "
            f"{' / '.join(f'{m:.0f}' for m in r['rss_at_train_begin_mib_per_rank'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--global_batch", type=int, default=16)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "fsdp_vs_zero"))
    args = parser.parse_args(argv)
    if args.steps <= args.warmup or args.global_batch % 2:
        parser.error("--steps must exceed --warmup, and --global_batch must be even")

    import accelerate
    import deepspeed
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as work:
        results = []
        for engine in args.engines:
            print(f"[fsdp_vs_zero] {engine} ...", flush=True)
            results.append(run_engine(engine, args, work))
            print(f"[fsdp_vs_zero] {engine}: {results[-1]['wall_seconds_per_step_median']:.3f} s/step, peak RSS "
                  f"{results[-1]['peak_rss_mib_per_rank']} MiB", flush=True)
    record = {
        "command": "python benchmarks/fsdp_vs_zero.py" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv)),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end, {platform.platform()}",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "accelerate": accelerate.__version__, "deepspeed": deepspeed.__version__},
        "model": "configs/gpt2-small-cpu.json with n_embd=512, n_head=8 (4 layers × 512), synthetic MQAR vocabulary",
        "global_batch": args.global_batch, "block_size": 34, "steps": args.steps, "warmup": args.warmup,
        "engines": results,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(args.out, "record.md"), "w") as f:
        f.write(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker([a for a in sys.argv[2:] if not a.startswith("--local_rank")])
    else:
        main()
