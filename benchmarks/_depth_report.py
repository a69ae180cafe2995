"""The depth sweep's report (``compare.py --depth-sweep``, ``_depth``'s docstring), read only from the finished
records: per depth and arm at its own rate the paired gaps to default with their verdicts, BLiMP, steps to default's
final loss and κ(J) per layer (:func:`analyse`), the learning-rate grids, the same-rate and shared-rate checks, the
Markdown (:func:`markdown`) and figures (:func:`plots`); :func:`collect` / :func:`report` put them together."""

from __future__ import annotations

import json
import math
import os
import statistics

import _common as C
import _lm_zero_shot as ZS
import _scale_plan as SP
import _scale_report as SR
from hf_condinit import stats as V
from _common import fail
from _depth_plan import DepthPlan, best_rates, grid_state, own_grid_states, plan, record_metric


def _kappa_layers(rec: dict, which: str) -> list | None:
    """Causal κ(J) per layer (mean over heads) at init (``which="init"``) or at the end of a record's run."""
    ks = rec.get("kappa") or []
    if not ks:
        return None
    m = ks[0] if which == "init" else ks[-1]
    if which == "end" and m["step"] != rec["spec"]["steps"]:
        return None
    return [la["mean"] for la in m["layers"]]


def load_runs(out: str, eval_name: str | None) -> dict:
    """(n_layer, tokens per param, lr) -> label -> seed -> summary of a finished record: ``loss`` (compared),
    ``ppl``, ``blimp`` (0-1 or None), ``kappa_init`` / ``kappa_end`` (causal, per layer), ``eval_curve``,
    ``steps``."""
    runs: dict = {}
    for root, _, files in os.walk(os.path.join(out, "runs")):
        for fn in sorted(files):
            if not fn.endswith(".json"):
                continue
            with open(os.path.join(root, fn)) as f:
                rec = json.load(f)
            spec = rec["spec"]
            loss = record_metric(rec, eval_name)
            runs.setdefault((spec["n_layer"], spec["tokens_per_param"], spec["lr"]), {}).setdefault(
                spec["extra"]["label"], {})[rec["seed"]] = dict(
                loss=loss, ppl=math.exp(loss) if loss < 700 else math.inf, blimp=ZS.blimp_accuracy(rec),
                kappa_init=_kappa_layers(rec, "init"), kappa_end=_kappa_layers(rec, "end"),
                eval_curve=rec["eval_curve"], steps=spec["steps"], n=rec["n_params_non_embedding"],
                n_all=rec["n_params"], tokens_seen=rec["tokens_seen"], cpu_seconds=rec.get("cpu_seconds"),
                device=rec.get("device"), batches=rec.get("train_batches_sha256"), source=out)
    return runs


def add_shared_seeds(runs: dict, shared: dict) -> int:
    """Complete this sweep's cells with the scale sweep's runs of the same shape, length, rate and arm (``shared``:
    :func:`_scale.load_cells` keyed like :func:`load_runs`) for the seeds this sweep lacks — only when every seed
    both have trained on identical batches (``train_batches_sha256``: the same run, recorded twice). Returns the
    number of runs added."""
    added = 0
    for key, cell in runs.items():
        for label, seeds in cell.items():
            other = shared.get(key, {}).get(label, {})
            both = set(seeds) & set(other)
            if not both or any(not seeds[s]["batches"] or seeds[s]["batches"] != other[s]["batches"] for s in both):
                continue
            for s in sorted(set(other) - set(seeds)):
                seeds[s] = other[s]
                added += 1
    return added


def _loss_by_lr(grid: dict) -> dict:
    """"lr" -> loss of a :func:`grid_state` arm's finished grid runs, ascending."""
    return {f"{lr:g}": v for lr, v in grid["values"].items() if v is not None}


def baseline_for(seeds: dict, baselines: list) -> dict:
    """seed -> the default run an arm's run of that seed pairs with: of ``baselines`` (seed -> summary each:
    default's own runs first, then its device-matched runs, ``DepthPlan.matched_baselines``) the first on the arm's
    run's device, else default's own (which ``hf_condinit.stats.paired`` then leaves unpaired when its device differs)."""
    out = {}
    for s, r in seeds.items():
        same = [b[s] for b in baselines if s in b and b[s]["device"] == r["device"]]
        if same or s in baselines[0]:
            out[s] = same[0] if same else baselines[0][s]
    return out


