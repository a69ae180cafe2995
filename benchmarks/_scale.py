"""``benchmarks/compare.py --scale-sweep``: where does an init's loss gap to default go as the model grows and as
training approaches convergence? (issue 13)

Plan (:data:`FULL`; :func:`plan`): GPT-2 of three sizes with the same head dim 32 and depth 2 (2 × 32, 2 × 64,
2 × 96: 25k, 100k, 224k non-embedding parameters), arms :data:`ARMS` (default, conditioned, conditioned with
``v_gain=0.25``, mimetic, affine_scaled), 20 training tokens per non-embedding parameter at a shared learning rate,
seeds 0-1 (0-2 at the middle size; 0-4 at the largest: the third was added for BLiMP, issue 20, the fourth and fifth
for the verdict rule's intervals, issue 28); at the
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

Trend (:func:`fit_loglinear`): per arm, least squares of the paired gap Δ = loss(arm) − loss(default) (same seed,
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

import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import _common as C
import _lm_run as LM
import _verdict as V
from _common import fail

from hf_condinit.study.plan import choose_rate

WIKI_VALID = os.path.join(C.SHARED_DATA, "wikitext", "wikitext-2-raw", "wiki.valid.raw")

# arm label -> (harness arm of _common.ARMS, conditioned-init overrides)
ARMS: dict[str, tuple[str, dict]] = {
    "default": ("default", {}),
    "conditioned": ("conditioned", {}),
    "conditioned_v0.25": ("conditioned", {"v_gain": 0.25}),
    "mimetic": ("mimetic", {}),
    "affine_scaled": ("affine_scaled", {}),
}
# extrapolation targets: non-embedding parameters of the papers' GPT-2 models
TARGETS = {"472M": 472e6, "1.72B": 1.72e9}


@dataclass(frozen=True)
class ScalePlan:
    """What the sweep trains. ``sizes`` = (n_layer, n_embd, n_head), smallest first; ``seeds[i]`` seeds at size i;
    the length sweep (``length_tpps``, ``length_seeds`` seeds) and the LR sweep (``lrs``, ``lr_seeds`` seeds, at
    ``lr_tpp`` tokens per parameter, one of the length sweep's lengths so that its shared-LR runs are reused) are at
    the middle size ``sizes[len(sizes) // 2]``; every other run trains ``main_tpp`` tokens per non-embedding
    parameter at ``shared_lr``."""

    sizes: tuple
    seeds: tuple
    main_tpp: float
    length_tpps: tuple
    length_seeds: int
    lrs: tuple
    shared_lr: float
    lr_seeds: int
    lr_tpp: float
    arms: tuple
    batch_size: int
    block_size: int
    vocab_size: int
    eval_blocks: int  # held-out blocks of the eval curve
    final_eval_blocks: int  # held-out blocks of the final internal evaluation (WikiText-2 valid is evaluated whole)
    max_bytes: int | None = None

    @property
    def middle(self) -> int:
        return len(self.sizes) // 2


FULL = ScalePlan(sizes=((2, 32, 1), (2, 64, 2), (2, 96, 3)), seeds=(2, 3, 5), main_tpp=20.0, length_tpps=(1.0, 5.0),
                 length_seeds=3, lrs=(1e-3, 3e-3, 1e-2), shared_lr=3e-3, lr_seeds=2, lr_tpp=5.0, arms=tuple(ARMS),
                 batch_size=8, block_size=256, vocab_size=4096, eval_blocks=16, final_eval_blocks=64)
QUICK = ScalePlan(sizes=((1, 16, 2), (1, 32, 4), (2, 32, 4)), seeds=(1, 2, 1), main_tpp=0.25, length_tpps=(0.1,),
                  length_seeds=1, lrs=(3e-3, 1e-2), shared_lr=3e-3, lr_seeds=1, lr_tpp=0.1, arms=("default", "conditioned_v0.25"),
                  batch_size=4, block_size=32, vocab_size=512, eval_blocks=4, final_eval_blocks=8, max_bytes=200_000)


def size_name(size) -> str:
    return f"{size[0]}x{size[1]}"


def setting_name(size, tpp: float, lr: float) -> str:
    return f"{size_name(size)}_tpp{tpp:g}_lr{lr:g}"


def make_spec(p, label: str, size, tpp: float, lr: float, seed: int, kappa_at: tuple = ()) -> LM.TrainSpec:
    """One run of a sweep: arm ``label`` of :data:`ARMS`, ``size`` = (n_layer, n_embd, n_head), ``tpp`` training
    tokens per non-embedding parameter at learning rate ``lr``; batch, block and evaluation sizes from the plan
    ``p`` (a :class:`ScalePlan` or the depth sweep's plan); κ(J) at the fractions ``kappa_at`` of the run."""
    arm, over = ARMS[label]
    n_layer, n_embd, n_head = size
    kw = dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, batch_size=p.batch_size, block_size=p.block_size,
              tokens_per_param=tpp)
    steps = C.steps_for_tokens_per_param(kw)
    return LM.TrainSpec(arm=arm, seed=seed, steps=steps, lr=lr, eval_every=max(1, steps // 10),
                       eval_blocks=p.eval_blocks, log_every=max(1, steps // 40), kappa_at=tuple(kappa_at),
                       diag_probe=(2, min(128, p.block_size)), v_gain=over.get("v_gain"),
                       setting=setting_name(size, tpp, lr),
                       extra=dict(label=label, size=size_name(size), final_eval_blocks=p.final_eval_blocks), **kw)


def plan(p: ScalePlan) -> list[LM.TrainSpec]:
    """Every run, in the order of the module docstring (each prefix useful)."""
    runs = []
    for seed in range(max(p.seeds)):
        for i, size in enumerate(p.sizes):
            if seed >= p.seeds[i]:
                continue
            tpps = [p.main_tpp] + (list(p.length_tpps) if i == p.middle and seed < p.length_seeds else [])
            runs += [make_spec(p, a, size, t, p.shared_lr, seed) for t in tpps for a in p.arms]
    runs += [make_spec(p, a, p.sizes[p.middle], p.lr_tpp, lr, seed)
             for seed in range(p.lr_seeds) for lr in p.lrs if lr != p.shared_lr for a in p.arms]
    return runs


def record_paths(out: str, spec: LM.TrainSpec) -> tuple[str, str]:
    label = spec.extra["label"]
    return (os.path.join(out, "runs", spec.setting, label, f"seed{spec.seed}.json"),
            os.path.join(out, "trainer", spec.setting, label, f"seed{spec.seed}"))


def record_of(out: str, spec: LM.TrainSpec) -> dict | None:
    """The finished record of ``spec`` under ``out`` (:func:`_common.finished_record`), or None."""
    return C.finished_record(record_paths(out, spec)[0], spec)


# ---------------------------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------------------------


def measure_cost(size, p: ScalePlan, steps: int = 4) -> dict:
    """CPU time (user + system of this process, at one torch thread) per token of one training step (forward,
    backward, AdamW) and of one forward pass of the ``size`` model, on random tokens of one batch; after one
    warm-up step."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = C.gpt2_config(n_layer=size[0], n_embd=size[1], n_head=size[2], n_positions=p.block_size,
                               vocab_size=p.vocab_size)
        model = C.build_model("default", config, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, p.vocab_size, (p.batch_size, p.block_size), generator=torch.Generator().manual_seed(0))

        def step():
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()

        step()
        t = time.process_time()
        for _ in range(steps):
            step()
        train = (time.process_time() - t) / (steps * x.numel())
        model.eval()
        with torch.no_grad():
            model(input_ids=x, labels=x)
            t = time.process_time()
            for _ in range(steps):
                model(input_ids=x, labels=x)
            evaluate = (time.process_time() - t) / (steps * x.numel())
    finally:
        torch.set_num_threads(threads)
    return dict(train_cpu_us_per_token=train * 1e6, eval_cpu_us_per_token=evaluate * 1e6, steps=steps,
                batch=[p.batch_size, p.block_size], vocab_size=p.vocab_size)


def load_costs(out: str, p, sizes=None) -> dict:
    """``<out>/cost.json`` (size name -> :func:`measure_cost`), measuring the sizes (default ``p.sizes``) it
    lacks."""
    path = os.path.join(out, "cost.json")
    costs = json.load(open(path)) if os.path.exists(path) else {}
    missing = [s for s in (p.sizes if sizes is None else sizes) if size_name(s) not in costs.get("sizes", {})]
    if missing:
        costs.setdefault("sizes", {}).update({size_name(s): measure_cost(s, p) for s in missing})
        costs["machine"] = C.machine_info()
        costs["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        C.write_json(path, costs)
    return costs


def run_cpu_estimate(spec: LM.TrainSpec, cost: dict, eval_tokens: int) -> float:
    """Estimated CPU seconds of one run: training tokens at the training cost; the eval curve, the final internal
    evaluation and the ``eval_tokens`` of the eval files at the forward cost."""
    block = spec.block_size
    curve = (spec.steps // spec.eval_every + 2) * spec.eval_blocks * block
    forward = curve + spec.extra["final_eval_blocks"] * block + eval_tokens
    return 1e-6 * (spec.steps * spec.batch_size * block * cost["train_cpu_us_per_token"]
                   + forward * cost["eval_cpu_us_per_token"])


def estimate_lines(runs: list, todo: list, costs: dict, eval_tokens: int, out: str) -> list[str]:
    """What the start of a sweep prints: measured cost per size, CPU estimate per run kind and of the plan."""
    lines = ["[scale] CPU time per token (user + system, one thread, forward + backward + AdamW / forward; "
             "measured once on random tokens, cost.json):"]
    for name, c in costs["sizes"].items():
        lines.append(f"[scale]   {name}: train {c['train_cpu_us_per_token']:.1f} µs, eval "
                     f"{c['eval_cpu_us_per_token']:.1f} µs")
    est = {id(r): run_cpu_estimate(r, costs["sizes"][r.extra["size"]], eval_tokens) for r in runs}
    kinds: dict[str, list] = {}
    for r in runs:
        kinds.setdefault(r.setting, []).append(est[id(r)])
    for setting, xs in kinds.items():
        lines.append(f"[scale]   {setting}: {len(xs)} runs × {xs[0]:.1f} core-s")
    total, left = sum(est.values()), sum(est[id(r)] for r in todo)
    lines.append(f"[scale] plan: {len(runs)} runs, {total / 3600:.2f} core-h ({total / 7200:.2f} h on 2 idle cores, "
                 f"two --threads 1 workers); left: {len(todo)} runs, {left / 3600:.2f} core-h "
                 f"({left / 7200:.2f} h on 2 cores). Trainer overhead not included.")
    done = [(r, json.load(open(record_paths(out, r)[0]))) for r in runs if r not in todo]
    done = [(r, rec) for r, rec in done if "cpu_seconds" in rec]
    if done:
        ratio = sum(rec["cpu_seconds"] for _, rec in done) / sum(est[id(r)] for r, _ in done)
        lines.append(f"[scale] the {len(done)} finished runs took {ratio:.2f} × their estimate in CPU time")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# trend
# ---------------------------------------------------------------------------------------------------------------


def fit_loglinear(x: list[float], y: list[float], at: dict | None = None, level: float = 0.95) -> dict:
    """Least squares ``y = a + b log10(x)`` (every point one observation, e.g. one seed's paired gap).

    Returns ``a``, ``b``, the residual std ``s`` (dof = n − 2), the ``level`` confidence interval of ``b``, and for
    each ``name -> x0`` of ``at`` the fitted mean at x0 with its confidence interval (``se = s sqrt(1/n + (u0 −
    ū)² / Σ(u − ū)²)``, u = log10 x, t quantile with n − 2 dof). With fewer than 2 distinct x values, or no residual
    dof, only what is defined is returned and ``ok`` is False."""
    from scipy import stats

    u = [math.log10(v) for v in x]
    n = len(u)
    out: dict = dict(n=n, distinct_x=len(set(x)), ok=False)
    if n == 0 or len(set(u)) < 2:
        return out
    ub, yb = statistics.fmean(u), statistics.fmean(y)
    sxx = sum((ui - ub) ** 2 for ui in u)
    b = sum((ui - ub) * (yi - yb) for ui, yi in zip(u, y)) / sxx
    a = yb - b * ub
    out.update(a=a, b=b)
    dof = n - 2
    if dof < 1:
        return out
    s = math.sqrt(sum((yi - a - b * ui) ** 2 for ui, yi in zip(u, y)) / dof)
    t = float(stats.t.ppf(0.5 + level / 2, dof))
    se_b = s / math.sqrt(sxx)
    out.update(ok=True, s=s, dof=dof, level=level, t=t, se_b=se_b, b_ci=[b - t * se_b, b + t * se_b],
               x_range=[min(x), max(x)], u_mean=ub, sxx=sxx, predictions={})
    for name, x0 in (at or {}).items():
        mean, lo, hi = fitted_mean_interval(out, x0)
        out["predictions"][name] = dict(x=x0, mean=mean, ci=[lo, hi], extrapolated=not (min(x) <= x0 <= max(x)))
    return out


def fitted_mean_interval(fit: dict, x0: float) -> tuple[float, float, float]:
    """(mean, lower, upper): the fitted mean of a :func:`fit_loglinear` at ``x0`` and its confidence interval."""
    u0 = math.log10(x0)
    mean = fit["a"] + fit["b"] * u0
    se = fit["s"] * math.sqrt(1 / fit["n"] + (u0 - fit["u_mean"]) ** 2 / fit["sxx"])
    return mean, mean - fit["t"] * se, mean + fit["t"] * se


def trend_verdict(fit: dict, what: str) -> str:
    """One plain sentence on what a :func:`fit_loglinear` of the gap says."""
    if not fit.get("ok"):
        return (f"{what}: not enough points for a trend ({fit['n']} gaps at {fit['distinct_x']} distinct values; "
                "at least 3 points at 2 values needed)")
    lo, hi = fit["b_ci"]
    slope = (f"slope {fit['b']:+.3f} loss per decade [{lo:+.3f}, {hi:+.3f}]"
             + (" (includes 0: no detectable trend)" if lo <= 0 <= hi else ""))
    return f"{what}: {slope}"


def extrapolation_verdict(fit: dict, n_sizes: int) -> str:
    if not fit.get("ok") or n_sizes < 3:
        return (f"uninformative: {n_sizes} model size(s) finished; an extrapolation needs at least 3 sizes "
                "(and 2 seeds) to say anything")
    parts = []
    for name, pr in fit["predictions"].items():
        lo, hi = pr["ci"]
        parts.append(f"{name}: {pr['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    spans = [pr["ci"][0] <= 0 <= pr["ci"][1] for pr in fit["predictions"].values()]
    tail = ("the intervals include 0: the CPU-scale trend does not tell whether the gap persists, closes or flips "
            "at these sizes" if any(spans) else "the intervals exclude 0 (under the log-linear assumption)")
    return "extrapolated gap " + "; ".join(parts) + f" — {tail}"


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def _metric(rec: dict, eval_name: str | None) -> float:
    if eval_name and eval_name in rec.get("eval_files", {}):
        return rec["eval_files"][eval_name]["loss"]
    return rec["final_eval_loss"]


def load_cells(out: str, eval_name: str | None) -> dict:
    """(size name, tokens per param, lr) -> label -> seed -> record summary (metric loss, ppl, params, epochs)."""
    cells: dict = {}
    for root, _, files in os.walk(os.path.join(out, "runs")):
        for fn in sorted(files):
            if not fn.endswith(".json"):
                continue
            with open(os.path.join(root, fn)) as f:
                rec = json.load(f)
            spec = rec["spec"]
            loss = _metric(rec, eval_name)
            cell = cells.setdefault((spec["extra"]["size"], spec["tokens_per_param"], spec["lr"]), {})
            cell.setdefault(spec["extra"]["label"], {})[rec["seed"]] = dict(
                loss=loss, ppl=math.exp(loss) if loss < 700 else float("inf"), n=rec["n_params_non_embedding"],
                n_all=rec["n_params"], tokens_seen=rec["tokens_seen"], eval_curve=rec["eval_curve"],
                epochs=rec["epochs"], cpu_seconds=rec.get("cpu_seconds"), steps=spec["steps"],
                blimp=C.blimp_accuracy(rec), device=rec.get("device"), batches=rec.get("train_batches_sha256"))
    return cells


def paired_gaps(cell: dict, label: str, key: str = "loss", default: dict | None = None) -> dict:
    """seed -> ``key``(label) − ``key``(default) (``key``: "loss" or "blimp") over the seeds both have with a
    value, on the same device and batches (``_verdict.paired``). ``default``: the default runs to pair with
    (seed -> summary; default: the cell's own)."""
    d = cell.get("default", {}) if default is None else default
    a = cell.get(label, {})
    side = lambda runs: {s: dict(r, value=r.get(key)) for s, r in runs.items()}  # noqa: E731
    return V.paired(side(a), side(d))


def table_verdicts(cells: dict, keys: list, arms, key: str = "loss") -> dict:
    """(cell key, arm) -> ``_verdict.judge`` record of the paired gaps in ``key`` of every non-default arm of the
    cells ``keys``: one table column, one Holm family."""
    return V.judge({(k, a): paired_gaps(cells[k], a, key) for k in keys for a in arms
                    if a != "default" and a in cells[k]}, higher_is_better=key == "blimp")


def _device_word(device: str | None) -> str:
    """A record's device for a table: "CPU", the GPU's name, or "?" for a record without one."""
    if not device:
        return "?"
    return "CPU" if device == "cpu" else device.replace("cuda: NVIDIA ", "")


def _f(x, nd=3, sign=False):
    if x is None:
        return "–"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def lr_sweep(lr_cells: dict, arms) -> dict:
    """The LR sweep's best rate per arm: ``lr_cells`` = lr -> label -> seed -> summary (:func:`load_cells`). Per arm
    with runs: ``means`` (lr -> mean loss over ``seeds``, the seeds every rate of the arm has: the shared rate has
    more), and :func:`hf_condinit.study.plan.choose_rate` of them (the rates run so far, a fixed grid: ``best``,
    ``at_edge``). An arm whose every rate diverged has no best and is left out."""
    out = {}
    for a in arms:
        runs = [c[a] for c in lr_cells.values() if c.get(a)]
        common = set.intersection(*(set(r) for r in runs)) if runs else set()
        means = {lr: statistics.fmean(c[a][s]["loss"] for s in common) for lr, c in lr_cells.items()
                 if c.get(a) and common}
        grid = choose_rate(means, means.get)
        if grid["best"] is not None:
            out[a] = dict(means=means, seeds=sorted(common), best=grid["best"], at_edge=grid["at_edge"])
    return out


def analyse(cells: dict, p: ScalePlan) -> dict:
    """The size trend, the length trend and the LR comparison of the finished runs."""
    mid = size_name(p.sizes[p.middle])
    arms = [a for a in p.arms if a != "default"]
    res: dict = dict(size_trend={}, length_trend={}, lr={})
    size_cells = {k: v for k, v in cells.items() if k[1] == p.main_tpp and k[2] == p.shared_lr}
    n_sizes = len({k[0] for k, v in size_cells.items() if "default" in v})
    for a in arms:
        pts = [(next(iter(c["default"].values()))["n"], g) for k, c in size_cells.items()
               for g in paired_gaps(c, a).values()]
        fit = fit_loglinear([x for x, _ in pts], [y for _, y in pts], TARGETS)
        # the same fit on the per-size mean gaps: n_sizes − 2 dof, so a curvature across sizes widens the interval
        # instead of hiding in the seed-level residuals (the conservative interval)
        by_size: dict = {}
        for x, y in pts:
            by_size.setdefault(x, []).append(y)
        fit_means = fit_loglinear(list(by_size), [statistics.fmean(v) for v in by_size.values()], TARGETS)
        res["size_trend"][a] = dict(fit=fit, fit_size_means=fit_means,
                                    verdict=trend_verdict(fit, "gap vs parameters"),
                                    extrapolation=extrapolation_verdict(fit, n_sizes),
                                    extrapolation_size_means=extrapolation_verdict(fit_means, n_sizes))
        lpts = [(k[1], g) for k, c in cells.items() if k[0] == mid and k[2] == p.shared_lr
                for g in paired_gaps(c, a).values()]
        lfit = fit_loglinear([x for x, _ in lpts], [y for _, y in lpts])
        res["length_trend"][a] = dict(fit=lfit, verdict=trend_verdict(lfit, "gap vs tokens per parameter"))
    lr_cells = {k[2]: v for k, v in cells.items() if k[0] == mid and k[1] == p.lr_tpp}
    best = {}
    for a, g in lr_sweep(lr_cells, p.arms).items():
        best[a] = g["best"]
        res["lr"][a] = dict(mean_loss_by_lr={f"{k:g}": v for k, v in sorted(g["means"].items())}, best_lr=best[a],
                            best_at_grid_edge=g["at_edge"] and len(g["means"]) == len(p.lrs), mean_seeds=g["seeds"])
    for a in arms:
        if a in best and "default" in best:
            own = paired_gaps(lr_cells[best[a]], a, default=lr_cells[best["default"]].get("default", {}))
            shared = paired_gaps(lr_cells.get(p.shared_lr, {}), a)
            res["lr"][a].update(gap_at_own_best_lr=V.mean_std(own.values()),
                                gap_at_shared_lr=V.mean_std(shared.values()), gaps_at_own_best_lr=own,
                                gaps_at_shared_lr=shared)
    res["n_sizes"] = n_sizes
    return res


def markdown(cells: dict, res: dict, p: ScalePlan, eval_name: str | None) -> str:
    metric = f"`{eval_name}`" if eval_name else "the internal held-out split"
    lines = [f"Metric: loss / perplexity on {metric} at the end of each run; Δ = loss(arm) − loss(default), paired "
             "by seed (same batches), mean ± std over seeds.\n"]
    mid = size_name(p.sizes[p.middle])

    def table(title, keys):
        lines.append(title + "\n")
        lines.append("| size | params (non-emb.) | tokens/param, all (non-emb.) | lr | epochs | device | arm | seeds "
                     "| ppl per seed | ppl mean ± std | Δ loss: mean [95 % CI] verdict | BLiMP % per seed "
                     "| Δ BLiMP pts: mean [95 % CI] verdict |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        verdicts = {key: table_verdicts(cells, keys, p.arms, key) for key in ("loss", "blimp")}
        for k in keys:
            c = cells[k]
            for a in [x for x in p.arms if x in c]:
                runs = c[a]
                ppl_m, ppl_s = V.mean_std(r["ppl"] for r in runs.values())
                r0 = next(iter(runs.values()))
                devices = ", ".join(sorted({_device_word(r.get("device")) for r in runs.values()}))
                lines.append(f"| {k[0]} | {r0['n_all']:,} ({r0['n']:,}) | {r0['tokens_seen'] / r0['n_all']:.2f} "
                             f"({k[1]:g}) | {k[2]:g} | {r0['epochs']:.2f} | {devices} | {a} | {len(runs)} | "
                             f"{' / '.join(format(r['ppl'], '.2f') for r in runs.values())} | "
                             f"{_f(ppl_m, 2)} ± {_f(ppl_s, 2)} | "
                             + ("–" if a == "default" else V.fmt(verdicts["loss"].get((k, a)))) + " | "
                             + " / ".join(_f(None if r.get("blimp") is None else 100 * r["blimp"], 2)
                                          for r in runs.values()) + " | "
                             + ("–" if a == "default" else V.fmt(verdicts["blimp"].get((k, a)), 2, 100)) + " |")
        lines.append("")
        sizes = {key: len([v for v in verdicts[key].values() if v["n"] >= 2]) for key in verdicts}
        lines.append(V.family_caption("this table's Δ loss cells", sizes["loss"])
                     + f" The Δ BLiMP column is its own family of {sizes['blimp']} cells.")
        for k in keys:
            curves = [r["eval_curve"] for r in cells[k].get("default", {}).values()]
            if curves:
                lines.append(f"- {k[0]}, {k[1]:g} tokens per non-embedding parameter: "
                             + V.flat_sentence(V.flat_curve(curves, next(iter(cells[k]["default"].values()))["steps"])))
        lines.append("")

    order = {size_name(s): i for i, s in enumerate(p.sizes)}
    main = sorted((k for k in cells if k[1] == p.main_tpp and k[2] == p.shared_lr), key=lambda k: order.get(k[0], 99))
    table(f"Across size ({p.main_tpp:g} tokens per non-embedding parameter, lr {p.shared_lr:g}):", main)
    length = sorted((k for k in cells if k[0] == mid and k[2] == p.shared_lr), key=lambda k: k[1])
    if len(length) > 1:
        table(f"Across training length (size {mid}, lr {p.shared_lr:g}):", length)
    if res["lr"]:
        lrs = sorted({float(x) for r in res["lr"].values() for x in r["mean_loss_by_lr"]})
        mseeds = sorted({s for r in res["lr"].values() for s in r["mean_seeds"]})
        verdicts = V.judge({(a, w): r[f"gaps_at_{w}"] for a, r in res["lr"].items() if a != "default"
                            for w in ("shared_lr", "own_best_lr")})
        lines.append(f"Learning rate (size {mid}, {p.lr_tpp:g} tokens per non-embedding parameter; loss columns: mean "
                     f"over seeds {', '.join(map(str, mseeds))} (the seeds every rate has); Δ columns: paired by "
                     "seed over every seed both sides have, n given; Δ at own best LR = arm at its best LR − "
                     "default at its best LR):\n")
        lines.append("| arm | " + " | ".join(f"loss lr {x:g}" for x in lrs) + " | best lr | Δ at shared lr (n) | "
                     "Δ at own best lr (n) |")
        lines.append("|---|" + "---|" * (len(lrs) + 3))
        for a, r in res["lr"].items():
            vals = [r["mean_loss_by_lr"].get(f"{x:g}") for x in lrs]
            edge = " (grid edge)" if r["best_at_grid_edge"] else ""
            cells_txt = " – | – |" if a == "default" else " | ".join(
                f"{V.fmt(verdicts[(a, w)])} ({verdicts[(a, w)]['n']})" for w in ("shared_lr", "own_best_lr")) + " |"
            lines.append(f"| {a} | " + " | ".join(_f(v) for v in vals) + f" | {r['best_lr']:g}{edge} |"
                         + ("" if a == "default" else " ") + cells_txt)
        lines.append("")
        lines.append(V.family_caption("this table's Δ cells (both columns)",
                                      len([v for v in verdicts.values() if v["n"] >= 2])))
        lines.append("")
    lines.append("Trend of the gap (least squares on log10, each seed one point; 95 % intervals; extrapolation "
                 "to 472M / 1.72B non-embedding parameters **from CPU-scale runs**, far outside the measured "
                 "range, assuming the gap stays linear in log10 parameters; *conservative*: the same fit on the "
                 "per-size mean gaps, with n_sizes − 2 degrees of freedom):\n")
    for a in res["size_trend"]:
        lines.append(f"- **{a}**: {res['size_trend'][a]['verdict']}; {res['length_trend'][a]['verdict']}; "
                     f"{res['size_trend'][a]['extrapolation']}; conservative: "
                     f"{res['size_trend'][a]['extrapolation_size_means']}.")
    lines.append("")
    return "\n".join(lines) + "\n"


def plots(cells: dict, res: dict, p: ScalePlan, out: str) -> list[str]:
    """``gap_vs_params.png`` (mean ± std of the paired gap per size, the fit, its 95 % band extended to 1.72B:
    extrapolation) and ``gap_vs_tokens.png`` (the same against tokens per parameter at the middle size)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mid = size_name(p.sizes[p.middle])
    written = []
    for name, key, select, xlabel, title, extend in (
            ("gap_vs_params.png", "size_trend", lambda k: k[1] == p.main_tpp and k[2] == p.shared_lr,
             "non-embedding parameters",
             f"gap to default vs size ({p.main_tpp:g} tokens/param); dashed: EXTRAPOLATION from CPU-scale runs",
             max(TARGETS.values())),
            ("gap_vs_tokens.png", "length_trend", lambda k: k[0] == mid and k[2] == p.shared_lr,
             "tokens per non-embedding parameter", f"gap to default vs training length (size {mid})", None)):
        fig = Figure(figsize=(7.5, 4.6), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        drawn = False
        for i, a in enumerate(x for x in p.arms if x != "default"):
            pts = []
            for k, c in cells.items():
                g = list(paired_gaps(c, a).values())
                if select(k) and g:
                    x = next(iter(c["default"].values()))["n"] if key == "size_trend" else k[1]
                    pts.append((x, *V.mean_std(g)))
            if not pts:
                continue
            pts.sort()
            drawn = True
            color = f"C{i}"
            ax.errorbar([q[0] for q in pts], [q[1] for q in pts], yerr=[q[2] for q in pts], fmt="o", color=color,
                        capsize=3, label=a)
            fit = res[key][a]["fit"]
            if "b" in fit:
                lo_x = min(q[0] for q in pts)
                hi_x = max(q[0] for q in pts)
                xs = [lo_x * (hi_x / lo_x) ** (j / 20) for j in range(21)]
                ax.plot(xs, [fit["a"] + fit["b"] * math.log10(v) for v in xs], color=color, lw=1.2)
                if extend and fit.get("ok"):
                    ex = [hi_x * (extend / hi_x) ** (j / 30) for j in range(31)]
                    ext = [fitted_mean_interval(fit, v) for v in ex]
                    ax.plot(ex, [m for m, _, _ in ext], "--", color=color, lw=1.0)
                    ax.fill_between(ex, [lo for _, lo, _ in ext], [hi for _, _, hi in ext], color=color, alpha=0.12)
        if extend:
            for tname, tx in TARGETS.items():
                ax.axvline(tx, color="grey", lw=0.8, ls=":")
                ax.text(tx, 0.98, tname, transform=ax.get_xaxis_transform(), ha="right", va="top", fontsize=8)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set(xlabel=xlabel, ylabel="Δ loss vs default (paired; mean ± std over seeds)", title=title)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
        if drawn:
            ax.legend(fontsize=8)
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def collect(out: str, p: ScalePlan, eval_name: str | None) -> tuple[dict, dict, str]:
    """Read only: ``(cells, results, markdown)`` of the finished records under ``out``/runs (``results`` is what
    ``results.json`` holds)."""
    cells = load_cells(out, eval_name)
    if not cells:
        fail(f"no finished runs under {os.path.join(out, 'runs')}; run without --report-only first")
    if eval_name is None:  # --report-only without --eval-file: the file the runs were evaluated on
        names = sorted({n for root, _, fs in os.walk(os.path.join(out, "runs")) for fn in fs if fn.endswith(".json")
                        for n in json.load(open(os.path.join(root, fn))).get("eval_files", {})})
        if names:
            eval_name = names[0]
            cells = load_cells(out, eval_name)
    res = analyse(cells, p)
    n_runs = sum(len(s) for c in cells.values() for s in c.values())
    cpu = sum(r["cpu_seconds"] or 0 for c in cells.values() for s in c.values() for r in s.values())
    results = dict(metric=eval_name or "internal held-out split", n_runs=n_runs, cpu_seconds=cpu,
                   plan=dict(sizes=p.sizes, seeds=p.seeds, main_tpp=p.main_tpp, length_tpps=p.length_tpps, lr_tpp=p.lr_tpp,
                             lrs=p.lrs, shared_lr=p.shared_lr, arms=p.arms),
                   cells=[dict(size=k[0], tokens_per_param=k[1], lr=k[2], arms=v) for k, v in sorted(cells.items())],
                   **res)
    text = (markdown(cells, res, p, eval_name)
            + f"{n_runs} finished runs, {cpu:.0f} core-s ({cpu / 3600:.2f} core-h) of CPU time.\n")
    return cells, results, text


def report(out: str, p: ScalePlan, eval_name: str | None, copy_plots: str | None = None) -> dict:
    cells, results, text = collect(out, p, eval_name)
    C.write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    written = plots(cells, results, p, out)
    if copy_plots:
        import shutil

        os.makedirs(copy_plots, exist_ok=True)
        for path in written:
            shutil.copy(path, os.path.join(copy_plots, "scale_" + os.path.basename(path)))
    results["plots"] = written
    return results


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
    blimp = C.blimp_dir_for(args, "scale")
    data, eval_sets, eval_info = prepare_sweep(args, p, out, eval_files, "--scale-sweep")
    eval_tokens = sum(i["evaluated_tokens"] for i in eval_info.values())
    for line in estimate_lines(runs, todo, load_costs(out, p), eval_tokens, out):
        print(line, file=sys.stderr)
    most = max(r.steps * r.batch_size * r.block_size for r in runs)
    print(f"[scale] training data: {data.info['train_tokens']:,} tokens; the longest run reads "
          f"{most / (data.info['train_blocks'] * p.block_size):.2f} epochs; output {out}", file=sys.stderr)
    C.add_missing_blimp([record_paths(out, r) for r in runs if r not in todo], data.tokenizer, blimp, "scale", data)
    skipped = LM.execute_runs(runs, todo, data, eval_sets, eval_info, lambda r: record_paths(out, r), blimp)
    if skipped:
        print(f"[scale] {len(skipped)} runs are being done by another worker; run --report-only when they are "
              "finished", file=sys.stderr)
    if args.no_report:
        return {}
    return report(out, p, eval_name, args.copy_plots)
