"""Do conditioned init and the attention variants help? Train the same small GPT-2 per arm and seed, compare.

Arms (``_common.ARMS``): default, mimetic, conditioned, conditioned+affine_scaled, affine_scaled, spectral (λ = 10,
identity mode), preconditioned, attention_sink. Each arm × seed is one ``run_clm.py``-style run through the HF
``Trainer`` (``_lm_run.train_run``: the library's data helpers, ``CondInitTrainer``, the docs/methods.md §7 LM recipe,
``ConditionNumberCallback``), into a normal Trainer output folder ``trainer/<setting>/<arm>/seed<k>/``. Same data order
per seed across arms (the Trainer's sampler seeded with the seed), held-out split = the first 5 % of the documents.

Per arm the report gives: final eval perplexity (full held-out split, and each ``--eval-file``) mean ± std over seeds;
the paired difference to default with its 95 % interval and verdict (``_verdict.judge``: better / worse / no, Holm
over the table); steps to reach the default arm's final eval
loss (on the eval-curve subset, linear interpolation between eval points) and the ratio to the run length; κ(J) of the
attention Jacobian (docs/methods.md §6; causal mask as used, and unmasked) with its surrogate bound at a few points of the
run (first seed only, small probe: it costs seconds per measurement); step-0 diagnostics (initial loss, attention
entropy per layer, activation scales); parameter counts (all / non-embedding), tokens seen and epochs. Outputs in
``--out``: ``runs/<setting>/<arm>/seed<k>.json`` (one record per finished run, written last — a rerun skips it;
several workers may share the directory: runs in progress are claimed with lock files), the Trainer folders,
``results.json``, ``results.md`` and PNG plots (``loss.png``, ``kappa.png``, ``sweep.png``).

    python benchmarks/compare.py                       # default mode (8 arms × 3 seeds), ≤ 45 min on 2 cores
    python benchmarks/compare.py --quick               # 2 arms × 1 seed, tiny model, ≤ 3 min
    python benchmarks/compare.py --quick --eval-file ../shared/data/wikitext/wikitext-2-raw/wiki.valid.raw
    python benchmarks/compare.py --data wikitext2-train --eval-file ../shared/data/wikitext/wikitext-2-raw/wiki.valid.raw \\
        --tokens-per-param 5 --arms default conditioned
    python benchmarks/compare.py --sweep               # + the built-in sensitivity sweep (conditioned vs default)
    python benchmarks/compare.py --sweep qk_gain=0.25 lr=3e-4 n_layer=8   # a custom sweep
    python benchmarks/compare.py --report-only         # rebuild results.* from the finished runs
    python benchmarks/compare.py --scale-sweep         # the scale sweep of issue 13 (benchmarks/_scale.py)
    python benchmarks/compare.py --depth-sweep         # the depth sweep of issue 21 (benchmarks/_depth.py)
    python benchmarks/compare.py --task vision         # ViT on CIFAR-10 (benchmarks/_vision.py; --quick, --report-only)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import _lm_run as LM  # noqa: E402
import _verdict as V  # noqa: E402
from _common import fail, steps_for_tokens_per_param  # noqa: E402

# Built-in sweep: name -> overrides of the base TrainSpec. Gain-only settings change the conditioned arm only.
DEFAULT_SWEEP = [
    "qk_gain=0.25",
    "v_gain=0.25",
    "qk_gain=0.25,v_gain=0.25",
    "lr=3e-4",
    "n_layer=8",
    "steps=x2",
    "steps=x2,qk_gain=0.25,v_gain=0.25",
]
GAIN_KEYS = ("qk_gain", "v_gain")
SWEEP_KEYS = ("qk_gain", "v_gain", "lr", "n_layer", "n_embd", "n_head", "steps", "batch_size", "block_size",
              "warmup", "weight_decay")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["lm", "vision"], default="lm",
                   help="lm (this mode) or vision: ViT on CIFAR-10, its own flags (benchmarks/_vision.py --help)")
    p.add_argument("--scale-sweep", action="store_true",
                   help="the scale sweep of issue 13 (benchmarks/_scale.py): sizes × arms × seeds, a length and an "
                        "LR sweep at the middle size, the trend of the gap to default; with --quick, --report-only")
    p.add_argument("--depth-sweep", action="store_true",
                   help="the depth sweep of issue 21 (benchmarks/_depth.py): depths 2/4/8 at width 64, each arm at "
                        "its own best learning rate of an LR grid at depth 4; with --quick, --report-only")
    p.add_argument("--data", nargs="+", default=None, metavar="DATA",
                   help="text files or directories (their text files, sorted), read in the order given, documents "
                        "kept whole; or aliases of files under ../shared/data: %s (default tinystories; "
                        "--scale-sweep / --depth-sweep: enwiki wikitext2-train)" % ", ".join(C.DATASETS))
    p.add_argument("--blimp-dir", default=None, metavar="DIR",
                   help="BLiMP minimal pairs (*.jsonl) scored for every LM run next to its perplexity (default "
                        "../shared/data/blimp; a note and no BLiMP when absent; --quick: only when given)")
    p.add_argument("--no-blimp", action="store_true", help="record no BLiMP accuracy")
    p.add_argument("--eval-file", action="append", default=[], metavar="FILE",
                   help="also evaluate every run on this text file (repeatable; same tokenizer and block size; "
                        "perplexity per file in results.json)")
    p.add_argument("--tokens-per-param", type=float, default=None, metavar="K",
                   help="train K tokens per non-embedding parameter (sets --steps; epochs > 1 are reported)")
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/compare[_quick])")
    p.add_argument("--arms", nargs="+", default=None, help=f"subset of {list(C.ARMS)}")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick 1)")
    p.add_argument("--quick", action="store_true", help="tiny model, 2 arms, 1 seed, ~20 steps (≤ 3 min)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--n-layer", type=int, default=None)
    p.add_argument("--n-embd", type=int, default=None)
    p.add_argument("--n-head", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--eval-blocks", type=int, default=None)
    p.add_argument("--kappa-at", type=float, nargs="*", default=None,
                   help="fractions of the run at which κ(J) is measured (default 0 0.25 0.5 1; none: skip)")
    p.add_argument("--kappa-seeds", type=int, default=1, help="κ(J) for the first K seeds only (default 1)")
    p.add_argument("--kappa-probe", type=int, nargs=2, default=None, metavar=("SEQS", "TOKENS"))
    p.add_argument("--max-bytes", type=int, default=None, help="read only the first N bytes of the data")
    p.add_argument("--sweep", nargs="*", default=None,
                   help="sensitivity sweep settings 'k=v[,k=v]' (keys: %s; steps=xN multiplies); "
                        "no value: the built-in list %s" % (", ".join(SWEEP_KEYS), DEFAULT_SWEEP))
    p.add_argument("--sweep-seeds", type=int, default=1, help="seeds per sweep setting (default 1)")
    p.add_argument("--no-base", action="store_true", help="only the sweep (its default arm still comes from base)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores / workers)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="train and evaluate on the CPU (default) or the first GPU; each record says where it ran")
    p.add_argument("--depths", type=int, nargs="+", default=None, metavar="N",
                   help="--depth-sweep: train only the runs of these depths (grid runs included at the grid's "
                        "depth), e.g. to split the sweep between machines; default every depth of the plan")
    p.add_argument("--train-arms", nargs="+", default=None, metavar="ARM",
                   help="--depth-sweep: train only these arms' runs (default's same-rate runs count as default); the "
                        "plan is unchanged: like --depths, to put the runs a headline rests on first or to split the "
                        "sweep between workers")
    p.add_argument("--grid-depths", type=int, nargs="+", default=None, metavar="N",
                   help="--depth-sweep: also an LR grid at these depths (20 tokens per parameter, seed 0, the "
                        "depth-4 grid's rates extended like it); each arm's runs there use that grid's best rate "
                        "(pass it to --report-only too)")
    p.add_argument("--report-only", action="store_true", help="only aggregate the finished runs")
    p.add_argument("--no-report", action="store_true", help="run, but leave the aggregation to another call")
    p.add_argument("--copy-plots", default=None, help="also copy the PNG plots into this directory")
    args = p.parse_args(argv)
    if args.data is None:
        args.data = ["enwiki", "wikitext2-train"] if args.scale_sweep or args.depth_sweep else ["tinystories"]
    return args



def base_spec_kwargs(args) -> dict:
    if args.quick:
        kw = dict(n_layer=2, n_embd=64, n_head=2, block_size=64, batch_size=8, steps=20, lr=3e-3, eval_every=5,
                  eval_blocks=8, log_every=2, kappa_at=(0.0, 1.0), kappa_probe=(2, 8), diag_probe=(2, 32))
    else:
        kw = dict(n_layer=4, n_embd=256, n_head=4, block_size=256, batch_size=8, steps=150, lr=1e-3, eval_every=15,
                  eval_blocks=16, log_every=5, kappa_at=(0.0, 0.25, 0.5, 1.0), kappa_probe=(2, 8),
                  diag_probe=(4, 128))
    for name in ("steps", "batch_size", "lr", "n_layer", "n_embd", "n_head", "block_size", "eval_every",
                 "eval_blocks"):
        v = getattr(args, name)
        if v is not None:
            kw[name] = v
    if args.kappa_at is not None:
        kw["kappa_at"] = tuple(args.kappa_at)
    if args.kappa_probe is not None:
        kw["kappa_probe"] = tuple(args.kappa_probe)
    if args.tokens_per_param is not None:
        kw["tokens_per_param"] = args.tokens_per_param
        kw["steps"] = steps_for_tokens_per_param(kw)
    return kw


def data_kwargs(args) -> dict:
    vocab = args.vocab_size or (512 if args.quick else 4096)
    max_bytes = args.max_bytes if args.max_bytes is not None else (300_000 if args.quick else None)
    return dict(paths=C.resolve_data_paths(args.data), vocab_size=vocab, max_bytes=max_bytes)


def check_args(args) -> None:
    """Every user error that can be seen before any data or model work (exits 2 with one line)."""
    from hf_condinit.data.documents import expand_text_paths

    if args.tokens_per_param is not None:
        if args.steps is not None:
            fail("--steps and --tokens-per-param both set the run length; pass one of them")
        if args.tokens_per_param <= 0:
            fail(f"--tokens-per-param must be > 0, got {args.tokens_per_param}")
    for a in args.arms or []:
        if a not in C.ARMS:
            fail(f"unknown arm {a!r}; choose from {', '.join(C.ARMS)}")
    try:
        expand_text_paths(C.resolve_data_paths(args.data), "data")
        for path in args.eval_file:
            expand_text_paths([path], "eval-file")
    except ValueError as err:
        fail(str(err))
    names = [eval_file_name(p) for p in args.eval_file]
    if len(set(names)) != len(names):
        fail(f"--eval-file: two files share a name ({', '.join(names)}); results are keyed by file name")


def eval_file_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def parse_setting(text: str, base: dict) -> tuple[str, dict]:
    over = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            fail(f"--sweep: bad setting {part!r}; expected key=value")
        k, v = (s.strip() for s in part.split("=", 1))
        if k not in SWEEP_KEYS:
            fail(f"--sweep: unknown key {k!r}; known: {', '.join(SWEEP_KEYS)}")
        if k == "steps" and v.startswith("x"):
            over[k] = int(round(base["steps"] * float(v[1:])))
        elif k in ("lr", "qk_gain", "v_gain", "warmup", "weight_decay"):
            over[k] = float(v)
        else:
            over[k] = int(v)
    return _setting_name(over), over


def _setting_name(over: dict) -> str:
    return "base" if not over else ",".join(f"{k}={v}" for k, v in over.items())


def plan_runs(args) -> tuple[list, dict]:
    """All TrainSpecs of this invocation, in priority order: base seeds 0-1, the sweep settings that keep the run
    length and depth, the other base seeds, then the longer/deeper sweep settings. A sweep setting's default arm
    ignores the conditioned-only gains (so it is shared with the setting without them, or with base)."""
    base = base_spec_kwargs(args)
    arms = args.arms or (["default", "conditioned"] if args.quick else list(C.ARMS))
    n_seeds = args.seeds or (1 if args.quick else 3)

    def spec(arm, seed, setting, over):
        kw = dict(base)
        kw.update(over)
        if kw.get("tokens_per_param") is not None and "steps" not in over:
            kw["steps"] = steps_for_tokens_per_param(kw)
        if seed >= args.kappa_seeds:
            kw["kappa_at"] = ()
        elif setting != "base" and kw["kappa_at"]:
            kw["kappa_at"] = (0.0, 1.0)  # sweep runs: κ at the start and the end only
        return LM.TrainSpec(arm=arm, seed=seed, setting=setting, **kw)

    base_runs = [] if args.no_base else [spec(a, s, "base", {}) for s in range(n_seeds) for a in arms]
    cheap, costly = [], []
    settings = {"base": {}}
    if args.sweep is not None:
        for item in (args.sweep if args.sweep else DEFAULT_SWEEP):
            name, over = parse_setting(item, base)
            settings[name] = over
            for s in range(args.sweep_seeds):
                for a in ("default", "conditioned"):
                    o = over if C.ARMS[a][0] == "conditioned" else {k: v for k, v in over.items()
                                                                     if k not in GAIN_KEYS}
                    target = costly if any(k in o for k in ("steps", "n_layer", "n_embd", "block_size")) else cheap
                    target.append(spec(a, s, name if o == over else _setting_name(o), o))
    early = [r for r in base_runs if r.seed < 2]
    late = [r for r in base_runs if r.seed >= 2]
    runs, seen = [], set()
    for r in early + cheap + late + costly:
        ident = (r.setting, r.arm, r.seed)
        if ident not in seen:
            seen.add(ident)
            runs.append(r)
    return runs, settings


def run_path(out: str, spec) -> str:
    """The run's record; written last, so its presence (with the spec's key) marks the run finished."""
    return os.path.join(out, "runs", spec.setting, spec.arm.replace("+", "_plus_"), f"seed{spec.seed}.json")


def trainer_dir(out: str, spec) -> str:
    """The run's Trainer output folder (``config.json``, ``trainer_state.json``, ``eval_results.json``, ...)."""
    return os.path.join(out, "trainer", spec.setting, spec.arm.replace("+", "_plus_"), f"seed{spec.seed}")


