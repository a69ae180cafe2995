"""What the conditioned init writes, measured: orthogonality errors per layout and dtype, and κ(J) at init.

Part 1, for every layout adapter (one small model per family, 2 layers, hidden 256, 4 heads; Llama/Mistral/Qwen2
with GQA) and for fp32 and bf16 parameters, after ``from_config(..., condinit="conditioned")``:

- ``qk_orth``: max over layers, heads and roles q/k of ``max |W_hᵀ W_h − I|`` (W_h the (D, d) head block in math
  orientation, computed in float64 from the stored weights);
- ``v_ident``: max over layers of ``max |W_V − block identity|`` (``value_init="block_identity"``, the default).

Part 2, the attention-Jacobian condition number κ(J) (docs/methods.md §6, method ``eig``) at init of a 4-layer,
256-wide, 4-head GPT-2 (vocab 1024) for the default, mimetic and conditioned init (seed 0), on a fixed probe of
``--probe-size`` × ``--probe-length`` random tokens with distinct first tokens: per layer the mean over heads under
the causal mask the model uses, and without it (``include_unmasked``).

Part 3 (``--parts vit_kappa``, needs an image file; ~4 CPU-minutes per init): κ(J) at init of layer 0 of the vision
harness's ViT (``configs/vit-cpu-cifar.json``: 65 tokens, 128 wide, 4 heads of 32) for the same three inits (seed
0), on the first image of ``--image-file`` (a ``datasets`` parquet file with an ``img`` column), per head, with
``method="svd"``. The default ``eig`` path cannot resolve κ above ~1e6 and its SVD refinement stops at
``SVD_REFINE_MAX_ELEMENTS``; this probe's J is 2,080 × 12,288, so the vision harness reports lower bounds, and this
part gives the resolved values.

Part 4 (``--parts cost``; ~30–60 CPU-minutes on the shared 2-core machine): init time of the default, conditioned
and mimetic init, side by side in one run, fp32 on the CPU, one fresh process per (config, init): the assumed
472M / 1.72B GPT-2 configs (``configs/gpt2-472m.json``, ``configs/gpt2-1.72b.json``) and 4-layer, 1024-wide
Llama / Qwen2 (GQA, 4 / 2 KV heads) / GPT-NeoX models. Each process builds the model with its default init
(``from_config``, timed: ``build_s``), then times one thing: ``default`` re-runs the model's own ``_init_weights``
over every module (the denominator of every ratio), ``conditioned`` / ``mimetic`` time
``hf_condinit.apply_init(model, method, seed=0)`` alone. Times are the process's CPU seconds (``process_time``;
the wall time is in the JSON): on a shared machine, waiting for a core is not the init's cost. With
``--threads 1`` (as recorded) CPU time is the compute time. Ratios = init time / default init time of the same
config in the same run. ``mimetic_full_svd`` times the original implementation (one full D×D SVD per head, forced
with ``SUBSPACE_MIN_DIM = ∞``) on the first ``--svd-layers`` blocks, extrapolated to all. The mimetic process
also redraws the targets of the first and last block and reports the largest relative Frobenius error of
W_Q W_Kᵀ (first ``--check-heads`` query heads) and of Σ_h W_V W_O against a float64 SVD's best rank-d /
rank-(H_kv·d) approximation, and how many targets the fast path accepted in fp32 / redid in float64. The load
average is printed with the table: the machine is shared, the ratios are what compares.

    python benchmarks/init_report.py                 # parts 1 and 2, prints Markdown tables
    python benchmarks/init_report.py --parts cost --json benchmarks/results/init_cost.json
    python benchmarks/init_report.py --parts vit_kappa --image-file ../shared/data/cifar10/test_dev.parquet
    python benchmarks/init_report.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageClassification)

import hf_condinit  # noqa: E402
from hf_condinit.layouts import get_layout  # noqa: E402

WIDTH = dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=2, intermediate_size=512)
FAMILIES = {
    "gpt2": dict(n_layer=2, n_embd=256, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=0),
    "bert": dict(WIDTH, vocab_size=64),
    "roberta": dict(WIDTH, vocab_size=64, pad_token_id=1),
    "vit": dict(WIDTH, image_size=8, patch_size=4),
    "deit": dict(WIDTH, image_size=8, patch_size=4),
    "llama": dict(WIDTH, num_key_value_heads=2, vocab_size=64),
    "mistral": dict(WIDTH, num_key_value_heads=1, vocab_size=64),
    "qwen2": dict(WIDTH, num_key_value_heads=2, vocab_size=64),
    "gpt_neox": dict(WIDTH, vocab_size=64),
    "crammed_bert": dict(WIDTH, vocab_size=64),
}


def orthogonality(model) -> dict[str, float]:
    """``qk_orth`` and ``v_ident`` (see the module docstring) over every attention block of ``model``."""
    layout = get_layout(model)
    qk, v = 0.0, 0.0
    for _, block in layout.attention_modules(model):
        g = layout.geometry(block, model.config)
        projections = layout.projections(block, g)
        for role in ("q", "k"):
            p = projections[role]
            for w in p.heads(p.weight.detach()):
                w = w.double()
                qk = max(qk, (w.T @ w - torch.eye(w.shape[1], dtype=torch.double)).abs().max().item())
        p = projections["v"]
        heads = torch.cat([w.double() for w in p.heads(p.weight.detach())], dim=1)  # (D, H_kv·d)
        target = torch.eye(g.hidden, dtype=torch.double)[:, : heads.shape[1]]
        v = max(v, (heads - target).abs().max().item())
    return {"qk_orth": qk, "v_ident": v}


def part_orthogonality() -> list[dict]:
    rows = []
    for model_type, kwargs in FAMILIES.items():
        for dtype in (torch.float32, torch.bfloat16):
            config = AutoConfig.for_model(model_type, **kwargs)
            model = AutoModel.from_config(config, condinit={"method": "conditioned", "seed": 0}, dtype=dtype)
            rows.append({"model_type": model_type, "layout": get_layout(model).name,
                         "dtype": str(dtype).replace("torch.", ""), **orthogonality(model)})
    return rows


def part_kappa(probe_size: int, probe_length: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(1, 1024, (probe_size, probe_length), generator=gen)
    probe[:, 0] = torch.arange(1, probe_size + 1)  # distinct first tokens (docs/methods.md §6)
    config = AutoConfig.for_model("gpt2", n_layer=4, n_embd=256, n_head=4, vocab_size=1024, n_positions=256,
                                 bos_token_id=0, eos_token_id=0)
    rows = []
    for method in ("default", "mimetic", "conditioned"):
        model = AutoModelForCausalLM.from_config(config, condinit={"method": method, "seed": 0}).eval()
        report = hf_condinit.attention_jacobian_condition_number(model, probe, include_unmasked=True)
        layers = [lc.to_dict() for lc in report.layers]
        rows.append({"method": method, "causal": [lc["mean"] for lc in layers],
                     "unmasked": [lc["unmasked_mean"] for lc in layers], "seconds": report.seconds})
    return rows


def part_vit_kappa(image_file: str) -> list[dict]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kappa_curves import probe_pixels

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "vit-cpu-cifar.json")
    config = AutoConfig.from_pretrained(path)
    pixels = probe_pixels(image_file, config, 1)  # (1, 3, H, W), as evaluation sees it
    rows = []
    for method in ("default", "mimetic", "conditioned"):
        model = AutoModelForImageClassification.from_config(config, condinit={"method": method, "seed": 0}).eval()
        report = hf_condinit.attention_jacobian_condition_number(model, pixels, layers=[0], method="svd")
        heads = report.layers[0].heads
        rows.append({"method": method, "kappa": [h.kappa for h in heads],
                     "lower_bound": [h.kappa_is_lower_bound for h in heads], "seconds": report.seconds})
    return rows


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COST_SIZES = dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=4, intermediate_size=2816,
                  vocab_size=32000)
COST_CONFIGS = {  # name -> config file under configs/ or AutoConfig.for_model kwargs
    "gpt2-472m": "gpt2-472m.json",
    "gpt2-1.72b": "gpt2-1.72b.json",
    "llama": dict(COST_SIZES, model_type="llama", num_key_value_heads=4),
    "qwen2": dict(COST_SIZES, model_type="qwen2", num_key_value_heads=2),
    "gpt_neox": dict(COST_SIZES, model_type="gpt_neox", intermediate_size=4096),
}
COST_METHODS = ("default", "conditioned", "mimetic", "mimetic_full_svd")


def _cost_config(name: str):
    spec = COST_CONFIGS[name]
    if isinstance(spec, str):
        with open(os.path.join(REPO_ROOT, "configs", spec)) as f:
            spec = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    return AutoConfig.for_model(**spec)


def _rerun_default_init(model) -> None:
    """The model's own default init, re-run on the built model: ``_init_weights`` over every module."""
    for t in list(model.parameters()) + list(model.buffers()):
        if hasattr(t, "_is_hf_initialized"):
            del t._is_hf_initialized
    with torch.no_grad():
        for m in model.modules():
            model._init_weights(m)


