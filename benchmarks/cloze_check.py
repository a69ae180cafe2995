"""Can the zero-shot metrics tell a trained model from its random init?

Trains the default mode's default arm once on the CPU (``compare.py``'s base spec: 4 × 256 GPT-2, 150 steps of
8 × 256 tokens of the TinyStories sample, lr 1e-3, seed 0; κ off; shape, length and rate can be changed) through
the harness (``_lm_run.train_run``, which records BLiMP and the held-out cloze as every harness run does), scores the
same seed's random init (the model before training) the same way, and writes ``cloze_check.json`` and
``cloze_check.md`` into ``--out``:

- per model: held-out perplexity, BLiMP overall and per field with Wilson 95 % intervals and where each stands
  against chance (0.5), how many of the 67 paradigms' intervals exclude chance, and the cloze (k = 4, chance 0.25;
  ``hf_condinit.evaluation.cloze``) with its interval;
- for every committed LM record of ``benchmarks/results/{compare,scale,depth}`` that has BLiMP: its intervals rebuilt
  from the recorded accuracies (``minimal_pairs.summarize_recorded``), counted by where they stand against chance.
  The committed records keep no weights (``.gitignore`` there), so their cloze cannot be scored afterwards; new runs
  record it.

    python benchmarks/cloze_check.py --threads 2                     # the default mode's 4 × 256 model
    python benchmarks/cloze_check.py --threads 2 --n-layer 2 --n-embd 128 --n-head 2 --block-size 128 --lr 3e-3
                                                                     # the committed record: 11 min on a busy CPU
    python benchmarks/cloze_check.py --steps 10 --out /tmp/cloze_smoke   # a smoke run

The Trainer folder and the data cache go to ``--out``/work (not committed).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import _lm_run as LM  # noqa: E402
import _lm_zero_shot as ZS  # noqa: E402

OUT = os.path.join(C.REPO_ROOT, "benchmarks", "results", "cloze_check")
RECORD_SWEEPS = ("compare", "scale", "depth")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the default mode's, 150)")
    for name in ("n-layer", "n-embd", "n-head", "block-size"):
        p.add_argument(f"--{name}", type=int, default=None, help="model / data shape (default: the default mode's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the default mode's, 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--blimp-dir", default=C.BLIMP_DIR, help="BLiMP *.jsonl folder (default ../shared/data/blimp)")
    p.add_argument("--out", default=OUT, help="output folder (default benchmarks/results/cloze_check)")
    args = p.parse_args(argv)
    for name in ("steps", "n_layer", "n_embd", "n_head", "block_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            C.fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not glob.glob(os.path.join(args.blimp_dir, "*.jsonl")):
        C.fail(f"--blimp-dir {args.blimp_dir}: no *.jsonl files (BLiMP minimal pairs, e.g. ../shared/data/blimp)")
    if not all(os.path.isfile(f) for f in C.DATASETS["tinystories"]):
        C.fail(f"no TinyStories sample at {C.DATASETS['tinystories'][0]} (../shared/data)")
    return args


def default_mode_spec(args) -> "LM.TrainSpec":
    """compare.py's base spec for the default arm (its defaults), κ off, ``--steps`` / ``--seed`` applied."""
    import compare

    kw = compare.base_spec_kwargs(compare.parse_args([]))
    kw.update(kappa_at=())
    for name in ("steps", "n_layer", "n_embd", "n_head", "block_size", "lr"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    return LM.TrainSpec(arm="default", seed=args.seed, setting="cloze_check", **kw)


def _zero_shot(blimp: dict, cloze: dict) -> dict:
    """The summary a report needs of one model's BLiMP and cloze results."""
    off = {w: sorted(p for p, s in blimp["blimp_paradigm_stats"].items() if s["vs_chance"] == w)
           for w in ("above", "below")}
    return dict(blimp=dict(accuracy=blimp["blimp_accuracy"], ci95=blimp["blimp_ci95"],
                           vs_chance=blimp["blimp_vs_chance"], n=blimp["blimp_n_pairs"],
                           fields={g: {k: s[k] for k in ("accuracy", "ci95", "vs_chance", "n")}
                                   for g, s in blimp["blimp_field_stats"].items()},
                           paradigms_off_chance=off, n_paradigms=len(blimp["blimp_paradigm_stats"])),
                cloze={k[len("cloze_"):]: v for k, v in cloze.items()})


def score_models(args) -> dict:
    """Train the default-mode default arm and score it and its random init (module docstring)."""
    C.quiet_transformers()
    C.set_threads(args.threads)
    work = os.path.join(args.out, "work")
    spec = default_mode_spec(args)
    data = C.prepare_data(C.DATASETS["tinystories"], vocab_size=4096, block_size=spec.block_size,
                          cache_dir=os.path.join(work, "cache"))
    tok = data.tokenizer
    config = C.gpt2_config(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
                           n_positions=spec.block_size, vocab_size=len(tok), eos_id=tok.eos_token_id)
    t = time.perf_counter()
    init = C.build_model(spec.arm, config, spec.seed)
    init_scores = _zero_shot(ZS.evaluate_blimp(init, tok, args.blimp_dir), ZS.evaluate_cloze(init, data))
    print(f"[cloze_check] random init scored in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    rec = LM.train_run(spec, data, os.path.join(work, "trainer"), None, args.blimp_dir)
    print(f"[cloze_check] trained and scored in {rec['wall_seconds']:.0f} s", file=sys.stderr)
    return dict(
        spec=rec["spec"], data=data.info, device=rec["device"], train_batches_sha256=rec["train_batches_sha256"],
        command="python " + " ".join(sys.argv), machine=C.machine_info(),
        models={
            "random init": dict(eval_loss=rec["initial_eval_loss"], eval_loss_on=f"first {spec.eval_blocks} "
                                "held-out blocks (the eval curve's step 0)", **init_scores),
            f"trained ({spec.steps} steps)": dict(eval_loss=rec["final_eval_loss"], eval_loss_on="whole held-out "
                                                  "split", train_seconds=rec["train_seconds"],
                                                  **_zero_shot(rec["blimp"], rec["cloze"])),
        })


def committed_blimp_intervals(blimp_dir: str) -> dict:
    """Where the committed LM records' BLiMP stands against chance (Wilson 95 %), rebuilt from their accuracies:
    counts of records above / at / below chance overall and per field, and the range of overall accuracies."""
    from hf_condinit.evaluation.minimal_pairs import load_minimal_pairs, summarize_recorded

    pairs = load_minimal_pairs(blimp_dir)
    out = {}
    for sweep in RECORD_SWEEPS:
        counts = {"all": {}}
        accs, off = [], []
        for path in sorted(glob.glob(os.path.join(C.REPO_ROOT, "benchmarks", "results", sweep, "runs", "**",
                                                  "*.json"), recursive=True)):
            with open(path) as f:
                blimp = json.load(f).get("blimp")
            if not blimp:
                continue
            s = summarize_recorded(blimp, pairs)
            accs.append(s["blimp_accuracy"])
            off.append([sum(p["vs_chance"] == w for p in s["blimp_paradigm_stats"].values())
                        for w in ("above", "below")])
            counts["all"][s["blimp_vs_chance"]] = counts["all"].get(s["blimp_vs_chance"], 0) + 1
            for g, fs in s["blimp_field_stats"].items():
                counts.setdefault(g, {})
                counts[g][fs["vs_chance"]] = counts[g].get(fs["vs_chance"], 0) + 1
        if accs:
            out[sweep] = dict(n_records=len(accs), accuracy_range=[min(accs), max(accs)], vs_chance=counts,
                              paradigms_above_chance_range=[min(a for a, _ in off), max(a for a, _ in off)],
                              paradigms_below_chance_range=[min(b for _, b in off), max(b for _, b in off)])
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _cell(acc: float, ci, where: str) -> str:
    return f"{_pct(acc)} [{_pct(ci[0])}, {_pct(ci[1])}] {where}"


def report(result: dict) -> str:
    lines = ["# Zero-shot metrics: trained model vs its random init\n",
             f"Command: `{result['command']}` on {result['device']} ({result['machine'].get('cpu', '?')}, torch "
             f"threads {result['machine']['torch_threads']}). Model: the default arm of compare.py's base spec with the "
             "command's changes "
             f"({result['spec']['n_layer']} × {result['spec']['n_embd']} GPT-2, block {result['spec']['block_size']}, "
             f"{result['spec']['steps']} steps of {result['spec']['batch_size']} blocks, lr {result['spec']['lr']:g}, "
             f"seed {result['spec']['seed']}); "
             f"data: {result['data']['path']} (held-out: its first {result['data']['val_documents']} documents).\n",
             "Accuracy % with its Wilson 95 % interval and where it stands against chance (BLiMP 50 %, cloze 25 %: "
             "the true next word among 4 drawn from the held-out text; `hf_condinit.evaluation.cloze`).\n",
             "| model | eval loss | BLiMP | " + " | ".join(f"BLiMP {g}" for g in
                                                          next(iter(result["models"].values()))["blimp"]["fields"])
             + " | BLiMP paradigms above / below chance | cloze (k = 4) |",
             "|---|---:|---|" + "---|" * len(next(iter(result["models"].values()))["blimp"]["fields"]) + "---:|---|"]
    for name, m in result["models"].items():
        b, c = m["blimp"], m["cloze"]
        lines.append(f"| {name} | {m['eval_loss']:.3f} | {_cell(b['accuracy'], b['ci95'], b['vs_chance'])} | "
                     + " | ".join(_cell(f['accuracy'], f['ci95'], f['vs_chance']) for f in b["fields"].values())
                     + f" | {len(b['paradigms_off_chance']['above'])} / {len(b['paradigms_off_chance']['below'])}"
                     f" of {b['n_paradigms']} | "
                     f"{_cell(c['accuracy'], c['ci95'], c['vs_chance'])} (n = {c['n_items']}) |")
    lines += ["\nParadigm flags are not corrected for 67 tests (a model at chance on every paradigm would show about 3 of "
              "67 off chance); the binomial interval treats items as independent, which BLiMP's template-made pairs "
              "are not.\n",
              "## Committed LM records: BLiMP against chance\n",
              "Rebuilt from each record's per-paradigm accuracies (`minimal_pairs.summarize_recorded`); number of "
              "records whose Wilson 95 % interval is above / at / below 50 %.\n",
              "| records | n | overall accuracy % (range) | overall | morphology | semantics | syntax | "
              "syntax_semantics | paradigms above / below chance per record |", "|---|---:|---|---|---|---|---|---|---|"]
    for sweep, s in result["committed_records"].items():
        fmt = lambda d: " / ".join(f"{d.get(k, 0)}" for k in ("above", "at", "below"))  # noqa: E731
        lines.append(f"| {sweep} | {s['n_records']} | {_pct(s['accuracy_range'][0])}-{_pct(s['accuracy_range'][1])}"
                     f" | {fmt(s['vs_chance']['all'])} | "
                     + " | ".join(fmt(s["vs_chance"].get(g, {})) for g in ("morphology", "semantics", "syntax",
                                                                          "syntax_semantics"))
                     + " | {}-{} / {}-{} |".format(*s["paradigms_above_chance_range"],
                                                   *s["paradigms_below_chance_range"]))
    lines.append("\n(cells: above / at / below chance)\n")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = score_models(args)
    C.write_json(os.path.join(args.out, "cloze_check.json"), result)  # kept should the rest fail
    result["committed_records"] = committed_blimp_intervals(args.blimp_dir)
    C.write_json(os.path.join(args.out, "cloze_check.json"), result)
    text = report(result)
    with open(os.path.join(args.out, "cloze_check.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, ".gitignore"), "w") as f:
        f.write("# the Trainer folder and the data cache\nwork/\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