def analyse(runs: dict, p: DepthPlan, state: dict, states: dict | None = None) -> dict:
    """Per depth and arm (at its own best rate): the runs, the paired gaps to default at its own best rate (loss
    and BLiMP), steps to default's final loss, κ per layer; the LR grid; the shared-rate comparisons."""
    best = {a: state[a]["best"] for a in p.arms}
    res: dict = dict(best_lr={a: b for a, b in best.items()}, depths={}, grid={}, shared_rate={},
                     own_grid={d: {a: dict(loss_by_lr=_loss_by_lr(st[a]), best_lr=st[a]["best"],
                                           decided=st[a]["decided"], tried=[f"{x:g}" for x in st[a]["tried"]])
                                   for a in p.arms} for d, st in (states or {}).items()})
    for depth in p.depths:
        rates = best_rates(p, state, states, depth)
        cells = {a: runs.get((depth, p.main_tpp, rates[a]), {}).get(a, {}) for a in p.arms if rates[a] is not None}
        dflt = cells.get("default", {})
        matched = {device: runs.get((depth, p.main_tpp, rates["default"]), {}).get(f"default@{device}", {})
                   for d, device, _ in p.matched_baselines if d == depth and d in (states or {})}
        target = V.mean_std(r["eval_curve"][-1][1] for r in dflt.values())[0] if dflt else None
        row = {}
        for a, seeds in cells.items():
            if not seeds:
                continue
            base = baseline_for(seeds, [dflt, *matched.values()])
            g_loss_d = SR.paired_gaps({a: seeds}, a, "loss", default=base)
            g_blimp_d = SR.paired_gaps({a: seeds}, a, "blimp", default=base)
            g_loss, g_blimp = list(g_loss_d.values()), list(g_blimp_d.values())
            cross = ([C.crossing_step(r["eval_curve"], target) for r in seeds.values()] if target is not None
                     else [])
            reached = [c for c in cross if c is not None]
            k0 = [r["kappa_init"] for r in seeds.values() if r["kappa_init"]]
            k1 = [r["kappa_end"] for r in seeds.values() if r["kappa_end"]]
            row[a] = dict(
                lr=rates[a], seeds=sorted(seeds), ppl={s: r["ppl"] for s, r in sorted(seeds.items())},
                loss={s: r["loss"] for s, r in sorted(seeds.items())},
                blimp={s: r["blimp"] for s, r in sorted(seeds.items())}, steps=next(iter(seeds.values()))["steps"],
                n=next(iter(seeds.values()))["n"], n_all=next(iter(seeds.values()))["n_all"],
                tokens_seen=next(iter(seeds.values()))["tokens_seen"],
                devices=sorted({SR._device_word(r["device"]) for r in seeds.values()}),
                from_scale_sweep=sorted(s for s, r in seeds.items() if r["source"] == p.shared_from),
                gap_loss=g_loss_d, gap_loss_ms=V.mean_std(g_loss), gap_blimp=g_blimp_d,
                gap_blimp_ms=V.mean_std(g_blimp), steps_to_default_final=cross,
                steps_to_default_final_mean=V.mean_std(reached)[0], n_reached=len(reached),
                eval_curves=[r["eval_curve"] for r in seeds.values()],
                kappa_init_layers=[statistics.fmean(x) for x in zip(*k0)] if k0 else None,
                kappa_end_layers=[statistics.fmean(x) for x in zip(*k1)] if k1 else None)
        if row:
            res["depths"][depth] = row
        for device, cell in matched.items():
            res.setdefault("matched_baselines", {})[f"{depth}@{device}"] = dict(
                depth=depth, device=device, lr=rates["default"], loss={s: r["loss"] for s, r in sorted(cell.items())})
    for what in ("loss", "blimp"):  # one Holm family per column of the depth table
        verdicts = V.judge({(d, a): r[f"gap_{what}"] for d, row in res["depths"].items() for a, r in row.items()
                            if a != "default"}, higher_is_better=what == "blimp")
        for (d, a), v in verdicts.items():
            res["depths"][d][a][f"{what}_verdict"] = v
    res["same_rate"] = same_rate_check(runs, p, best)
    for a in p.arms:
        g = state[a]
        res["grid"][a] = dict(loss_by_lr=_loss_by_lr(g),
                              blimp_by_lr={f"{lr:g}": runs.get((p.grid_depth, p.grid_tpp, lr), {}).get(a, {})
                                           .get(0, {}).get("blimp") for lr, v in g["values"].items() if v is not None},
                              best_lr=best[a], decided=g["decided"], tried=[f"{x:g}" for x in g["tried"]],
                              extended=bool(g["extensions"]), at_ladder_end=g["at_edge"])
    # shared rate beside own rate: the grid (depth grid_depth, seed 0, grid_tpp)
    d_own = state["default"]["values"].get(best["default"]) if best["default"] else None
    d_sh = state["default"]["values"].get(p.shared_lr)
    for a in p.arms:
        if a == "default":
            continue
        own, sh = state[a]["values"].get(best[a]) if best[a] else None, state[a]["values"].get(p.shared_lr)
        res["shared_rate"].setdefault(f"{p.grid_depth}x{p.width}, {p.grid_tpp:g} tok/param (grid, seed 0)", {})[a] = dict(
            shared=None if sh is None or d_sh is None else sh - d_sh,
            own=None if own is None or d_own is None else own - d_own)
    return res


