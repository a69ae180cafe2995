"""GPU readiness check: one command that measures what the mission needs the day a GPU is available (≤ 9 min).

    python3 benchmarks/gpu_check.py --out gpu_check_out            # full mode, on a CUDA machine
    python3 benchmarks/gpu_check.py --smoke --out /tmp/gpu_smoke   # every part on CPU with tiny shapes (< 2 min)

It needs torch, transformers and accelerate only (no deepspeed, datasets or evaluate: none is imported on its path)
and no install: the repository root is put on ``sys.path``, so a checkout runs as it is (the exact command for the
lent GPU machine: docs/pretraining.md, "Throughput"). Tested against the oldest transformers the project declares.

Parts, run in the order a, d, c, e, b (``_gpu_check.RUN_ORDER``: the headline rows of part d first; ``--parts``
picks and orders them), each in its own forked process under its own time cap (``--cap PART=SECONDS`` overrides)
plus the time the parts before it left unused (the run never takes longer than the sum of the caps), so a slow or
hung part is killed and the next one runs. Each row goes to ``OUT/rows.jsonl`` the moment it is measured, and
``OUT/gpu_check.json`` / ``OUT/gpu_check.md`` are rewritten after every row (a killed run keeps what it measured);
with ``OUT/status.json`` that is four files in one folder. Within a part, every implementation, arm and build runs
on its own: an error (out of memory, a kernel that refuses) is one row with its message and the part goes on.

a. **environment** (`_gpu_check/env.py`): device, Python / CUDA / torch / transformers / accelerate / deepspeed
   versions, the dense bf16 peak from `hf_condinit.perf.PEAK_BF16_TFLOPS` (unknown devices say so), the SDPA
   backends that run (head dim 64 and the attention sink's padded 72), a bf16 8192² matmul's TFLOP/s (≥ 10
   warm-ups over ≥ 1 s, median of 100 repetitions timed with CUDA events);
b. **correctness on the device** (`_gpu_check/correctness.py`, judged by `_gpu_check/judge.py`): each attention
   variant's fast path against its naive N×N reference (`hf_condinit.attention.reference`) on GPT-2 (head dim 64),
   Llama (GQA) and BERT, fp32 and bf16, with and without padding — the output and every gradient, each tensor on its
   own scale, against the bf16 reference's own error for that tensor in bf16, any NaN / inf failing the case by
   name; KV-cache generation fast vs reference; spectral conditioning (hooks) vs the merged weights; conditioned and
   mimetic init built on the device vs the CPU build; builds of every variant × init under a default-device context;
c. **attention speed, memory and kernels** (`_gpu_check/speed.py`): forward + backward of 4 472M-shaped GPT-2 layers
   (1280 wide, 20 heads of 64, bf16) at sequence 1024 / 4096 / 8192 with 32,768 tokens per step, for sdpa, eager,
   affine_scaled, attention_sink, preconditioned, spectral (``benchmarks/attention_speed.py``): tokens/s and peak
   ``torch.cuda.max_memory_allocated`` as ratios to sdpa; and for each, the SDPA kernel family that ran (profiler)
   and whether it runs on flash / memory-efficient / cuDNN alone and with the math kernel disabled (and what ran
   there); for the attention sink, the path its calls took (its fused lse kernel or the virtual-key fallback) and
   why, recorded from the calls themselves;
d. **training throughput and speed levers** (`_gpu_check/matrix.py`, each arm by `_gpu_check/training.py`): GPT-2
   472M (``configs/gpt2-472m.json``) and 1.72B, bf16 mixed precision, plain ``transformers.Trainer`` in one process
   (ZeRO partitions nothing on one GPU; the DeepSpeed path is covered by the CPU tests), random tokens at 1024,
   5 warm-up + 20 measured steps per arm; first the lever matrix at 472M, micro-batch 16: today's ``run_clm.py``
   configuration (eager, ``adamw_torch``), each lever alone (padded vocabulary ×64, chunked LM-head cross-entropy,
   fused AdamW, TF32, regional compile, whole-model compile), all levers together with the faster compile; then
   the micro-batch doubled in the best configuration until it runs out of memory; then each attention variant,
   the conditioned init and 1.72B in the best configuration. Each arm runs only if the time it is estimated to need
   is left (build × parameter ratio, compilation × compiled-graph or layer ratio, s/step × FLOP ratio, from a
   measured arm of the same compile mode; the estimate is recorded beside the seconds the arm took) and under its
   own time limit. Each row records what the arm ran with (vocabulary rows, the loss's forward, the optimizer,
   what was compiled, the fp32 matmul precision). Tokens/s, MFU and peak memory come from
   `hf_condinit.callbacks.ThroughputCallback`;
e. **init cost** (`_gpu_check/init_cost.py`): after throwaway warm-up builds, building the 472M and 1.72B configs
   on the device (fp32) with the default, conditioned and mimetic init (seconds, ratio to the default build, peak
   allocator memory; mimetic 1.72B on 4 of its 48 layers beside the same cut default build, extrapolated and
   labelled), and the CPU draws' share of the cost.

``--smoke`` runs every part on CPU with tiny stand-in shapes (labelled SMOKE everywhere: never GPU results); it is
run by ``tests/benchmarks/test_gpu_check.py``. Numbers of a smoke run mean nothing beyond "the code path works". Exit
status: 0 when every part finished and every case of part b passed, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from _gpu_check import PARTS, RUN_ORDER  # noqa: E402
from _gpu_check.runner import orchestrate, read_status, write_report, write_settings  # noqa: E402

CAPS = {"a": 20, "d": 360, "c": 50, "e": 40, "b": 40}  # seconds, full mode: 510 s in all (+ ~15 s start-up)
SMOKE_CAPS = dict.fromkeys(PARTS, 300)  # a safety net only: a smoke part takes seconds on an idle CPU


def _part_function(part: str):
    """The part's ``fn(ctx, record)``, imported in the forked child only (the parent stays light)."""
    import importlib

    module, name = {"a": ("env", "part_a"), "b": ("correctness", "part_b"), "c": ("speed", "part_c"),
                    "d": ("matrix", "part_d"), "e": ("init_cost", "part_e")}[part]
    return getattr(importlib.import_module(f"_gpu_check.{module}"), name)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="new folder for gpu_check.md, gpu_check.json, rows.jsonl, status.json")
    p.add_argument("--smoke", action="store_true", help="every part on CPU with tiny shapes (labelled SMOKE)")
    p.add_argument("--device", default=None, help="default: cuda (full mode), cpu (--smoke)")
    p.add_argument("--parts", nargs="+", default=list(RUN_ORDER), choices=PARTS,
                   help="the parts to run, in this order (default: %(default)s)")
    p.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS", help="override a part's time cap")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in each part (default: 1 with --smoke, where a shared CPU makes "
                        "multi-threaded LAPACK crawl; else torch's default)")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    if args.threads is None:
        args.threads = 1 if args.smoke else 0
    caps = dict(SMOKE_CAPS if args.smoke else CAPS)
    for item in args.cap:
        part, _, seconds = item.partition("=")
        try:
            if part not in PARTS:
                raise ValueError
            caps[part] = float(seconds)
        except ValueError:
            p.error(f"--cap {item!r}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
    args.caps = caps
    if args.smoke and args.device != "cpu":
        p.error("--smoke runs on CPU; drop --device, or drop --smoke to measure the device")
    return p, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if os.path.isdir(args.out) and os.listdir(args.out):
        parser.exit(2, f"gpu_check.py: --out {args.out} is not empty; give a new folder (nothing is overwritten)\n")
    import torch  # this process never touches CUDA: the parts fork from it

    import hf_condinit  # noqa: F401  imported once here, inherited by every forked part

    if torch.cuda.is_initialized():  # pragma: no cover - a CUDA context would not survive the fork of each part
        parser.exit(2, "gpu_check.py: an import initialised CUDA in the parent process, so the forked parts could "
                       "not use the GPU; this is a bug of gpu_check.py, please report it\n")
    if args.device.startswith("cuda") and not _cuda_visible():
        parser.exit(2, "gpu_check.py: no CUDA device visible to torch; run it on a GPU machine, or add --smoke "
                       "for the CPU check of the code paths\n")
    os.makedirs(args.out, exist_ok=True)
    command = f"{os.path.basename(sys.executable)} benchmarks/gpu_check.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    write_settings(args.out, dict(smoke=args.smoke, device=args.device, parts=args.parts, caps=args.caps,
                                  command=command,
                                  started_utc=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())))
    ctx = dict(smoke=args.smoke, device=args.device, threads=args.threads)
    t0 = time.perf_counter()
    for part in args.parts:
        orchestrate(args.out, [(part, _with_context(part, args.out))], args.caps, ctx)
    result = write_report(args.out)
    from _gpu_check.report import markdown

    print(markdown(result))
    print(f"gpu_check: {time.perf_counter() - t0:.0f}s in all; wrote {os.path.join(args.out, 'gpu_check.md')} and "
          "gpu_check.json", file=sys.stderr)
    failed = [p for p, v in result["parts"].items() if v.get("state") != "done"]
    bad_cases = [r for r in result["parts"].get("b", {}).get("rows", [])
                 if r.get("kind") == "case" and not r.get("passed")]
    return 1 if failed or bad_cases else 0


def _cuda_probe() -> None:
    import torch

    os._exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 3)


def _cuda_visible() -> bool:
    """Whether torch sees a CUDA device, asked in a forked child: the parent must not even initialise the driver
    (CUDA does not support ``fork`` after initialisation, and every part is a fork of the parent)."""
    import multiprocessing

    probe = multiprocessing.get_context("fork").Process(target=_cuda_probe, daemon=True)
    probe.start()
    probe.join(120)
    if probe.is_alive():
        probe.kill()
        probe.join()
    return probe.exitcode == 0


def _with_context(part: str, out: str):
    """The part's function with its start time and cap in ``ctx`` (part d plans its 1.72B arm with them), and the
    device's peak FLOP/s (read in the child: the parent never initialises CUDA)."""
    def run(ctx, record):
        import torch

        from hf_condinit.perf import peak_bf16_flops

        cap = read_status(out).get("parts", {}).get(part, {}).get("cap_s", 0)
        peak = peak_bf16_flops(torch.device(ctx["device"])) if ctx["device"] != "cpu" else None
        _part_function(part)({**ctx, "started": time.time(), "cap": cap, "peak_flops": peak}, record)

    return run


if __name__ == "__main__":
    sys.exit(main())