def _mimetic_errors(model, seed: int, check_heads: int, n_blocks: int) -> dict:
    """Largest relative Frobenius error of W_Q W_Kᵀ (first heads of KV groups among the first ``check_heads``) and
    of Σ_h W_V W_O against a float64 SVD of the redrawn targets, over blocks 0 and ``n_blocks`` − 1."""
    from hf_condinit.init.functional import mimetic_target

    cfg = hf_condinit.CondInitConfig(method="mimetic", seed=seed)
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    qk_err = vo_err = 0.0
    for ordinal in sorted({0, n_blocks - 1}):
        block = blocks[ordinal][1]
        g = layout.geometry(block, model.config)
        projs = layout.projections(block, g)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + ordinal)  # hf_condinit.api's per-block seed
        targets = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
                   for _ in range(g.n_heads)]
        vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist,
                            gen)
        heads = {r: projs[r].heads(projs[r].weight.detach()) for r in "qkvo"}
        group = g.n_heads // g.n_kv_heads
        for h in range(0, min(check_heads, g.n_heads), group):
            u, s, vh = torch.linalg.svd(targets[h].double())
            want = (u[:, :g.head_dim] * s[:g.head_dim]) @ vh[:g.head_dim]
            got = heads["q"][h].double() @ heads["k"][h // group].double().T
            qk_err = max(qk_err, float((got - want).norm() / want.norm()))
        r = g.n_kv_heads * g.head_dim
        u, s, vh = torch.linalg.svd(vo.double())
        want = (u[:, :r] * s[:r]) @ vh[:r]
        got = sum(heads["v"][h // group].double() @ heads["o"][h].double() for h in range(g.n_heads))
        vo_err = max(vo_err, float((got - want).norm() / want.norm()))
    return {"qk_rel_err": qk_err, "vo_rel_err": vo_err}


def cost_worker(name: str, svd_layers: int, mimetic_layers: int, check_heads: int) -> list[dict]:
    """One fresh process per config: build it with its default init, then time, one after the other, each of
    `COST_METHODS` on the built model (see the module docstring); one row per method."""
    from hf_condinit.api import init_attention_block
    from hf_condinit.init import functional

    config = _cost_config(name)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    g = layout.geometry(blocks[0][1], model.config)
    common = dict(config=name, build_s=time.perf_counter() - t0, threads=torch.get_num_threads(),
                  n_params=sum(p.numel() for p in model.parameters()), layers=len(blocks), hidden=g.hidden,
                  heads=g.n_heads, kv_heads=g.n_kv_heads, head_dim=g.head_dim)
    precisions = []
    fast = functional.top_singular_factors

    def counted(target, rank):  # counts the fast path's fp32 acceptances and float64 reruns
        left, right, precision = fast(target, rank)
        precisions.append(str(precision).replace("torch.", ""))
        return left, right, precision

    functional.top_singular_factors = counted

    def mimetic_blocks(n: int) -> None:
        cfg = hf_condinit.CondInitConfig(method="mimetic", seed=0)
        for i, (_, block) in enumerate(blocks[:n]):
            init_attention_block(block, i, layout, model.config, cfg, loaded="overwrite")

    rows = []
    for method in COST_METHODS:
        timed = {"mimetic": mimetic_layers, "mimetic_full_svd": svd_layers}.get(method, len(blocks))
        timed = min(timed, len(blocks))
        if method == "mimetic_full_svd":  # the original implementation: one full SVD per head
            functional.SUBSPACE_MIN_DIM = float("inf")
        t0, c0 = time.perf_counter(), time.process_time()
        if method == "default":
            _rerun_default_init(model)
        elif method == "conditioned":
            hf_condinit.apply_init(model, method, seed=0, overwrite_loaded=True)
        else:
            mimetic_blocks(timed)
        scale = len(blocks) / timed
        row = dict(common, method=method, timed_layers=timed, init_wall_s=(time.perf_counter() - t0) * scale,
                   init_s=(time.process_time() - c0) * scale)  # CPU seconds: waiting for a shared core is not cost
        if method == "mimetic":
            row.update(_mimetic_errors(model, 0, check_heads, timed), fp32_accepted=precisions.count("float32"),
                       float64_reruns=precisions.count("float64"))
        rows.append(row)
    return rows


def part_cost(configs: list[str], svd_layers: int, mimetic_layers: int, check_heads: int,
              threads: int | None) -> dict:
    load_before = os.getloadavg()
    rows = []
    for name in configs:
        cmd = [sys.executable, os.path.abspath(__file__), "--_cost-worker", name, str(svd_layers),
               str(mimetic_layers), str(check_heads)] + (["--threads", str(threads)] if threads else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"cost worker {name} failed:\n{proc.stderr[-3000:]}")
        new = json.loads(proc.stdout.strip().splitlines()[-1])
        for row in new:
            row["load_avg_1m"] = os.getloadavg()[0]
            row["ratio"] = row["init_s"] / new[0]["init_s"]  # new[0]: the default init
            print(f"  {name} {row['method']}: init {row['init_s']:.2f} CPU s ({row['ratio']:.2f}×), "
                  f"{row['init_wall_s']:.2f} s wall, load {row['load_avg_1m']:.1f}", file=sys.stderr, flush=True)
        rows += new
    return {"rows": rows, "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "svd_layers": svd_layers, "mimetic_layers": mimetic_layers, "check_heads": check_heads}


def _extrapolated(row: dict) -> str:
    return f", {row['timed_layers']} of {row['layers']} layers" if row["timed_layers"] < row["layers"] else ""


def cost_table(res: dict) -> str:
    """Markdown: one row per config, the init seconds and ratios to the default init."""
    lines = ["| config | params | layers × (heads/KV heads) × d, D | default init s | conditioned s (ratio) | "
             "mimetic s (ratio) | mimetic, full SVD per head (original) s (ratio) | mimetic max rel. error QK / VO "
             "| fp32 / float64 solves |", "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["config"], r["method"]): r for r in res["rows"]}
    for name in dict.fromkeys(r["config"] for r in res["rows"]):
        d, c, m, o = (by[(name, k)] for k in COST_METHODS)
        lines.append(
            f"| {name} | {d['n_params'] / 1e6:.0f}M | {d['layers']} × ({d['heads']}/{d['kv_heads']}) × "
            f"{d['head_dim']}, {d['hidden']} | {d['init_s']:.2f} | {c['init_s']:.2f} ({c['ratio']:.2f}×) | "
            f"{m['init_s']:.1f} ({m['ratio']:.1f}×{_extrapolated(m)}) | {o['init_s']:.0f} ({o['ratio']:.0f}×"
            f"{_extrapolated(o)}) | {m['qk_rel_err']:.1e} / {m['vo_rel_err']:.1e} "
            f"| {m['fp32_accepted']} / {m['float64_reruns']} |")
    lb, la = res["load_avg_before"], res["load_avg_after"]
    lines.append(f"\n{res['cpus']} CPUs, torch threads {res['rows'][0]['threads']}; load average (1/5/15 min) "
                 f"{lb[0]:.1f}/{lb[1]:.1f}/{lb[2]:.1f} before, {la[0]:.1f}/{la[1]:.1f}/{la[2]:.1f} after.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["orthogonality", "kappa"],
                   choices=["orthogonality", "kappa", "vit_kappa", "cost"])
    p.add_argument("--probe-size", type=int, default=2)
    p.add_argument("--probe-length", type=int, default=16)
    p.add_argument("--image-file", default=None, help="parquet file with an `img` column (part vit_kappa)")
    p.add_argument("--cost-configs", nargs="+", default=list(COST_CONFIGS), choices=list(COST_CONFIGS))
    p.add_argument("--svd-layers", type=int, default=1, help="blocks timed for mimetic_full_svd (part cost)")
    p.add_argument("--mimetic-layers", type=int, default=10**6,
                   help="blocks timed for mimetic (part cost; default all), extrapolated to the model")
    p.add_argument("--check-heads", type=int, default=4, help="query heads checked against a float64 SVD (cost)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in the cost workers (default: torch's own choice)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--_cost-worker", nargs=4, help=argparse.SUPPRESS)  # name, svd/mimetic layers, check heads
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._cost_worker:
        name, svd_layers, mimetic_layers, check_heads = args._cost_worker
        print(json.dumps(cost_worker(name, int(svd_layers), int(mimetic_layers), int(check_heads))))
        return
    torch.manual_seed(0)
    out = {}
    if "orthogonality" in args.parts:
        out["orthogonality"] = part_orthogonality()
        print("| model type | layout | dtype | max abs(WᵀW − I), Q/K heads | max abs(W_V − I) |\n|---|---|---|---|---|")
        for r in out["orthogonality"]:
            print(f"| {r['model_type']} | {r['layout']} | {r['dtype']} | {r['qk_orth']:.2e} | {r['v_ident']:.2e} |")
    if "kappa" in args.parts:
        out["kappa"] = part_kappa(args.probe_size, args.probe_length)
        print(f"\nκ(J) at init, GPT-2 4×256, probe {args.probe_size}×{args.probe_length}, mean over heads per layer:")
        print("| init | causal (layers 0..3) | unmasked (layers 0..3) | s |\n|---|---|---|---|")
        for r in out["kappa"]:
            fmt = lambda v: " / ".join(f"{x:.3g}" for x in v)  # noqa: E731
            print(f"| {r['method']} | {fmt(r['causal'])} | {fmt(r['unmasked'])} | {r['seconds']:.1f} |")
    if "vit_kappa" in args.parts:
        if not args.image_file or not os.path.isfile(args.image_file):
            p.error("--parts vit_kappa needs --image-file FILE (a parquet file with an `img` column)")
        out["vit_kappa"] = part_vit_kappa(args.image_file)
        print("\nκ(J) at init, ViT 6×128 (vit-cpu-cifar), layer 0, one image, method svd, per head:")
        print("| init | κ per head (* = lower bound) | s |\n|---|---|---|")
        for r in out["vit_kappa"]:
            ks = " / ".join(f"{k:.3g}{'*' if lb else ''}" for k, lb in zip(r["kappa"], r["lower_bound"]))
            print(f"| {r['method']} | {ks} | {r['seconds']:.0f} |")
    if "cost" in args.parts:
        out["cost"] = part_cost(args.cost_configs, args.svd_layers, args.mimetic_layers, args.check_heads,
                                args.threads)
        if args.json:  # before the table: the measurement took long
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        print("\nInit time (process CPU seconds), fp32, one fresh process per cell; ratio = seconds / default init "
              "seconds of the same config:")
        print(cost_table(out["cost"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