def same_rate_check(runs: dict, p: DepthPlan, best: dict) -> dict:
    """At ``rate_check_depth``, per arm whose best rate is not default's: its loss gap to default run at the *arm's*
    rate (paired by seed; verdict: ``hf_condinit.stats.judge``, the table's own family), next to default's own-rate runs
    there."""
    depth = p.rate_check_depth
    if depth is None or best.get("default") is None:
        return {}
    out = {}
    for a in p.arms:
        if a == "default" or best[a] is None or best[a] == best["default"]:
            continue
        cell = runs.get((depth, p.main_tpp, best[a]), {})
        gaps = SR.paired_gaps(cell, a)
        dflt = cell.get("default", {})
        own = runs.get((depth, p.main_tpp, best["default"]), {}).get("default", {})
        out[a] = dict(depth=depth, lr=best[a], default_lr=best["default"], seeds=sorted(gaps),
                      default_loss={s: dflt[s]["loss"] for s in gaps},
                      default_own_rate_loss={s: own[s]["loss"] for s in sorted(own)},
                      gap_loss=gaps, gap_loss_ms=V.mean_std(gaps.values()))
    verdicts = V.judge({a: r["gap_loss"] for a, r in out.items()})  # the same-rate table: its own family
    for a, v in verdicts.items():
        out[a]["verdict"] = v
    return out


def shared_rate_from_scale(p: DepthPlan, eval_name: str | None, own: dict) -> dict:
    """The scale sweep's depth-2 runs (``p.shared_from``) beside this sweep's: at ``grid_tpp`` its LR sweep (gap at
    the shared rate and at each arm's own best rate of that sweep, seeds 0-1); at ``main_tpp`` its shared-rate gap
    (seeds 0-2) next to this sweep's depth-2 gap at each arm's own rate (``own``: :func:`analyse`'s depth row)."""
    if not p.shared_from or not os.path.isdir(os.path.join(p.shared_from, "runs")):
        return {}
    cells = SR.load_cells(p.shared_from, eval_name)
    name = SP.size_name(p.size(2))
    out: dict = {}
    lr_cells = {k[2]: v for k, v in cells.items() if k[0] == name and k[1] == p.grid_tpp}
    if lr_cells:
        sweep = SR.lr_sweep(lr_cells, p.arms)
        key = f"2x{p.width}, {p.grid_tpp:g} tok/param (scale sweep; shared: every seed, own: seeds of every rate)"
        for a in p.arms:
            if a == "default" or a not in sweep or "default" not in sweep:
                continue
            ba, bd = sweep[a]["best"], sweep["default"]["best"]
            sh = SR.paired_gaps(lr_cells.get(p.shared_lr, {}), a).values()
            own_g = SR.paired_gaps(lr_cells[ba], a, default=lr_cells[bd].get("default", {})).values()
            out.setdefault(key, {})[a] = dict(shared=V.mean_std(sh)[0], own=V.mean_std(own_g)[0], own_lr=ba,
                                              default_lr=bd)
    main = cells.get((name, p.main_tpp, p.shared_lr))
    if main:
        key = f"2x{p.width}, {p.main_tpp:g} tok/param (shared: scale sweep, seeds 0-2; own: this sweep)"
        for a in p.arms:
            if a == "default":
                continue
            g = list(SR.paired_gaps(main, a).values())
            out.setdefault(key, {})[a] = dict(shared=V.mean_std(g)[0],
                                              own=(own.get(a) or {}).get("gap_loss_ms", (None,))[0])
    return out


