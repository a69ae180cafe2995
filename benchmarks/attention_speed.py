"""Speed and memory of the attention variants: forward + backward of a GPT-2 block stack (a benchmark, not a test).

For each sequence length and attention implementation — ``sdpa``, ``eager``, the fast paths ``affine_scaled``,
``attention_sink``, ``preconditioned``, ``spectral`` (sdpa + spectral conditioning hooks) and the naive N×N
``affine_scaled_reference`` — it times training steps (forward + backward, model in train mode so α_ma updates) of
a randomly initialised ``GPT2Model`` and reports throughput (tokens/s), the ratio to ``sdpa``, and peak memory.

Peak memory, CPU: the process's peak resident set size during one training step minus its RSS just before the step
(model, gradients of the previous step freed, inputs allocated). The peak is reset before each measured step by
writing ``5`` to ``/proc/self/clear_refs`` (Linux ≥ 4.0) and read as ``VmHWM`` from ``/proc/self/status``; the script
re-executes itself with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc serves every tensor above 64 KiB by ``mmap``
and returns it on free — RSS then follows live tensor memory (activations, saved tensors, temporaries) instead of
the allocator's cache. On CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the step.

Timings on a shared CPU are noisy: implementations are interleaved round-robin within one process (so background
load hits them alike), and the median of ``--reps`` steps after ``--warmup`` steps is reported. Two clocks are
recorded: wall time and the process's CPU time (``time.process_time``). Throughput and ratios use ``--clock``
(default ``cpu`` with ``--threads 1``: on a machine shared with other jobs, CPU seconds measure the work a step
needs, while wall time mostly measures the scheduler; use ``--clock wall --threads 0`` on an idle machine or GPU).

    python benchmarks/attention_speed.py                      # table
    python benchmarks/attention_speed.py --json results.json  # also write the rows as JSON
    python benchmarks/attention_speed.py --device cuda --dtype bf16 --threads 0 --layers 1 --hidden 1280 \
        --heads 20 --seqs 1024 4096 8192 --tokens 8192      # one 472M-shaped layer on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procmem import reset_peak_rss, status_kib  # noqa: E402

IMPLS = ("sdpa", "eager", "affine_scaled", "attention_sink", "preconditioned", "spectral", "affine_scaled_reference")
SEQS = (256, 512, 1024, 2048)


def build(impl: str, seq: int, args):
    import torch
    from transformers import GPT2Config, GPT2Model

    import hf_condinit

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=args.layers, n_embd=args.hidden, n_head=args.heads, n_positions=max(args.seqs), vocab_size=1024,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
    )
    build_impl = {"affine_scaled_reference": "affine_scaled", "spectral": "sdpa"}.get(impl, impl)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    with torch.device(args.device):
        model = GPT2Model._from_config(config, attn_implementation=build_impl, dtype=dtype).train()
    if impl == "spectral":
        hf_condinit.apply_spectral_conditioning(model, lam=10.0)
    if impl == "affine_scaled_reference":
        model.config._attn_implementation = impl
    return model


def batch_for(seq: int, args) -> int:
    """``--batch``, or with ``--tokens T`` the batch that gives about T tokens per step at this length (≥ 1)."""
    return max(1, args.tokens // seq) if args.tokens else args.batch


def measure(args) -> list[dict]:
    import gc

    import torch
    import transformers

    from hf_condinit.attention.reference import register_references

    transformers.logging.set_verbosity_error()
    register_references()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for seq in args.seqs:
        batch = batch_for(seq, args)
        models = {impl: build(impl, seq, args) for impl in args.impls}
        ids = torch.randint(0, 1024, (batch, seq), device=device)

        def step(model):
            out = model(input_ids=ids).last_hidden_state
            out.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)

        times = {impl: [] for impl in args.impls}
        cpu_times = {impl: [] for impl in args.impls}
        for i in range(args.warmup + args.reps):
            for impl, model in models.items():
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                step(model)
                sync()
                if i >= args.warmup:
                    times[impl].append(time.perf_counter() - t0)
                    cpu_times[impl].append(time.process_time() - c0)
        for impl, model in models.items():
            gc.collect()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
                step(model)
                peak = torch.cuda.max_memory_allocated(device) - base
            else:
                base = status_kib("VmRSS")
                if not reset_peak_rss():
                    raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs); run on CPU with Linux >= 4.0")
                step(model)
                peak = (status_kib("VmHWM") - base) * 1024
            wall, cpu = statistics.median(times[impl]), statistics.median(cpu_times[impl])
            t = cpu if args.clock == "cpu" else wall
            rows.append({"impl": impl, "seq": seq, "batch": batch, "clock": args.clock, "seconds": t,
                         "wall_seconds": wall, "cpu_seconds": cpu, "tokens_per_s": batch * seq / t,
                         "peak_mem_bytes": int(peak), "wall_times": times[impl], "cpu_times": cpu_times[impl]})
            print(f"  done {impl:>24s} seq={seq:5d} wall {wall:.3f}s cpu {cpu:.3f}s", file=sys.stderr,
                  flush=True)
        del models
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, nargs="+", default=list(SEQS))
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=0, help="tokens per step: batch = max(1, tokens // seq) (0: --batch)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="model dtype (bf16 on GPUs)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch default)")
    p.add_argument("--clock", choices=("cpu", "wall"), default=None,
                   help="time base of throughput and ratios (default: cpu on --device cpu, wall elsewhere)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--json", metavar="PATH", help="write the rows (and the settings) as JSON")
    args = p.parse_args()
    args.clock = args.clock or ("cpu" if args.device == "cpu" else "wall")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            p.exit(2, f"attention_speed.py: --device {args.device} but torch sees no CUDA device; use --device cpu\n")

    if args.device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    rows = measure(args)

    base = {r["seq"]: r for r in rows if r["impl"] == "sdpa"}
    for r in rows:
        b = base.get(r["seq"])
        r["throughput_vs_sdpa"] = r["tokens_per_s"] / b["tokens_per_s"] if b else None
        r["memory_vs_sdpa"] = r["peak_mem_bytes"] / b["peak_mem_bytes"] if b and b["peak_mem_bytes"] > 0 else None

    header = (f"{'seq':>5s} {'impl':>24s} {'cpu s':>7s} {'wall s':>7s} {'tok/s':>8s} {'x sdpa':>7s} {'peak MiB':>9s} "
              f"{'mem x sdpa':>10s}")
    batches = "batch " + ", ".join(f"{batch_for(s, args)} at {s}" for s in args.seqs)
    print(f"GPT-2 stack: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, {batches}, {args.dtype}, "
          f"forward+backward, {args.device}, {args.threads or 'default'} thread(s), median of {args.reps} interleaved "
          f"steps, throughput from {args.clock} time")
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = f"{r['throughput_vs_sdpa']:.2f}" if r["throughput_vs_sdpa"] is not None else "-"
        mem = f"{r['memory_vs_sdpa']:.2f}" if r["memory_vs_sdpa"] is not None else "-"
        print(f"{r['seq']:5d} {r['impl']:>24s} {r['cpu_seconds']:7.3f} {r['wall_seconds']:7.3f} {r['tokens_per_s']:8.0f} "
              f"{ratio:>7s} {r['peak_mem_bytes'] / 2**20:9.1f} {mem:>10s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
