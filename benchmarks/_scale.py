"""``benchmarks/compare.py --scale-sweep``: where does an init's loss gap to default go as the model grows and as
training approaches convergence?

Plan (``_scale_plan``: :data:`_scale_plan.FULL`, :func:`_scale_plan.plan`): GPT-2 of three sizes with the same head dim 32 and depth 2 (2 × 32, 2 × 64,
2 × 96: 25k, 100k, 224k non-embedding parameters), arms :data:`ARMS` (default, conditioned, conditioned with
``v_gain=0.25``, mimetic, affine_scaled), 20 training tokens per non-embedding parameter at a shared learning rate,
seeds 0-1; at the
middle size also 1 and 5 tokens per parameter (the length sweep) and
two more learning rates (the LR sweep, seeds 0-1, at 5 tokens per parameter: it reuses the length sweep's runs at the
shared rate, and costs a quarter of a sweep at 20). The largest size is 2 × 96, not 2 × 128: a 2 × 128 run at 20
tokens per parameter costs ~18 CPU-minutes, and its ten runs did not fit the 4-hour budget next to the rest. Training data: the enwiki extract + WikiText-2 train (so that no
run repeats a block; enwiki first: the internal 5 % held-out documents are enwiki articles); the reported metric is
the loss on WikiText-2 valid (``--eval-file``, every document). Every run is one ``_lm_run.train_run`` (the
``run_clm.py`` recipe through the HF ``Trainer``).

Order: seed 0 of every size (smallest first, the length sweep after the middle size), then seed 1, then seed 2 of
the middle size, then the LR sweep; default first in each group. Any prefix of the plan is a usable result: seed 0
alone gives a first size trend. Resumable like the other modes (one JSON record per finished run under
``<out>/runs/``, written when the run ends; finished runs are skipped; several workers may share ``--out``).
``<out>`` (default ``benchmarks/results/scale``) is meant to be committed: it holds the records, ``cost.json``,
``results.{json,md}`` and the plots; the Trainer folders (``trainer/``, model weights) and the data cache
(``cache/``) are listed in ``<out>/.gitignore``.

Cost: before training, the CPU time (user + system) per token of a forward + backward + AdamW step and of a
forward pass is measured once per size on random tokens at one thread (``cost.json``; reused later) and the plan's
total is printed as core-hours and hours on 2 idle cores with two ``--threads 1`` workers. CPU time, not wall time,
because the machine may be shared; the estimate leaves out the Trainer's own overhead (the report compares it with
the ``cpu_seconds`` of the finished runs).

Trend (``_scale_report``, :func:`_scale_report.fit_loglinear`): per arm, least squares of the paired gap Δ = loss(arm) − loss(default) (same seed,
WikiText-2 valid) on log10(non-embedding parameters) at the main length, and on log10(tokens per parameter) at the
middle size; each seed is one point; the plots show the mean ± std over seeds. The size fit is extrapolated to
472M and 1.72B non-embedding parameters with the 95 % confidence interval of the fitted mean (t distribution,
leverage of the far point included): an extrapolation from CPU-scale runs over more than three orders of magnitude,
labelled so. When fewer than three sizes are finished, or the interval contains 0, the report says the trend does
not tell.

    python benchmarks/compare.py --scale-sweep --threads 1                  # full mode (two workers: README)
    python benchmarks/compare.py --scale-sweep --quick --out /tmp/scale_q   # tiny sizes, a few steps
    python benchmarks/compare.py --scale-sweep --report-only                # tables / plots from finished runs
"""

from __future__ import annotations

import os
import sys

import _common as C
import _lm_run as LM
import _lm_zero_shot as ZS
from _common import fail
from _scale_plan import FULL, QUICK, estimate_lines, load_costs, plan, record_of, record_paths
from _scale_report import report

WIKI_VALID = os.path.join(C.SHARED_DATA, "wikitext", "wikitext-2-raw", "wiki.valid.raw")


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------