def _k(x):
    """A condition number in 3 significant digits."""
    return f"{x:.3g}"


def _pts(x, sign=False):
    return "–" if x is None else (f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}")


def _best_text(g: dict) -> str:
    """A grid's best rate in a table (``g``: an arm of ``results["grid"]`` or ``results["own_grid"][depth]``)."""
    if g["best_lr"] is not None:
        return f"{g['best_lr']:g}"
    return "none: every rate diverged" if g.get("decided") else "not decided (grid unfinished)"


def markdown(res: dict, p: DepthPlan, eval_name: str | None, n_runs: int, n_planned: int, cpu: float) -> str:
    f = SR._f
    metric = f"`{eval_name}`" if eval_name else "the internal held-out split"
    lines = [f"Metric: loss / perplexity on {metric} at the end of each run; BLiMP accuracy (%, EOS prefix); "
             "Δ = arm − default, both at their own best learning rate of the grid, paired by seed; mean ± std over "
             "seeds. '–': not finished (or recorded without BLiMP).\n"]
    lines.append(f"Learning-rate grid (depth {p.grid_depth} × {p.width}, {p.grid_tpp:g} tokens per parameter, seed 0; "
                 f"loss on {metric}; BLiMP % in brackets):\n")
    lrs = sorted({float(x) for g in res["grid"].values() for x in g["tried"]})
    lines.append("| arm | " + " | ".join(f"lr {x:g}" for x in lrs) + " | best lr |")
    lines.append("|---|" + "---|" * (len(lrs) + 1))
    for a, g in res["grid"].items():
        cells = []
        for x in lrs:
            v = g["loss_by_lr"].get(f"{x:g}")
            b = g["blimp_by_lr"].get(f"{x:g}")
            cells.append("–" if v is None else f"{f(v)}" + (f" ({_pts(b)})" if b is not None else ""))
        best = (_best_text(g) + (" (edge of the ladder)" if g["at_ladder_end"] else "")
                + (" (grid extended)" if g["extended"] else ""))
        lines.append(f"| {a} | " + " | ".join(cells) + f" | {best} |")
    lines.append("")
    if res["shared_rate"]:
        lines.append(f"Shared rate ({p.shared_lr:g}) beside each arm's own best rate: Δ loss to default (default "
                     "also at the shared / its own best rate):\n")
        lines.append("| setting | arm | Δ at shared lr | Δ at own best lr |")
        lines.append("|---|---|---|---|")
        for key, arms in res["shared_rate"].items():
            for a, v in arms.items():
                lines.append(f"| {key} | {a} | {f(v['shared'], sign=True)} | {f(v['own'], sign=True)} |")
        lines.append("")
    for d, grid in res.get("own_grid", {}).items():
        lrs = sorted({float(x) for g in grid.values() for x in g["tried"]})
        lines.append(f"Own LR grid at depth {d} ({p.main_tpp:g} tokens per non-embedding parameter, seed 0; loss on "
                     f"{metric}):\n")
        lines.append("| arm | " + " | ".join(f"lr {x:g}" for x in lrs) + " | best lr |")
        lines.append("|---|" + "---|" * (len(lrs) + 1))
        for a, g in grid.items():
            lines.append(f"| {a} | " + " | ".join(f(g["loss_by_lr"].get(f"{x:g}")) for x in lrs) + " | "
                         + _best_text(g) + " |")
        lines.append("")
    unsure = [d for d in p.depths if d != p.grid_depth and d not in res.get("own_grid", {})]
    lines.append(f"Across depth (width {p.width}, head dim {p.width // p.n_head}, {p.main_tpp:g} tokens per "
                 "non-embedding parameter, each arm at its own best rate of the grid at depth "
                 f"{p.grid_depth}"
                 + "".join(f", at depth {d} of its own grid there" for d in res.get("own_grid", {}))
                 + ("" if p.rate_check_depth not in unsure else
                    f"; at depth {p.rate_check_depth} not every arm has its seeds at the best rate of its own "
                    f"depth-{p.rate_check_depth} grid yet (the same-rate check below; that grid: `--grid-depths "
                    f"{p.rate_check_depth}`), so the depth-{p.rate_check_depth} verdicts are provisional")
                 + "; seeds marked * come from the scale sweep's records of the same run — identical batches, "
                 "checked):\n")
    lines.append("| depth | params (non-emb.) | tokens/param, all (non-emb.) | device | arm | lr | seeds "
                 "| ppl per seed "
                 "| Δ loss: mean [95 % CI] verdict | BLiMP % per seed | Δ BLiMP pts: mean [95 % CI] verdict "
                 "| steps to default's final loss (of total) | κ init (mean over layers) | κ end |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for depth, row in res["depths"].items():
        for a in [x for x in p.arms if x in row]:
            r = row[a]
            st = r["steps_to_default_final_mean"]
            k0 = r["kappa_init_layers"]
            k1 = r["kappa_end_layers"]
            seeds = ", ".join(f"{s}*" if s in r["from_scale_sweep"] else str(s) for s in r["seeds"])
            lines.append(
                f"| {depth} | {r['n_all']:,} ({r['n']:,}) | {r['tokens_seen'] / r['n_all']:.2f} ({p.main_tpp:g}) | "
                f"{', '.join(r['devices'])} | {a} | {r['lr']:g} | {len(r['seeds'])} ({seeds}) | "
                + " / ".join(f(x, 1) for x in r["ppl"].values()) + " | "
                + ("–" if a == "default" else V.fmt(r.get("loss_verdict"))) + " | "
                + " / ".join(_pts(x) for x in r["blimp"].values()) + " | "
                + ("–" if a == "default" else V.fmt(r.get("blimp_verdict"), 2, 100)) + " | "
                + ("not reached" if st is None else f"{st:.0f} ({r['n_reached']}/{len(r['seeds'])} seeds) of {r['steps']}")
                + f" | {_k(statistics.fmean(k0)) if k0 else '–'} | {_k(statistics.fmean(k1)) if k1 else '–'} |")
    lines.append("")
    for m in res.get("matched_baselines", {}).values():
        lines.append(f"Device-matched baseline: default at depth {m['depth']}, lr {m['lr']:g}, run again on the "
                     f"{SR._device_word(m['device'])} for seeds {', '.join(map(str, m['loss'])) or '(none yet)'} "
                     f"(loss {' / '.join(f(x) for x in m['loss'].values()) or '–'}); an arm's run on that device "
                     "pairs with it, the table's default row keeps default's own runs.\n")
    fam = {w: len([1 for row in res["depths"].values() for a, r in row.items()
                   if a != "default" and r.get(f"{w}_verdict", {}).get("n", 0) >= 2]) for w in ("loss", "blimp")}
    lines.append(C.family_caption("this table's Δ loss cells (every depth and arm)", fam["loss"])
                 + f" The Δ BLiMP column is its own family of {fam['blimp']} cells.")
    for depth, row in res["depths"].items():
        d = row.get("default")
        if d:
            lines.append(f"- depth {depth}: " + C.flat_sentence(V.flat_curve(d["eval_curves"], d["steps"])))
    lines.append("")
    if res.get("same_rate"):
        lines.append("Same-rate check: at depth %d each arm whose best rate is not default's against default run at the "
                     "*arm's* rate (paired by seed):\n" % p.rate_check_depth)
        lines.append("| depth | arm | lr (both) | seeds | default loss at this lr / at its own lr (per seed) "
                     "| Δ loss: mean [95 % CI] verdict |")
        lines.append("|---|---|---|---|---|---|")
        for a, r in res["same_rate"].items():
            d_here = " / ".join(f(x) for x in r["default_loss"].values()) or "–"
            d_own = " / ".join(f(x) for x in r["default_own_rate_loss"].values()) or "–"
            lines.append(f"| {r['depth']} | {a} | {r['lr']:g} | {len(r['seeds'])} | {d_here} (own {r['default_lr']:g}: "
                         f"{d_own}) | {V.fmt(r['verdict'])} |")
        lines.append("")
        lines.append(C.family_caption("this table's rows", len([r for r in res["same_rate"].values()
                                                                 if r["verdict"]["n"] >= 2])))
        lines.append("")
    lines.append("κ(J) per layer (causal, mean over heads and seeds; init → end):\n")
    lines.append("| depth | arm | κ per layer at init | κ per layer at the end |")
    lines.append("|---|---|---|---|")
    for depth, row in res["depths"].items():
        for a in [x for x in p.arms if x in row]:
            k0, k1 = row[a]["kappa_init_layers"], row[a]["kappa_end_layers"]
            lines.append(f"| {depth} | {a} | " + (" / ".join(_k(x) for x in k0) if k0 else "–") + " | "
                         + (" / ".join(_k(x) for x in k1) if k1 else "–") + " |")
    lines.append("")
    lines.append(f"{n_runs} finished runs of {n_planned} planned ({cpu:.0f} core-s = {cpu / 3600:.2f} core-h of CPU "
                 "time).")
    return "\n".join(lines) + "\n"


def plots(res: dict, p: DepthPlan, out: str) -> list[str]:
    """``gap_vs_depth.png`` (Δ loss and Δ BLiMP against depth per arm: each seed a dot, mean ± std a bar; the
    same-rate checks as open markers),
    ``lr_curves.png`` (grid loss against learning rate per arm, best marked) and ``kappa_vs_depth.png`` (causal κ(J),
    mean over layers and seeds, at init (dashed) and at the end (solid), against depth per arm)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    arms = [a for a in p.arms if a != "default"]

    def save(fig, name):
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110)
        written.append(path)

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    for j, (key, ylabel, scale) in enumerate((("gap_loss", "Δ loss vs default (paired by seed)", 1.0),
                                              ("gap_blimp", "Δ BLiMP accuracy vs default (points)", 100.0))):
        ax = fig.add_subplot(1, 2, j + 1)
        for i, a in enumerate(arms):
            xs, ms, ss = [], [], []
            for depth, row in res["depths"].items():
                g = row.get(a, {}).get(key)
                vals = list(g.values()) if isinstance(g, dict) else (g or [])
                if not vals:
                    continue
                dx = depth * (1 + 0.03 * (i - len(arms) / 2))
                ax.plot([dx] * len(vals), [scale * v for v in vals], ".", color=f"C{i}", alpha=0.5)
                m, s = V.mean_std(vals)
                xs.append(dx), ms.append(scale * m), ss.append(scale * s)
            if xs:
                ax.errorbar(xs, ms, yerr=ss, fmt="o-", color=f"C{i}", capsize=3, label=a)
            same = res.get("same_rate", {}).get(a)
            if key == "gap_loss" and same and same["gap_loss"]:
                vals = list(same["gap_loss"].values())
                m, s = V.mean_std(vals)
                dx = same["depth"] * (1 + 0.03 * (i - len(arms) / 2 + 0.5))
                ax.errorbar([dx], [m], yerr=[s], fmt="o", mfc="white", color=f"C{i}", capsize=3,
                            label=f"{a} vs default, both at lr {same['lr']:g}")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(p.depths), [str(d) for d in p.depths])
        ax.set(xlabel=f"depth (width {p.width}, {p.main_tpp:g} tokens/param, own best lr)", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    save(fig, "gap_vs_depth.png")

    fig = Figure(figsize=(7, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, a in enumerate(p.arms):
        g = res["grid"][a]
        pts = sorted((float(x), v) for x, v in g["loss_by_lr"].items() if math.isfinite(v))
        if pts:
            ax.plot([x for x, _ in pts], [v for _, v in pts], "o-", color=f"C{i}", label=a)
        if g["best_lr"] is not None and math.isfinite(g["loss_by_lr"][f"{g['best_lr']:g}"]):
            ax.plot([g["best_lr"]], [g["loss_by_lr"][f"{g['best_lr']:g}"]], "*", ms=14, color=f"C{i}")
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="loss (WikiText-2 valid)",
           title=f"LR grid: depth {p.grid_depth} × {p.width}, {p.grid_tpp:g} tokens/param, seed 0 (★ best)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save(fig, "lr_curves.png")

    fig = Figure(figsize=(7, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, a in enumerate(p.arms):
        for key, ls, tag in (("kappa_init_layers", "--", "init"), ("kappa_end_layers", "-", "end")):
            pts = [(d, statistics.fmean(row[a][key])) for d, row in res["depths"].items()
                   if a in row and row[a][key]]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o" + ls, color=f"C{i}", label=f"{a} ({tag})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(p.depths), [str(d) for d in p.depths])
    ax.set(xlabel="depth", ylabel="κ(J), causal, mean over layers and seeds",
           title="attention-Jacobian condition number at init (dashed) and at the end (solid)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    save(fig, "kappa_vs_depth.png")
    return written


def collect(out: str, p: DepthPlan, eval_name: str | None) -> tuple[dict, str]:
    """Read only: ``(results, markdown)`` of the finished records under ``out``/runs, with the scale sweep's runs
    of the same shape (``add_shared_seeds``); ``results`` is what ``results.json`` holds."""
    if not os.path.isdir(os.path.join(out, "runs")):
        fail(f"no finished runs under {os.path.join(out, 'runs')}; run without --report-only first")
    if eval_name is None:  # --report-only without --eval-file: the file the runs were evaluated on
        names = sorted({n for root, _, fs in os.walk(os.path.join(out, "runs")) for fn in fs if fn.endswith(".json")
                        for n in json.load(open(os.path.join(root, fn))).get("eval_files", {})})
        eval_name = names[0] if names else None
    runs = load_runs(out, eval_name)
    if p.shared_from and os.path.isdir(os.path.join(p.shared_from, "runs")):
        shared = {}
        for (size, tpp, lr), cell in SR.load_cells(p.shared_from, eval_name).items():
            depth, width = map(int, size.split("x"))
            if width != p.width:
                continue
            for label, seeds in cell.items():
                shared.setdefault((depth, tpp, lr), {})[label] = {
                    s: dict(r, kappa_init=None, kappa_end=None, source=p.shared_from) for s, r in seeds.items()}
        add_shared_seeds(runs, shared)
    state = grid_state(out, p, eval_name)
    states = own_grid_states(out, p, eval_name)
    res = analyse(runs, p, state, states)
    res["shared_rate"].update(shared_rate_from_scale(p, eval_name, res["depths"].get(2, {})))
    recs = [r for c in runs.values() for s in c.values() for r in s.values() if r["source"] == out]
    cpu = sum(r["cpu_seconds"] or 0 for r in recs)
    results = dict(metric=eval_name or "internal held-out split", n_runs=len(recs), cpu_seconds=cpu,
                   plan=dict(width=p.width, n_head=p.n_head, depths=p.depths, seeds=p.seeds, main_tpp=p.main_tpp,
                             grid_depth=p.grid_depth, grid_tpp=p.grid_tpp, grid_lrs=p.grid_lrs, ladder=p.ladder,
                             shared_lr=p.shared_lr, arms=p.arms, dropped=p.dropped,
                             rate_check_depth=p.rate_check_depth, own_grid_depths=p.own_grid_depths,
                             matched_baselines=p.matched_baselines), **res)
    return results, markdown(res, p, eval_name, len(recs), len(plan(p, state, placeholder=True, states=states)), cpu)


def report(out: str, p: DepthPlan, eval_name: str | None, copy_plots: str | None = None) -> dict:
    results, text = collect(out, p, eval_name)
    C.write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    written = plots(results, p, out)
    if copy_plots:
        import shutil

        os.makedirs(copy_plots, exist_ok=True)
        for path in written:
            shutil.copy(path, os.path.join(copy_plots, "depth_" + os.path.basename(path)))
    results["plots"] = written
    return results