def add_missing_eval_files(path: str, run_dir: str, eval_sets: dict, eval_info: dict) -> None:
    """A finished run (record ``path``, Trainer folder ``run_dir``) that lacks some ``--eval-file`` results: evaluate
    its saved model on them and update the record (the run is not retrained)."""
    with open(path) as f:
        rec = json.load(f)
    missing = {n: ds for n, ds in eval_sets.items() if n not in rec.get("eval_files", {})}
    if not missing:
        return
    print(f"[compare] {path}: evaluating the saved model on {', '.join(missing)}", file=sys.stderr)
    rec.setdefault("eval_files", {}).update(LM.evaluate_saved_run(run_dir, rec["spec"], missing))
    rec.setdefault("eval_file_info", {}).update({n: eval_info[n] for n in missing})
    C.write_json(path, rec)


# ---------------------------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------------------------


def eval_file_stats(name: str, seeds: dict, default: dict) -> dict:
    """Loss / perplexity on one ``--eval-file`` over seeds (mean ± std) and, given the default arm's runs, the
    paired loss difference to default (``_verdict.paired``: same device and batches; mean ± std)."""
    loss = {s: r["eval_files"][name]["loss"] for s, r in sorted(seeds.items()) if name in r.get("eval_files", {})}
    ppl = [math.exp(v) if v < 700 else float("inf") for v in loss.values()]
    out = dict(seeds=list(loss), loss=list(loss.values()), ppl=ppl)
    out["loss_mean"], out["loss_std"] = V.mean_std(out["loss"])
    out["ppl_mean"], out["ppl_std"] = V.mean_std(ppl)
    if default:
        side = lambda runs: {s: V.entry(r, r.get("eval_files", {}).get(name, {}).get("loss"))  # noqa: E731
                             for s, r in runs.items()}
        diffs = list(V.paired(side(seeds), side(default)).values())
        out["delta_loss_vs_default"] = diffs
        out["delta_mean"], out["delta_std"] = V.mean_std(diffs)
    return out


