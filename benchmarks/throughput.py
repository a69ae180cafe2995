"""Cost of hf_condinit, as ratios against vanilla Hugging Face (same GPT-2, ``sdpa``, default init), in one run.

Three parts (``--parts train kappa init``):

1. **train** — training tokens/s of every arm of ``compare.py`` (each init and attention variant) against a vanilla
   model built without hf_condinit options. Same model as compare.py's default mode (4 layers × 256, context 256,
   batch 8, vocab 4096, random token ids), one full training step = forward + backward + grad clip + AdamW. All
   models are built first, then timed round-robin (``--rounds`` rounds of ``--steps`` steps each after
   ``--warmup``), so load drift on a shared machine hits every arm alike; the median step is reported (wall clock
   and process CPU time).
2. **kappa** — the cost of one κ(J) measurement (``hf_condinit.attention_jacobian_condition_number``, all layers and
   heads) relative to one training step of the same model, for the ConditionNumberCallback's default probe
   (2 × 16 tokens, causal only) and interval (500 steps), a 2 × 32 probe, and compare.py's probe (2 × 8 tokens,
   causal + unmasked); the logging interval that keeps the overhead ≤ 5 % is ``ceil(20 · t_κ / t_step)``.
3. **init** — time and peak memory of initialising the 472M and 1.72B GPT-2 configs (``configs/gpt2-472m.json``,
   ``configs/gpt2-1.72b.json``; shapes assumed, docs/methods.md §7), each in a fresh subprocess:
   ``from_config(cfg)`` (HF default init) vs ``from_config(cfg, condinit="conditioned")`` (default init followed by
   the conditioned overwrite of q/k/v): wall time and peak RSS of the process. Inside the first one also: the
   model's own default init re-run on the built model (``model._init_weights`` over every module, timed) vs
   ``hf_condinit.apply_init(model, "conditioned")`` alone, and ``mimetic`` on the first ``--mimetic-layers``
   attention blocks (one full D×D SVD per head: the whole model would take tens of minutes on 2 cores), with the
   per-layer time extrapolated to all layers and labelled as such.

    python benchmarks/throughput.py                       # all parts, JSON + Markdown into benchmarks/results/throughput
    python benchmarks/throughput.py --parts train kappa   # skip the big models
    python benchmarks/throughput.py --parts train --device cuda   # train part on a GPU (+ CUDA peak memory per arm)

``--device`` applies to the train part (κ runs on CPU, as the callback does by default; the init part is the CPU
cost, RSS-based: benchmarks/gpu_check.py part e measures it on a GPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _procmem import reset_peak_rss, status_kib  # noqa: E402

CONFIGS = {"472m": "gpt2-472m.json", "1.72b": "gpt2-1.72b.json", "tiny": "gpt2-tiny.json", "small-cpu": "gpt2-small-cpu.json"}


# ---------------------------------------------------------------------------------------------------------------
# 1. training throughput
# ---------------------------------------------------------------------------------------------------------------


def part_train(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import hf_condinit  # noqa: F401

    device = torch.device(args.device)
    cfg = C.gpt2_config(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, n_positions=args.block_size,
                        vocab_size=args.vocab_size)
    names = ["vanilla"] + list(C.ARMS)
    models, opts = {}, {}
    for name in names:
        if name == "vanilla":
            torch.manual_seed(0)
            m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        else:
            m = C.build_model(name, cfg, 0)
        m.to(device).train()
        models[name] = m
        opts[name] = torch.optim.AdamW(C.param_groups(m, 0.1), lr=1e-4, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size), generator=g).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(name):
        m, o = models[name], opts[name]
        loss = m(input_ids=x, labels=x).loss
        o.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()

    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for n in names:
        for _ in range(args.warmup):
            step(n)
    for r in range(args.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            for _ in range(args.steps):
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                step(n)
                sync()
                wall[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
        print(f"  train round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    peak = {}
    if device.type == "cuda":  # allocator peak of one step per arm, over what is allocated before it
        for n in names:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step(n)
            peak[n] = torch.cuda.max_memory_allocated(device) - base
    tokens = args.batch_size * args.block_size
    rows = []
    vw, vc = statistics.median(wall["vanilla"]), statistics.median(cpu["vanilla"])
    for n in names:
        w, c = statistics.median(wall[n]), statistics.median(cpu[n])
        rows.append(dict(arm=n, step_wall_s=w, step_cpu_s=c, tokens_per_s=tokens / w, tokens_per_cpu_s=tokens / c,
                         ratio_wall=vw / w, ratio_cpu=vc / c, n_steps=len(wall[n]),
                         n_params=sum(p.numel() for p in models[n].parameters()),
                         **({"step_peak_mem_bytes": int(peak[n])} if n in peak else {})))
    return dict(model=dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, block_size=args.block_size,
                           batch_size=args.batch_size, vocab_size=args.vocab_size), device=str(device),
                tokens_per_step=tokens, rows=rows)


# ---------------------------------------------------------------------------------------------------------------
# 2. κ(J) logging cost
# ---------------------------------------------------------------------------------------------------------------


def part_kappa(args, train_result: dict | None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import hf_condinit

    cfg = C.gpt2_config(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, n_positions=args.block_size,
                        vocab_size=args.vocab_size)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    if train_result:
        step_s = next(r for r in train_result["rows"] if r["arm"] == "vanilla")["step_wall_s"]
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size))
        ts = []
        for _ in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            ts.append(time.perf_counter() - t0)
        step_s = statistics.median(ts[args.warmup:])
    g = torch.Generator().manual_seed(1)
    rows = []
    from hf_condinit.callbacks import DEFAULT_EVERY_N_STEPS, DEFAULT_PROBE_LENGTH, DEFAULT_PROBE_SIZE

    probes = ((f"callback default ({DEFAULT_PROBE_SIZE}×{DEFAULT_PROBE_LENGTH}, causal)",
               (DEFAULT_PROBE_SIZE, DEFAULT_PROBE_LENGTH), False),
              ("2×32, causal", (2, 32), False),
              ("compare.py (2×8, causal + unmasked)", (2, 8), True))
    for label, (nseq, ntok), unmasked in probes:
        ids = torch.randperm(args.vocab_size, generator=g)[: nseq * ntok].view(nseq, ntok)  # distinct tokens
        mask = torch.ones_like(ids)
        times = []
        for _ in range(args.kappa_reps):
            t0 = time.perf_counter()
            hf_condinit.attention_jacobian_condition_number(model, ids, mask, include_unmasked=unmasked)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        need = math.ceil(20 * t / step_s)
        rows.append(dict(probe=label, probe_shape=[nseq, ntok], include_unmasked=unmasked, kappa_s=t,
                         kappa_times=times, step_s=step_s, kappa_over_step=t / step_s,
                         default_interval=DEFAULT_EVERY_N_STEPS,
                         overhead_at_default=t / (DEFAULT_EVERY_N_STEPS * step_s + t),
                         overhead_at_1000=t / (1000 * step_s + t),
                         interval_for_5pct=need))
    return dict(rows=rows, n_layer=args.n_layer, n_head=args.n_head)


# ---------------------------------------------------------------------------------------------------------------
# 3. init cost of the big configs (one subprocess per measurement)
# ---------------------------------------------------------------------------------------------------------------


def init_worker(size: str, mode: str, dtype_name: str, mimetic_layers: int) -> dict:
    """Runs in a fresh subprocess; prints one JSON line."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_condinit
    from hf_condinit.api import init_attention_block
    from hf_condinit.config import CondInitConfig

    C.quiet_transformers()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    path = os.path.join(C.REPO_ROOT, "configs", CONFIGS[size])
    with open(path) as f:
        raw = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    cfg = AutoConfig.for_model(**raw)
    rss0 = status_kib("VmRSS")
    kw = dict(dtype=dtype, attn_implementation="sdpa")
    if mode == "conditioned":
        kw["condinit"] = {"method": "conditioned", "seed": 0}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(cfg, **kw)
    build_s = time.perf_counter() - t0
    out = dict(size=size, mode=mode, dtype=dtype_name, build_s=build_s,
               n_params=sum(p.numel() for p in model.parameters()),
               rss_before_kib=rss0, rss_after_build_kib=status_kib("VmRSS"),
               peak_rss_build_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head, threads=torch.get_num_threads())
    if mode == "default":
        # the model's own default init, re-run on the built model: _init_weights over every module
        for t in list(model.parameters()) + list(model.buffers()):
            if hasattr(t, "_is_hf_initialized"):
                del t._is_hf_initialized
        probe = model.transformer.h[0].mlp.c_fc.weight
        before = probe[0, :4].clone()
        gc.collect()
        reset_peak_rss()
        base = status_kib("VmRSS")
        t0 = time.perf_counter()
        with torch.no_grad():
            for m in model.modules():
                model._init_weights(m)
        out["default_init_s"] = time.perf_counter() - t0
        out["default_init_rewrote_weights"] = bool(not torch.equal(before, probe[0, :4]))
        out["default_init_extra_peak_kib"] = status_kib("VmHWM") - base
        # conditioned init alone
        gc.collect()
        reset_peak_rss()
        base = status_kib("VmRSS")
        t0 = time.perf_counter()
        hf_condinit.apply_init(model, "conditioned", seed=0, overwrite_loaded=True)
        out["conditioned_apply_s"] = time.perf_counter() - t0
        out["conditioned_apply_extra_peak_kib"] = status_kib("VmHWM") - base
        # mimetic on the first blocks, extrapolated per layer
        if mimetic_layers > 0:
            layout = hf_condinit.get_layout(model)
            blocks = layout.attention_modules(model)[:mimetic_layers]
            mcfg = CondInitConfig(method="mimetic", seed=0)
            gc.collect()
            reset_peak_rss()
            base = status_kib("VmRSS")
            t0 = time.perf_counter()
            for i, (_, blk) in enumerate(blocks):
                init_attention_block(blk, i, layout, model.config, mcfg, loaded="overwrite")
            per_layer = (time.perf_counter() - t0) / len(blocks)
            out["mimetic_layers_timed"] = len(blocks)
            out["mimetic_per_layer_s"] = per_layer
            out["mimetic_extrapolated_s"] = per_layer * cfg.n_layer
            out["mimetic_extra_peak_kib"] = status_kib("VmHWM") - base
    out["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


def part_init(args) -> dict:
    rows = []
    for size in args.sizes:
        for mode in ("default", "conditioned"):
            cmd = [sys.executable, os.path.abspath(__file__), "--_init-worker", size, mode, args.init_dtype,
                   str(args.mimetic_layers)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                rows.append(dict(size=size, mode=mode, error=proc.stderr[-2000:], returncode=proc.returncode))
                print(f"  init {size} {mode}: FAILED (rc {proc.returncode})", file=sys.stderr, flush=True)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["process_wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"  init {size} {mode}: build {row['build_s']:.1f}s peak RSS {row['peak_rss_kib'] / 2**20:.2f} GiB",
                  file=sys.stderr, flush=True)
    summary = []
    for size in args.sizes:
        d = next((r for r in rows if r.get("size") == size and r.get("mode") == "default" and "build_s" in r), None)
        c = next((r for r in rows if r.get("size") == size and r.get("mode") == "conditioned" and "build_s" in r), None)
        if not d:
            continue
        s = dict(size=size, default_build_s=d["build_s"], default_peak_rss_gib=d["peak_rss_build_kib"] / 2**20,
                 default_peak_over_baseline_gib=(d["peak_rss_build_kib"] - d["rss_before_kib"]) / 2**20,
                 param_gib=d["n_params"] * (4 if args.init_dtype == "fp32" else 2) / 2**30,
                 default_init_s=d.get("default_init_s"), conditioned_apply_s=d.get("conditioned_apply_s"),
                 conditioned_apply_ratio=(d["conditioned_apply_s"] / d["default_init_s"]
                                          if d.get("default_init_s") else None),
                 conditioned_apply_extra_peak_mib=d.get("conditioned_apply_extra_peak_kib", 0) / 1024,
                 mimetic_per_layer_s=d.get("mimetic_per_layer_s"),
                 mimetic_extrapolated_s=d.get("mimetic_extrapolated_s"),
                 mimetic_extrapolated_ratio=(d["mimetic_extrapolated_s"] / d["default_init_s"]
                                             if d.get("mimetic_extrapolated_s") and d.get("default_init_s") else None),
                 mimetic_extra_peak_mib=d.get("mimetic_extra_peak_kib", 0) / 1024,
                 n_params=d["n_params"])
        if c:
            s.update(conditioned_build_s=c["build_s"], conditioned_peak_rss_gib=c["peak_rss_build_kib"] / 2**20,
                     conditioned_peak_over_baseline_gib=(c["peak_rss_build_kib"] - c["rss_before_kib"]) / 2**20,
                     build_ratio=c["build_s"] / d["build_s"],
                     peak_rss_ratio=c["peak_rss_build_kib"] / d["peak_rss_build_kib"])
        summary.append(s)
    return dict(rows=rows, summary=summary, dtype=args.init_dtype)


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def markdown(res: dict) -> str:
    L = []
    m = res.get("machine", {})
    L.append(f"Machine: {m.get('cpu', '?')}, {m.get('cpu_count')} cores, torch threads {m.get('torch_threads')}, "
             f"torch {m.get('torch')}, transformers {m.get('transformers')}; 1-min load average at start "
             f"{m.get('loadavg_1m', float('nan')):.2f}, at end {res.get('loadavg_1m_end', float('nan')):.2f}.\n")
    if "train" in res:
        t = res["train"]
        mm = t["model"]
        L.append(f"Training throughput: GPT-2 {mm['n_layer']}×{mm['n_embd']}, {mm['n_head']} heads, batch "
                 f"{mm['batch_size']} × {mm['block_size']} tokens, vocab {mm['vocab_size']}, fp32, {t.get('device', 'cpu')}; median of "
                 f"{t['rows'][0]['n_steps']} steps per arm (interleaved rounds). Ratio = vanilla step time / arm "
                 "step time (1.00 = as fast as vanilla HF sdpa).\n")
        mem = "step_peak_mem_bytes" in t["rows"][0]
        L.append("| arm | tokens/s (wall) | ratio (wall) | tokens/CPU-s | ratio (CPU) | parameters |"
                 + (" step peak MiB (CUDA allocator) |" if mem else ""))
        L.append("|---|---|---|---|---|---|" + ("---|" if mem else ""))
        for r in t["rows"]:
            L.append(f"| {r['arm']} | {r['tokens_per_s']:.0f} | {r['ratio_wall']:.3f} | {r['tokens_per_cpu_s']:.0f} |"
                     f" {r['ratio_cpu']:.3f} | {r['n_params']:,} |"
                     + (f" {r['step_peak_mem_bytes'] / 2**20:.0f} |" if mem else ""))
        L.append("")
    if "kappa" in res:
        L.append("κ(J) logging cost (vanilla model above; one measurement = all layers and heads, method eig):\n")
        interval = res["kappa"]["rows"][0]["default_interval"]
        L.append(f"| probe | s / measurement | training step s | κ / step | overhead at the default interval "
                 f"({interval} steps) | at every 1000 | interval for ≤ 5 % |")
        L.append("|---|---|---|---|---|---|---|")
        for r in res["kappa"]["rows"]:
            L.append(f"| {r['probe']} | {r['kappa_s']:.2f} | {r['step_s']:.3f} | {r['kappa_over_step']:.1f} | "
                     f"{100 * r['overhead_at_default']:.1f} % | {100 * r['overhead_at_1000']:.1f} % | "
                     f"{r['interval_for_5pct']} |")
        L.append("")
    if "init" in res:
        L.append(f"Init cost of the assumed 472M / 1.72B GPT-2 configs ({res['init']['dtype']}, CPU, fresh process "
                 "each; peak = process peak RSS, in brackets the peak minus the RSS before building, i.e. without "
                 "the ~0.5 GiB of imported libraries; ratios = conditioned / default):\n")
        L.append("| config | params (GiB of weights) | from_config default: s / peak GiB [over baseline] | "
                 "from_config conditioned: s / peak GiB [over baseline] | build time ratio | peak ratio | "
                 "default init re-run s | apply_init conditioned s (ratio to default init) | mimetic s per layer "
                 "(extrapolated total s, ratio) |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for s in res["init"]["summary"]:
            cb = (f"{s['conditioned_build_s']:.1f} / {s['conditioned_peak_rss_gib']:.2f} "
                  f"[{s['conditioned_peak_over_baseline_gib']:.2f}]" if "conditioned_build_s" in s else "–")
            br = f"{s['build_ratio']:.2f} | {s['peak_rss_ratio']:.3f}" if "build_ratio" in s else "– | –"
            ca = (f"{s['conditioned_apply_s']:.2f} ({s['conditioned_apply_ratio']:.2f})"
                  if s.get("conditioned_apply_ratio") is not None else "–")
            mi = (f"{s['mimetic_per_layer_s']:.1f} ({s['mimetic_extrapolated_s']:.0f}, "
                  f"{s['mimetic_extrapolated_ratio']:.1f}×)" if s.get("mimetic_per_layer_s") else "–")
            L.append(f"| {s['size']} | {s['n_params'] / 1e9:.3f} B ({s['param_gib']:.2f}) | {s['default_build_s']:.1f} / "
                     f"{s['default_peak_rss_gib']:.2f} [{s['default_peak_over_baseline_gib']:.2f}] | {cb} | {br} | "
                     f"{s['default_init_s']:.2f} | {ca} | {mi} |")
        for r in res["init"]["rows"]:
            if "error" in r:
                L.append(f"\n{r['size']} {r['mode']} failed (rc {r['returncode']}): `{r['error'][-300:]}`")
        L.append("")
    return "\n".join(L) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["train", "kappa", "init"], choices=["train", "kappa", "init"])
    p.add_argument("--out", default=os.path.join(C.REPO_ROOT, "benchmarks", "results", "throughput"))
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per arm per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--kappa-reps", type=int, default=2)
    p.add_argument("--sizes", nargs="+", default=["472m", "1.72b"], choices=list(CONFIGS))
    p.add_argument("--init-dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--mimetic-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", help="device of the train part (cpu, cuda, ...); CUDA adds the "
                   "allocator's peak memory of one step per arm")
    p.add_argument("--_init-worker", nargs=4, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not __import__("torch").cuda.is_available():
        print(f"throughput.py: --device {args.device} but torch sees no CUDA device; use --device cpu", file=sys.stderr)
        raise SystemExit(2)
    C.set_threads(args.threads)
    if args._init_worker:
        size, mode, dt, ml = args._init_worker
        print(json.dumps(init_worker(size, mode, dt, int(ml))))
        return {}
    C.quiet_transformers()
    res: dict = {"machine": C.machine_info(), "argv": sys.argv[1:] if argv is None else argv}
    t0 = time.time()
    if "train" in args.parts:
        res["train"] = part_train(args)
    if "kappa" in args.parts:
        res["kappa"] = part_kappa(args, res.get("train"))
    if "init" in args.parts:
        res["init"] = part_init(args)
    res["seconds"] = time.time() - t0
    res["loadavg_1m_end"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    C.write_json(os.path.join(args.out, "throughput.json"), res)
    md = markdown(res)
    with open(os.path.join(args.out, "throughput.md"), "w") as f:
        f.write(md)
    print(md)
    return res


if __name__ == "__main__":
    main()
