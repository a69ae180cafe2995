"""The scale sweep's report (``compare.py --scale-sweep``, ``_scale``'s docstring), read only from the finished
records: the paired gaps to default per size, length and rate with their verdicts (:func:`analyse`), the log-linear
trend of the gap and its extrapolation to 472M / 1.72B (:func:`fit_loglinear`), the Markdown and figures;
:func:`collect` / :func:`report` put them together. The depth sweep's report reads its cells the same way
(``_depth_report``)."""

from __future__ import annotations

import json
import math
import os
import statistics

import _common as C
import _lm_zero_shot as ZS
from hf_condinit import stats as V
from _common import fail
from _scale_plan import ScalePlan, _metric, size_name

from hf_condinit.study.plan import choose_rate


# extrapolation targets: non-embedding parameters of the papers' GPT-2 models
TARGETS = {"472M": 472e6, "1.72B": 1.72e9}


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
                blimp=ZS.blimp_accuracy(rec), device=rec.get("device"), batches=rec.get("train_batches_sha256"))
    return cells


def paired_gaps(cell: dict, label: str, key: str = "loss", default: dict | None = None) -> dict:
    """seed -> ``key``(label) − ``key``(default) (``key``: "loss" or "blimp") over the seeds both have with a
    value, on the same device and batches (``hf_condinit.stats.paired``). ``default``: the default runs to pair with
    (seed -> summary; default: the cell's own)."""
    d = cell.get("default", {}) if default is None else default
    a = cell.get(label, {})
    side = lambda runs: {s: dict(r, value=r.get(key)) for s, r in runs.items()}  # noqa: E731
    return V.paired(side(a), side(d))


def table_verdicts(cells: dict, keys: list, arms, key: str = "loss") -> dict:
    """(cell key, arm) -> ``hf_condinit.stats.judge`` record of the paired gaps in ``key`` of every non-default arm of the
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
        lines.append(C.family_caption("this table's Δ loss cells", sizes["loss"])
                     + f" The Δ BLiMP column is its own family of {sizes['blimp']} cells.")
        for k in keys:
            curves = [r["eval_curve"] for r in cells[k].get("default", {}).values()]
            if curves:
                lines.append(f"- {k[0]}, {k[1]:g} tokens per non-embedding parameter: "
                             + C.flat_sentence(V.flat_curve(curves, next(iter(cells[k]["default"].values()))["steps"])))
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
        lines.append(C.family_caption("this table's Δ cells (both columns)",
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