def aggregate_setting(recs: list[dict]) -> dict:
    by_arm: dict[str, dict[int, dict]] = {}
    for r in recs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    out = {"arms": {}}
    family: dict = {}  # (arm, "loss" | "blimp") -> seed -> paired Δ: the verdicts of one table (_verdict.judge)
    default = by_arm.get("default", {})
    target = None
    if default:
        target = statistics.fmean(r["eval_curve"][-1][1] for r in default.values())
        out["target_eval_loss"] = target
    for arm, seeds in by_arm.items():
        rs = [seeds[s] for s in sorted(seeds)]
        losses = [r["final_eval_loss"] for r in rs]
        ppls = [r["final_eval_ppl"] for r in rs]
        lm, ls = V.mean_std(losses)
        pm, ps = V.mean_std(ppls)
        steps_total = rs[0]["spec"]["steps"]
        a = dict(seeds=sorted(seeds), final_eval_loss=losses, final_eval_ppl=ppls, loss_mean=lm, loss_std=ls,
                 ppl_mean=pm, ppl_std=ps, steps=steps_total,
                 initial_eval_loss=V.mean_std([r["initial_eval_loss"] for r in rs])[0],
                 tokens_per_s=V.mean_std([r["tokens_per_s"] for r in rs])[0],
                 train_seconds=V.mean_std([r["train_seconds"] for r in rs])[0],
                 epochs=rs[0].get("epochs"), diverged=[r["seed"] for r in rs if "diverged_at" in r],
                 n_params=rs[0]["n_params"], n_params_non_embedding=rs[0]["n_params_non_embedding"],
                 tokens_seen=rs[0]["tokens_seen"],
                 tokens_per_param=rs[0]["tokens_seen"] / rs[0]["n_params_non_embedding"],
                 devices=sorted({r.get("device") or "unknown" for r in rs}))
        acc = [C.blimp_accuracy(r) for r in rs]
        a["blimp_accuracy"] = acc
        a["blimp_mean"], a["blimp_std"] = V.mean_std(acc)
        if arm != "default" and default:
            d_acc = V.paired({s: V.entry(r, C.blimp_accuracy(r)) for s, r in seeds.items()},
                             {s: V.entry(r, C.blimp_accuracy(r)) for s, r in default.items()})
            a["delta_blimp_vs_default"] = list(d_acc.values())
            a["delta_blimp_mean"], a["delta_blimp_std"] = V.mean_std(list(d_acc.values()))
            family[(arm, "blimp")] = d_acc
        files = sorted({n for r in rs for n in r.get("eval_files", {})})
        if files:
            a["eval_files"] = {name: eval_file_stats(name, seeds, default if arm != "default" else {})
                               for name in files}
        if target is not None:
            cross = [C.crossing_step(r["eval_curve"], target) for r in rs]
            reached = [c for c in cross if c is not None]
            a["steps_to_default_final"] = cross
            a["steps_to_default_final_mean"] = statistics.fmean(reached) if reached else None
            a["n_reached"] = len(reached)
            a["ratio_to_run_length"] = (a["steps_to_default_final_mean"] / steps_total) if reached else None
        if arm != "default" and default:
            diffs = V.paired({s: V.entry(r, r["final_eval_loss"]) for s, r in seeds.items()},
                             {s: V.entry(r, r["final_eval_loss"]) for s, r in default.items()})
            a["delta_loss_vs_default"] = list(diffs.values())
            a["delta_mean"], a["delta_std"] = V.mean_std(list(diffs.values()))
            family[(arm, "loss")] = diffs
        # κ curve (runs that measured it)
        kruns = [r for r in rs if r.get("kappa")]
        if kruns:
            kr = kruns[0]
            a["kappa_seed"] = kr["seed"]
            a["kappa"] = [{k: v for k, v in m.items() if k != "layers"} | {
                "layer_mean": [l["mean"] for l in m["layers"]],
                "layer_unmasked_mean": [l.get("unmasked_mean") for l in m["layers"]],
                "layer_bound": [l["bound"] for l in m["layers"]],
                "layer_kappa_p": [l["kappa_p"] for l in m["layers"]],
                "layer_kappa_px": [l["kappa_px"] for l in m["layers"]]} for m in kr["kappa"]]
        s0 = rs[0]["step0"]
        a["step0"] = dict(
            uniform_causal_entropy=s0["uniform_causal_entropy"],
            attn_entropy=[l["attn_entropy"] for l in s0["layers"]],
            logit_std=[l["logit_std"] for l in s0["layers"]],
            max_prob=[l["max_prob"] for l in s0["layers"]],
            x_rms=[l["x_rms"] for l in s0["layers"]], q_rms=[l["q_rms"] for l in s0["layers"]],
            v_rms=[l["v_rms"] for l in s0["layers"]], attn_out_rms=[l["attn_out_rms"] for l in s0["layers"]],
            resid_rms=[l["resid_rms"] for l in s0["layers"]], logits_std=s0["logits_std"])
        a["eval_curves"] = {r["seed"]: r["eval_curve"] for r in rs}
        a["train_curves"] = {r["seed"]: [[t[0], t[1]] for t in r["train_curve"]] for r in rs}
        out["arms"][arm] = a
    out["verdict_family_size"] = {}
    for what in ("loss", "blimp"):  # one family per metric column of the table
        verdicts = V.judge({arm: d for (arm, w), d in family.items() if w == what}, higher_is_better=what == "blimp")
        for arm, v in verdicts.items():
            out["arms"][arm][f"{what}_verdict"] = v
        out["verdict_family_size"][what] = len([v for v in verdicts.values() if v["n"] >= 2])
    return out


