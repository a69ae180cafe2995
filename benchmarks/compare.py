"""Do conditioned init and the attention variants help? Train the same small GPT-2 per arm and seed, compare.

Arms (``_common.ARMS``, recipes in ``_common.RECIPES``): default, mimetic, conditioned, conditioned+affine_scaled,
affine_scaled, spectral (λ = 10, identity mode), preconditioned, attention_sink. Each arm × seed is one
``run_clm.py``-style run through the HF ``Trainer`` (``_lm_run.train_run``: the library's data helpers,
``CondInitTrainer``, the docs/methods.md §7 LM recipe, ``ConditionNumberCallback``), into a normal Trainer output
folder ``trainer/<setting>/<arm>/seed<k>-<key>/``. Same data order per seed across arms (the Trainer's sampler seeded
with the seed), held-out split = the first 5 % of the documents.

Per arm the report (``_lm_report``) gives: final eval perplexity (full held-out split, and each ``--eval-file``) mean ± std over seeds;
the paired difference to default with its 95 % interval and verdict (``hf_condinit.stats.judge``: better / worse / no, Holm
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
    python benchmarks/compare.py --scale-sweep         # the scale sweep (benchmarks/_scale.py)
    python benchmarks/compare.py --depth-sweep         # the depth sweep (benchmarks/_depth.py)
    python benchmarks/compare.py --task vision         # ViT on CIFAR-10 (benchmarks/_vision.py; --quick, --report-only)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import _lm_report as R  # noqa: E402
import _lm_run as LM  # noqa: E402
import _lm_zero_shot as ZS  # noqa: E402
from _lm_run import GAIN_KEYS, SWEEP_KEYS  # noqa: E402
from _common import fail, steps_for_tokens_per_param  # noqa: E402

from hf_condinit.study.recipes import parse_recipe  # noqa: E402

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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["lm", "vision"], default="lm",
                   help="lm (this mode) or vision: ViT on CIFAR-10, its own flags (benchmarks/_vision.py --help)")
    p.add_argument("--scale-sweep", action="store_true",
                   help="the scale sweep (benchmarks/_scale.py): sizes × arms × seeds, a length and an "
                        "LR sweep at the middle size, the trend of the gap to default; with --quick, --report-only")
    p.add_argument("--depth-sweep", action="store_true",
                   help="the depth sweep (benchmarks/_depth.py): depths 2/4/8 at width 64, each arm at "
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
    p.add_argument("--checkpoint-minutes", type=float, default=LM.CHECKPOINT_EVERY_SECONDS / 60, metavar="M",
                   help="LM runs: save a checkpoint every M minutes of training (the newest kept), so that a kill "
                        "without warning (SIGKILL, out of memory) costs at most M minutes; 0: only on a signal "
                        "(default %(default)g)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="train and evaluate on the CPU (default) or the first GPU; each record says where it ran")
    p.add_argument("--depths", type=int, nargs="+", default=None, metavar="N",
                   help="--depth-sweep: train only the runs of these depths (grid runs included at the grid's "
                        "depth), e.g. to split the sweep between machines; default every depth of the plan")
    p.add_argument("--train-arms", nargs="+", default=None, metavar="ARM",
                   help="--depth-sweep: train only these arms' runs (default's same-rate runs count as default); the "
                        "plan is unchanged: like --depths, to put the runs a headline rests on first or to split the "
                        "sweep between workers")
    p.add_argument("--train-seeds", type=int, nargs="+", default=None, metavar="K",
                   help="--depth-sweep: train only the runs of these seeds (the grids are seed 0); the plan is "
                        "unchanged: like --train-arms, e.g. to do first the seeds whose pairs exist on this device")
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
                    o = over if parse_recipe(C.RECIPES[a]).init == "conditioned" else {
                        k: v for k, v in over.items() if k not in GAIN_KEYS}
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
    return LM.trainer_folder(os.path.join(out, "trainer"), spec)


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


def report(args, out: str, settings: dict) -> dict:
    results, base_recs = R.collect(out)
    results.update(machine=C.machine_info(), argv=sys.argv[1:])  # where the report was made (not in markdown)
    C.write_json(os.path.join(out, "results.json"), results)
    md = R.markdown(results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    written = R.plots(results, out, R.base_groups(base_recs))
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
        import _vision  # ViT on CIFAR-10: its own flags, see benchmarks/_vision.py

        return _vision.main(argv)
    args = parse_args(argv)
    if args.scale_sweep and args.depth_sweep:
        fail("--scale-sweep and --depth-sweep are two modes; pass one of them")
    if args.depths is not None and not args.depth_sweep:
        fail("--depths selects runs of the depth sweep; pass it with --depth-sweep")
    if args.train_arms is not None and not args.depth_sweep:
        fail("--train-arms selects runs of the depth sweep; pass it with --depth-sweep")
    if args.train_seeds is not None and not args.depth_sweep:
        fail("--train-seeds selects runs of the depth sweep; pass it with --depth-sweep")
    if args.grid_depths is not None and not args.depth_sweep:
        fail("--grid-depths adds LR grids to the depth sweep; pass it with --depth-sweep")
    if not args.checkpoint_minutes >= 0:
        fail(f"--checkpoint-minutes must be >= 0 (0: checkpoints only on a signal), got {args.checkpoint_minutes}")
    C.set_device(args.device)
    LM.CHECKPOINT_EVERY_SECONDS = args.checkpoint_minutes * 60
    if args.scale_sweep:
        import _scale  # sizes × arms × seeds and the trend of the gap (benchmarks/_scale.py)

        _scale.check_fixed(args)
        check_args(args)
        return _scale.run(args)
    if args.depth_sweep:
        import _depth  # depths × arms × seeds, each arm at its own best LR (benchmarks/_depth.py)
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
    blimp = ZS.blimp_dir_for(args)
    for r in runs:
        if r not in todo:
            add_missing_eval_files(run_path(out, r), trainer_dir(out, r), eval_sets, eval_info)
    ZS.add_missing_blimp([(run_path(out, r), trainer_dir(out, r)) for r in runs if r not in todo], data.tokenizer,
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