_FIXED = ("arms", "seeds", "steps", "tokens_per_param", "lr", "batch_size", "n_layer", "n_embd", "n_head",
          "block_size", "vocab_size", "sweep", "eval_every", "eval_blocks", "kappa_at", "kappa_probe")
GITIGNORE = "# written by compare.py --scale-sweep: only the records, cost, results and plots are kept\n" \
            "trainer/\ncache/\n*.lock\n*.tmp*\n"


def check_fixed(args, mode: str = "--scale-sweep", module: str = "benchmarks/_scale.py") -> None:
    """The flags that the sweep's plan fixes: a user error (exit 2) when given."""
    for name in _FIXED:
        if getattr(args, name) is not None:
            fail(f"{mode} fixes sizes, lengths, learning rates, arms and seeds ({module} FULL / "
                 f"QUICK); drop --{name.replace('_', '-')}")


def prepare_sweep(args, p, out: str, eval_files: list[str], mode: str):
    """What every sweep does before planning: the output folder with its ``.gitignore`` (records kept, caches not),
    threads, quiet logging, the tokenised training data and each held-out file. Returns ``(data, eval_sets,
    eval_info)``, the last two keyed by file name; a data error exits 2."""
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(out, ".gitignore")):
        with open(os.path.join(out, ".gitignore"), "w") as f:
            f.write(GITIGNORE.replace("--scale-sweep", mode))
    C.set_threads(args.threads)
    C.quiet_transformers()
    try:
        data = C.prepare_data(C.resolve_data_paths(args.data), vocab_size=p.vocab_size, block_size=p.block_size,
                              max_bytes=args.max_bytes or p.max_bytes, cache_dir=os.path.join(out, "cache"))
        eval_sets, eval_info = {}, {}
        for path in eval_files:
            name = os.path.basename(os.path.normpath(path))
            eval_sets[name], eval_info[name] = C.prepare_eval_file(path, data)
    except ValueError as err:
        fail(str(err))
    return data, eval_sets, eval_info


def run(args) -> dict:
    """``compare.py --scale-sweep`` (after :func:`check_fixed` and compare.py's checks): plan, estimate, train the
    unfinished runs (resumable), report."""
    p = QUICK if args.quick else FULL
    out = args.out or os.path.join(C.REPO_ROOT, "benchmarks", "results", "scale_quick" if args.quick else "scale")
    eval_files = args.eval_file or [WIKI_VALID]
    eval_name = os.path.basename(os.path.normpath(eval_files[0]))
    if args.report_only:
        return report(out, p, eval_name if args.eval_file else None, args.copy_plots)
    runs = plan(p)
    todo = [r for r in runs if record_of(out, r) is None]
    blimp = ZS.blimp_dir_for(args, "scale")
    data, eval_sets, eval_info = prepare_sweep(args, p, out, eval_files, "--scale-sweep")
    eval_tokens = sum(i["evaluated_tokens"] for i in eval_info.values())
    for line in estimate_lines(runs, todo, load_costs(out, p), eval_tokens, out):
        print(line, file=sys.stderr)
    most = max(r.steps * r.batch_size * r.block_size for r in runs)
    print(f"[scale] training data: {data.info['train_tokens']:,} tokens; the longest run reads "
          f"{most / (data.info['train_blocks'] * p.block_size):.2f} epochs; output {out}", file=sys.stderr)
    ZS.add_missing_blimp([record_paths(out, r) for r in runs if r not in todo], data.tokenizer, blimp, "scale", data)
    skipped = LM.execute_runs(runs, todo, data, eval_sets, eval_info, lambda r: record_paths(out, r), blimp)
    if skipped:
        print(f"[scale] {len(skipped)} runs are being done by another worker; run --report-only when they are "
              "finished", file=sys.stderr)
    if args.no_report:
        return {}
    return report(out, p, eval_name, args.copy_plots)