def _fmt(x, nd=3):
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, float) and (abs(x) >= 1e4 or (0 < abs(x) < 1e-3)):
        return f"{x:.2e}"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _pct(x, sign=False):
    """A 0-1 accuracy (or difference) in percent (points), "–" when missing."""
    if x is None:
        return "–"
    return f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}"


def arm_order(arms):
    order = list(C.ARMS)
    return sorted(arms, key=lambda a: order.index(a) if a in order else len(order))


def markdown(results: dict) -> str:
    lines = []
    base = results["settings"].get("base")
    info = results["data"]
    lines.append(f"Data: `{os.path.basename(info.get('path', '?'))}`, {info.get('train_tokens')} training tokens, "
                 f"{info.get('val_tokens')} held-out tokens (BPE vocab {info.get('vocab_size')}, block "
                 f"{info.get('block_size')}).\n")
    if base:
        spec = results["base_spec"]
        a0 = next(iter(base["arms"].values()))
        lines.append(f"Model: GPT-2 {spec['n_layer']} layers × {spec['n_embd']} wide, {spec['n_head']} heads, context "
                     f"{spec['block_size']}; {spec['steps']} steps × batch {spec['batch_size']} × {spec['block_size']}"
                     f" tokens = {a0.get('epochs', 0):.2f} epochs of the training split; AdamW lr {spec['lr']}, "
                     f"β (0.9, 0.95), wd 0.1, warmup {spec['warmup']}, cosine, clip 1.0.\n")
        devices = sorted({d for a in base["arms"].values() for d in a["devices"]})
        flat = V.flat_curve(base["arms"]["default"]["eval_curves"].values(), spec["steps"]) \
            if "default" in base["arms"] else None
        lines.append(f"Parameters: {a0['n_params']:,} ({a0['n_params_non_embedding']:,} non-embedding); tokens seen "
                     f"{a0['tokens_seen']:,} = {a0['tokens_seen'] / a0['n_params']:.3f} tokens per parameter "
                     f"({a0['tokens_per_param']:.3f} per non-embedding parameter), {a0['epochs']:.2f} epochs"
                     + (": training blocks are seen more than once" if a0["epochs"] > 1 else "")
                     + f". Ran on: {', '.join(devices)}. {V.flat_sentence(flat)}\n")
        lines.append("| arm | seeds | eval ppl (mean ± std) | eval loss | Δ loss vs default, paired: mean [95 % CI] "
                     "verdict | BLiMP acc. % (mean ± std) | Δ BLiMP pts, paired: mean [95 % CI] verdict | "
                     "steps to default's final loss (ratio) | tokens/s |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            a = base["arms"][arm]
            st = a.get("steps_to_default_final_mean")
            reach = (f"{st:.0f} ({a['ratio_to_run_length']:.2f}), {a['n_reached']}/{len(a['seeds'])} seeds"
                     if st is not None else f"not reached (0/{len(a['seeds'])})")
            lines.append(f"| {arm} | {len(a['seeds'])} | {_fmt(a['ppl_mean'], 2)} ± {_fmt(a['ppl_std'], 2)} | "
                         f"{_fmt(a['loss_mean'])} | {V.fmt(a.get('loss_verdict'))} | {_pct(a.get('blimp_mean'))} ± "
                         f"{_pct(a.get('blimp_std'))} | {V.fmt(a.get('blimp_verdict'), 2, 100)} | {reach} | "
                         f"{_fmt(a['tokens_per_s'], 0)} |")
        lines.append("")
        lines.append(V.family_caption("this table's Δ loss cells (arms against default)",
                                      base["verdict_family_size"]["loss"])
                     + " The Δ BLiMP column is its own family of "
                     f"{base['verdict_family_size']['blimp']} cells.")
        lines.append("")
        files = sorted({n for a in base["arms"].values() for n in a.get("eval_files", {})})
        if files:
            lines.append("Perplexity on the `--eval-file` texts (every document, same tokenizer and blocks; mean ± std "
                         "over seeds; Δ = paired loss difference to default):\n")
            lines.append("| arm | " + " | ".join(f"{n} ppl | Δ loss" for n in files) + " |")
            lines.append("|---|" + "---|---|" * len(files))
            for arm in arm_order(base["arms"]):
                cells = []
                for n in files:
                    e = base["arms"][arm].get("eval_files", {}).get(n)
                    if e is None:
                        cells += ["–", "–"]
                        continue
                    cells.append(f"{_fmt(e['ppl_mean'], 2)} ± {_fmt(e['ppl_std'], 2)}")
                    cells.append("–" if "delta_mean" not in e else f"{_fmt(e['delta_mean'])} ± {_fmt(e['delta_std'])}")
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
            lines.append("")
        lines.append("κ(J) of the attention Jacobian (mean over layers of the per-layer mean over heads; probe "
                     f"{spec['kappa_probe'][0]} × {spec['kappa_probe'][1]} held-out tokens; causal = the mask the "
                     "model uses, unmasked = same heads without it; surrogate = the papers' S of docs/methods.md §1, causal, "
                     "which is not an upper bound of κ):\n")
        lines.append("| arm | step | κ causal | κ unmasked | surrogate | κ(P) layer 0 | saturated heads | s/measurement |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            for m in base["arms"][arm].get("kappa", []):
                lines.append(f"| {arm} | {m['step']} | {_fmt(m['mean'], 1)} | {_fmt(m.get('unmasked_mean'), 1)} | "
                             f"{_fmt(m['bound_mean'], 1)} | {_fmt(m['layer_kappa_p'][0], 1)} | "
                             f"{m['n_saturated']}/{m['n_heads']} | {_fmt(m['seconds'], 1)} |")
        lines.append("")
        lines.append("Step-0 diagnostics (first seed; per layer 0..L-1): initial eval loss, softmax attention entropy "
                     "(nats; uniform causal attention = "
                     f"{_fmt(next(iter(base['arms'].values()))['step0']['uniform_causal_entropy'], 2)}), std of "
                     "the attention logits, RMS of V and of the attention block output:\n")
        lines.append("| arm | initial loss | attention entropy | logit std | V rms | attn out rms | logits std |")
        lines.append("|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            s = base["arms"][arm]["step0"]
            j = lambda xs, nd=2: " / ".join(_fmt(x, nd) for x in xs)  # noqa: E731
            lines.append(f"| {arm} | {_fmt(base['arms'][arm]['initial_eval_loss'])} | {j(s['attn_entropy'])} | "
                         f"{j(s['logit_std'])} | {j(s['v_rms'])} | {j(s['attn_out_rms'], 3)} | "
                         f"{_fmt(s['logits_std'], 2)} |")
        lines.append("")
    sweep = {k: v for k, v in results["settings"].items() if k != "base"}
    if sweep:
        lines.append("Sweep (conditioned vs default; the default arm of gain-only settings is the base default; "
                     "Δ = conditioned − default final eval loss, paired by seed):\n")
        rows = {name: agg["arms"] for name, agg in results["settings"].items()
                if "conditioned" in agg["arms"] and "default" in agg["arms"]}
        verdicts = V.judge({name: arms["conditioned"].get("loss_verdict", {}).get("diffs", {})
                            for name, arms in rows.items()})
        lines.append("| setting | seeds | default loss | conditioned loss | Δ: mean [95 % CI] verdict | "
                     "cond. step-0 entropy (layers) | default step-0 entropy |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, arms in rows.items():
            c, d = arms["conditioned"], arms["default"]
            j = lambda xs: " / ".join(_fmt(x, 2) for x in xs)  # noqa: E731
            lines.append(f"| {name} | {verdicts[name]['n']} | {_fmt(d['loss_mean'])} | {_fmt(c['loss_mean'])} | "
                         f"{V.fmt(verdicts[name])} | {j(c['step0']['attn_entropy'])} | "
                         f"{j(d['step0']['attn_entropy'])} |")
        lines.append("")
        lines.append(V.family_caption("this table's rows (conditioned against default per setting)",
                                      len([v for v in verdicts.values() if v["n"] >= 2])))
        lines.append("")
    lines.append("BLiMP: accuracy on the minimal pairs of `--blimp-dir` (a pair is right when the grammatical "
                 "sentence has the higher total log-probability, EOS prefix; chance 50 %); '–' = run recorded "
                 "without it.\n")
    lines.append("Steps to default's final loss: first crossing of the mean final eval-curve loss of default "
                 "(eval-curve subset, linear interpolation).")
    return "\n".join(lines) + "\n"


def plots(results: dict, out: str, groups: list) -> list[str]:
    """``loss.png`` (held-out loss vs step per arm, mean over seeds with a ±1 std band: ``hf_condinit.compare``'s
    ``plot_eval_curves`` of one ``RunGroup`` per arm), ``kappa.png`` (κ(J) vs step, ``plot_kappa``, when measured)
    and, with a sweep, ``sweep.png`` (the eval curves of every sweep setting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_condinit.compare import RunGroup, plot_eval_curves, plot_kappa

    written = []
    colors = {a: plt.cm.tab10(i) for i, a in enumerate(C.ARMS)}
    base = results["settings"].get("base")
    if groups:
        written.append(plot_eval_curves(groups, os.path.join(out, "loss.png"), metric="eval_loss"))
        measured = [RunGroup(g.label, [r for r in g.runs if r.kappa]) for g in groups]  # κ: the seeds that measured it
        if any(g.runs for g in measured):
            written.append(plot_kappa([g for g in measured if g.runs], os.path.join(out, "kappa.png")))
    sweep = [(k, v) for k, v in results["settings"].items() if k != "base"]
    if sweep:
        n = len(sweep)
        cols = min(4, n)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
        for ax, (name, agg) in zip(axes.flat, sweep):
            arms = dict(agg["arms"])
            if "default" not in arms and base and "default" in base["arms"]:
                arms["default"] = base["arms"]["default"]
            for arm in arm_order(arms):
                for s, c in arms[arm]["eval_curves"].items():
                    ax.plot([p[0] for p in c], [p[1] for p in c], color=colors.get(arm), lw=1.2,
                            label=arm if str(s) == str(min(arms[arm]["eval_curves"], key=str)) else None)
            ax.set_title(name, fontsize=9)
            lo = min(p[1] for a in arms.values() for c in a["eval_curves"].values() for p in c)
            ax.set_ylim(lo - 0.1, lo + 2.0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        p = os.path.join(out, "sweep.png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written


def base_groups(recs: list[dict]) -> list:
    """One ``hf_condinit.compare.RunGroup`` per arm, in arm order, built from the committed records (so the figures
    come from what is committed, whatever machine each run trained on): :func:`run_from_record`."""
    from hf_condinit.compare import RunGroup

    by_arm: dict[str, list] = {}
    for r in sorted(recs, key=lambda r: r["seed"]):
        by_arm.setdefault(r["arm"], []).append(run_from_record(r))
    return [RunGroup(arm, by_arm[arm]) for arm in arm_order(by_arm)]


def run_from_record(rec: dict):
    """A ``hf_condinit.reporting.runs.RunSummary`` of one run record: its eval curve (``eval_loss`` by step), its
    κ(J) measurements (layer mean and max; a measurement with saturated heads is a lower bound), its recipe."""
    from hf_condinit.reporting.runs import KappaRecord, RunSummary

    kappa = [KappaRecord(step=k["step"], mean=k["mean"], max=k["max"], n_lower_bound=k.get("n_saturated", 0))
             for k in rec.get("kappa") or []]
    return RunSummary(path=rec.get("run_dir", ""), name=f"{rec['arm']}/seed{rec['seed']}", condinit=rec["condinit"],
                      attention=None, recipe=rec["recipe"], log_history=[{"step": s, "eval_loss": v}
                                                                         for s, v in rec["eval_curve"]],
                      final_metrics={}, kappa=kappa, tokens_per_second=rec.get("tokens_per_s"),
                      global_step=rec["steps"])


def collect(out: str) -> tuple[dict, list]:
    """The aggregate of the finished records under ``out``/runs (read only): ``(results, base records)``;
    ``results`` is what ``results.json`` holds and :func:`markdown` reads."""
    recs_by_setting: dict[str, list] = {}
    runs_dir = os.path.join(out, "runs")
    for root, _, files in os.walk(runs_dir):
        for fn in files:
            if fn.endswith(".json"):
                with open(os.path.join(root, fn)) as f:
                    r = json.load(f)
                recs_by_setting.setdefault(r["setting"], []).append(r)
    if not recs_by_setting:
        fail(f"no finished runs under {runs_dir}; run without --report-only first")
    base_recs = recs_by_setting.get("base", [])
    results = {"settings": {},
               "data": (base_recs or next(iter(recs_by_setting.values())))[0]["data"]}
    results["eval_files"] = {n: i for rs in recs_by_setting.values() for r in rs
                             for n, i in r.get("eval_file_info", {}).items()}
    if base_recs:
        spec = dict(base_recs[0]["spec"])
        for k in ("arm", "seed", "setting"):
            spec.pop(k, None)
        results["base_spec"] = spec
    for name in sorted(recs_by_setting, key=lambda n: (n != "base", n)):
        recs = list(recs_by_setting[name])
        if not any(r["arm"] == "default" for r in recs):
            # the default arm ignores the gains: take it from the setting with the same non-gain options
            def core(r):
                return {k: v for k, v in r["spec"].items() if k in SWEEP_KEYS and k not in GAIN_KEYS}

            want = core(recs[0])
            seeds = {r["seed"] for r in recs}
            recs += [r for rs in recs_by_setting.values() for r in rs
                     if r["arm"] == "default" and r["seed"] in seeds and core(r) == want]
        results["settings"][name] = aggregate_setting(recs)
        if name != "base":
            results["settings"][name]["overrides"] = {k: v for k, v in recs[0]["spec"].items() if k in SWEEP_KEYS}
    results["total_train_seconds"] = sum(r["train_seconds"] for rs in recs_by_setting.values() for r in rs)
    results["total_kappa_seconds"] = sum(r["kappa_seconds"] for rs in recs_by_setting.values() for r in rs)
    results["n_runs"] = sum(len(v) for v in recs_by_setting.values())
    return results, base_recs


def report(args, out: str, settings: dict) -> dict:
    results, base_recs = collect(out)
    results.update(machine=C.machine_info(), argv=sys.argv[1:])  # where the report was made (not in markdown)
    C.write_json(os.path.join(out, "results.json"), results)
    md = markdown(results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    written = plots(results, out, base_groups(base_recs))
    if args.copy_plots:
        os.makedirs(args.copy_plots, exist_ok=True)
        for p in written:
            shutil.copy(p, os.path.join(args.copy_plots, os.path.basename(p)))
    results["plots"] = written
    return results


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    C.provenance()  # the code this process loaded, before any commit made while it trains
    if "--task=vision" in argv or any(a == "--task" and b == "vision" for a, b in zip(argv, argv[1:])):
        import _vision  # ViT on CIFAR-10 (issue 12): its own flags, see benchmarks/_vision.py

        return _vision.main(argv)
    args = parse_args(argv)
    if args.scale_sweep and args.depth_sweep:
        fail("--scale-sweep and --depth-sweep are two modes; pass one of them")
    if args.depths is not None and not args.depth_sweep:
        fail("--depths selects runs of the depth sweep; pass it with --depth-sweep")
    if args.train_arms is not None and not args.depth_sweep:
        fail("--train-arms selects runs of the depth sweep; pass it with --depth-sweep")
    if args.grid_depths is not None and not args.depth_sweep:
        fail("--grid-depths adds LR grids to the depth sweep; pass it with --depth-sweep")
    C.set_device(args.device)
    if args.scale_sweep:
        import _scale  # issue 13: sizes × arms × seeds and the trend of the gap (benchmarks/_scale.py)

        _scale.check_fixed(args)
        check_args(args)
        return _scale.run(args)
    if args.depth_sweep:
        import _depth  # issue 21: depths × arms × seeds, each arm at its own best LR (benchmarks/_depth.py)
        import _scale

        _scale.check_fixed(args, "--depth-sweep", "benchmarks/_depth.py")
        check_args(args)
        return _depth.run(args)
    return run_lm(args)


def run_lm(args) -> dict:
    """The language-model comparison: plan the runs, train the unfinished ones (resumable), aggregate."""
    check_args(args)
    out = args.out or os.path.join(C.REPO_ROOT, "benchmarks", "results", "compare_quick" if args.quick else "compare")
    os.makedirs(out, exist_ok=True)
    runs, settings = plan_runs(args)
    if args.report_only:
        return report(args, out, settings)
    if len({r.block_size for r in runs}) > 1:
        fail("all runs of one invocation must share --block-size (a sweep setting changes it)")
    C.set_threads(args.threads)
    C.quiet_transformers()
    t0 = time.time()
    try:
        data = C.prepare_data(block_size=runs[0].block_size if runs else 256,
                              cache_dir=os.path.join(out, "cache"), **data_kwargs(args))
        eval_sets, eval_info = {}, {}
        for path in args.eval_file:
            name = eval_file_name(path)
            eval_sets[name], eval_info[name] = C.prepare_eval_file(path, data)
    except ValueError as err:
        fail(str(err))
    overlap = set(data.info["files"]) & {i["path"] for i in eval_info.values()}
    if overlap:
        print(f"[compare] warning: --eval-file {', '.join(sorted(overlap))} is also training data", file=sys.stderr)
    todo = [r for r in runs if C.finished_record(run_path(out, r), r) is None]
    print(f"[compare] {len(runs)} runs planned, {len(runs) - len(todo)} already finished; output {out}",
          file=sys.stderr)
    blimp = C.blimp_dir_for(args)
    for r in runs:
        if r not in todo:
            add_missing_eval_files(run_path(out, r), trainer_dir(out, r), eval_sets, eval_info)
    C.add_missing_blimp([(run_path(out, r), trainer_dir(out, r)) for r in runs if r not in todo], data.tokenizer,
                        blimp, data=data)
    skipped_locked = LM.execute_runs(runs, todo, data, eval_sets, eval_info,
                                    lambda r: (run_path(out, r), trainer_dir(out, r)), blimp)
    if skipped_locked:
        print(f"[compare] {len(skipped_locked)} runs are being done by another worker; run --report-only when "
              "they are finished", file=sys.stderr)
    print(f"[compare] done in {time.time() - t0:.0f} s", file=sys.stderr)
    if args.no_report:
        return {}
    return report(args, out, settings)


if __name__ == "__main__":
    main()
