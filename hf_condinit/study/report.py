"""A study's report from its finished cells: ``<out>/report.md``, ``<out>/report.json`` and the figures.

- **Plan**: how it grew (what was added, when).
- **Learning rate per arm**: the grid's values at the selection seed (the seed and data that chose the rate), the
  rate chosen, whether the grid was extended and whether the best is still at its edge (then the chosen rate is a
  bound, not a best).
- **Arms**: :func:`hf_condinit.compare.compare_table` of every arm's verdict seeds at its rate (means over seeds).
- **Paired against the baseline** (the first arm): :func:`hf_condinit.compare.paired_rows`, the rule of
  :mod:`hf_condinit.stats` (paired Δ by seed, 95 % Student-t interval, Holm over the study's arms, steps to the
  baseline's final value, flat-curve flag), on the verdict seeds (:func:`hf_condinit.study.plan.verdict_seeds`:
  without the selection seed, whose cells chose the rates: the unbiased verdict); with a grid the same table with
  the selection seed too, marked as optimistic.
- **Power** of each comparison (:func:`hf_condinit.stats.detectable_effect`, :func:`hf_condinit.stats.seeds_needed`):
  from the observed paired sd, at the Bonferroni level 0.05 / m (m: the comparisons with ≥ 2 pairs; Holm's level for
  the smallest p), the smallest effect the current pairs detect with 80 % power, and the pairs needed for the
  plan's ``effect``.
- **Every pair of arms** (with three or more arms): the same paired verdict of the final value for each later arm
  against each earlier one (e.g. conditioned against mimetic), Holm over that table.
- **Steps to the baseline's final value**, paired by seed for every pair of arms (:func:`.curves.reach_rows`: the
  target of seed s is the baseline's final value at seed s; a run that never reaches it is censored at its last
  step), in steps and epochs, Holm over the table.
- **Plateau** per arm (:func:`.curves.plateau_rows`): the mean gain over the last fifth of training against the
  plan's ``plateau`` threshold (``--plateau``, in the metric's units), on every seed at the arm's rate, the
  selection seed's included (a property of the training's length, not a comparison: it is known after the grid).
- **Cells**: finished, failed (exit code and last line), not finished.

``report_eval.png``: the metric over training, every arm (mean over seeds with a ±1 std band; drawn when the runs
evaluated more than once). ``report_curves.png``: the same curves over epochs, each arm's mean with its 95 %
interval over the verdict seeds and the baseline's mean final value (:func:`.curves.plot_curves_with_intervals`).
``report_lr.png``: the grid, metric against learning rate at the selection seed (with a
grid). Paths in the report are relative to ``<out>``, so the same cells give the same report wherever they ran.
"""

from __future__ import annotations

import json
import math
import os

from .. import stats
from ..compare import Arm, compare_table, format_paired, format_table, load_run, paired_rows
from ..reporting.plots import plot_eval_curves
from ..reporting.runs import lower_is_better
from . import curves
from .cells import cell_state, failure_of, outcome_of
from .plan import Cell, Plan, arm_rates, resolve, slots, verdict_seeds

__all__ = ["build_report", "markdown", "write_report"]


def _cells(plan: Plan, out: str) -> list[Cell]:
    """Every cell the plan has reached so far (slots resolved with what is on disk), in slot order."""
    outcome = outcome_of(plan, out)
    found = [resolve(plan, s, outcome) for s in slots(plan)]
    return [c for c in found if isinstance(c, Cell)]


def build_report(plan: Plan, out: str) -> dict:
    """Everything the report says, as JSON-ready data (module docstring)."""
    outcome = outcome_of(plan, out)
    rates = {a: arm_rates(plan, a, outcome) if plan.grid else None for a in plan.arms}
    sign = 1 if lower_is_better(plan.metric) else -1
    cells = []
    for cell in _cells(plan, out):
        state, value = cell_state(plan, cell, out)
        cells.append(dict(arm=cell.arm, seed=cell.seed, lr=cell.lr, state=state, value=value,
                          folder=os.path.relpath(cell.folder(out), out),
                          **({"failure": failure_of(out, cell)} if state == "failed" else {})))
    arms, with_selection = [], []
    keep = set(verdict_seeds(plan))
    for a in plan.arms:
        rate = rates[a]["best"] if plan.grid else (plan.lrs[0] if plan.lrs else None)
        arm, every = Arm(a, a, rate), Arm(a, a, rate)
        for c in cells:
            if c["arm"] == a and c["lr"] == rate and c["state"] == "finished":
                run = load_run(os.path.join(out, c["folder"]), name=a)
                every.runs[c["seed"]] = run
                if c["seed"] in keep:
                    arm.runs[c["seed"]] = run
        arms.append(arm)
        with_selection.append(every)
    done = [a for a in arms if a.runs]
    report = dict(plan=dict(arms=plan.arms, seeds=plan.seeds, lrs=plan.lrs, metric=plan.metric,
                            select_seed=plan.select_seed, lr_extend=plan.lr_extend, command=plan.command,
                            effect=plan.effect, history=plan.history),
                  verdict_seeds=sorted(keep),
                  rates={a: None if r is None else dict(r, values={
                      f"{lr:g}": None if v is None else "failed" if v == math.inf else sign * v
                      for lr, v in r["values"].items()}) for a, r in rates.items()},
                  cells=cells, table=None, paired=None, paired_with_selection=None, power=None,
                  every_pair=None, reach=curves.reach_rows(arms, plan.metric),
                  plateau=curves.plateau_rows(with_selection, plan.metric, plan.plateau))
    if done:
        report["table"] = compare_table([a.item() for a in done], plan.metric)
    report["paired"] = _paired(arms, plan.metric)
    if plan.grid:
        report["paired_with_selection"] = _paired(with_selection, plan.metric)
    if report["paired"]:
        report["power"] = [_power(row, plan) for row in report["paired"]]
    if len(done) >= 3:
        report["every_pair"] = paired_rows([(done[j], done[i]) for j in range(1, len(done)) for i in range(j)],
                                           plan.metric)
    report["_arms"] = arms
    return report


def _paired(arms: list[Arm], metric: str) -> list[dict] | None:
    """:func:`hf_condinit.compare.paired_rows` of every arm with runs against the baseline (``arms[0]``)."""
    base, done = arms[0], [a for a in arms if a.runs]
    if not base.runs or len(done) < 2:
        return None
    return paired_rows([(a, base) for a in done if a is not base], metric)


def _power(row: dict, plan: Plan) -> dict:
    """The power of one paired comparison (module docstring): ``n``, ``sd``, ``alpha``, ``detectable`` (smallest
    effect detected with 80 % power at n), ``effect`` (the plan's, in the metric's units), ``pairs_needed`` and
    ``seeds_needed`` (the ``--seeds`` giving that many pairs: one more with a grid, for the selection seed)."""
    v = row["verdict"]
    text = plan.effect
    effect = (float(text[:-1]) / 100 * abs(row["target"]) if text.endswith("%") and row["target"] is not None
              else None if text.endswith("%") else float(text))
    alpha = stats.ALPHA / max(1, v["family_size"])
    pairs = stats.seeds_needed(effect, v["sd"], alpha) if effect and v["sd"] is not None else None
    return dict(arm=row["arm"], n=v["n"], sd=v["sd"], alpha=alpha, power=stats.POWER,
                detectable=stats.detectable_effect(v["sd"], v["n"], alpha) if v["sd"] is not None else None,
                effect=effect, effect_asked=text, pairs_needed=pairs,
                seeds_needed=None if pairs is None else pairs + (1 if plan.grid else 0))


def _rates_md(plan: Plan, report: dict) -> list[str]:
    if not plan.grid:
        rate = f"{plan.lrs[0]:g}" if plan.lrs else "the command's own"
        return [f"Every arm at learning rate {rate} (no grid)."]
    lines = [f"Each arm's rate: the best final {plan.metric} at seed {plan.select_seed} on the grid "
             f"{', '.join(f'{x:g}' for x in sorted(plan.lrs))} (extended by one step past an edge, at most "
             f"{plan.lr_extend} time(s)), measured on the command's evaluation data. Seed {plan.select_seed}'s "
             "cells chose the rates, so they are kept out of the verdict below.", "",
             "| arm | " + f"{plan.metric} at seed {plan.select_seed} by learning rate | chosen | note |",
             "|---|---|---:|---|"]
    for a, r in report["rates"].items():
        vals = ", ".join(f"{lr}: " + ("pending" if v is None else v if v == "failed" else f"{v:.4g}")
                         for lr, v in r["values"].items())
        note = ("every rate failed" if r["decided"] and r["best"] is None else
                "not decided yet" if not r["decided"] else
                "best at the edge of the grid: a bound, not a best" if r["at_edge"] else "")
        if r["extensions"]:
            note = (note + "; " if note else "") + "grid extended by " + ", ".join(f"{x:g}" for x in r["extensions"])
        lines.append(f"| {a} | {vals} | {'—' if r['best'] is None else format(r['best'], 'g')} | {note} |")
    return lines


def _seeds(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds)) if seeds else "none"


def _power_md(plan: Plan, report: dict) -> list[str]:
    lines = [f"| arm | n pairs | paired sd | detectable at {stats.POWER:.0%} power | effect asked | pairs needed | "
             "--seeds for it |", "|---|---:|---:|---:|---:|---:|---:|"]
    num = lambda x: "—" if x is None else f"{x:.4g}"  # noqa: E731
    for p in report["power"]:
        effect = "—" if p["effect"] is None else (f"{p['effect']:.4g} ({p['effect_asked']} of the baseline)"
                                                  if p["effect_asked"].endswith("%") else f"{p['effect']:.4g}")
        lines.append(f"| {p['arm']} | {p['n']} | {num(p['sd'])} | {num(p['detectable'])} | {effect} | "
                     f"{'—' if p['pairs_needed'] is None else p['pairs_needed']} | "
                     f"{'—' if p['seeds_needed'] is None else p['seeds_needed']} |")
    alpha = report["power"][0]["alpha"]
    lines += ["", f"Power of the paired t-test above ({stats.SOURCE}.detectable_effect, seeds_needed: noncentral t) at "
              f"level {alpha:.3g} (0.05 over the {round(stats.ALPHA / alpha)} comparison(s), Holm's level for the "
              f"smallest p), from each row's observed paired sd: *detectable* is the smallest true mean difference "
              f"the current pairs find with {stats.POWER:.0%} probability; *pairs needed*, how many pairs find the "
              f"effect asked (--effect) as often" + (f"; *--seeds* adds the selection seed {plan.select_seed}."
                                                      if plan.grid else "."), ""]
    return lines


def markdown(plan: Plan, out: str, report: dict) -> str:
    """``report.md``'s text for the report of :func:`build_report` (figures: ``report["figures"]``, file names in
    ``out``)."""
    cells = report["cells"]
    n_done = sum(c["state"] == "finished" for c in cells)
    seeds = _seeds(report["verdict_seeds"])
    lines = [f"# Study {os.path.basename(os.path.abspath(out))}", "",
             f"Command: `{' '.join(plan.command)}`; arms {', '.join(plan.arms)} (baseline: {plan.arms[0]}); seeds "
             f"0-{plan.seeds - 1}; metric {plan.metric}. Cells finished: {n_done} of {len(cells)} planned so far.", ""]
    if plan.history:
        lines += ["## Plan grown", "", *[f"- {h['at']}: {h['added']}" for h in plan.history], ""]
    lines += ["## Learning rate per arm", "", *_rates_md(plan, report), ""]
    if report["table"]:
        lines += ["## Arms", "", f"Seeds {seeds} (the verdict's).", "", format_table(report["table"])]
    if report["paired"]:
        lines += [f"## Paired against {plan.arms[0]}", "",
                  f"Seeds {seeds}" + (f": the selection seed {plan.select_seed} left out, so no cell that chose a "
                                      "rate is in it (the unbiased verdict)." if plan.grid else "."), "",
                  format_paired(report["paired"]), "### Power", "", *_power_md(plan, report)]
    else:
        lines += ["## Paired against the baseline", "", f"No pairs yet: the baseline and another arm need finished "
                  f"seeds at their rates (the verdict's seeds: {seeds}).", ""]
    if report["paired_with_selection"]:
        lines += [f"## With the selection seed {plan.select_seed} too (optimistic)", "",
                  f"The same comparison with seed {plan.select_seed} in: its cells chose each arm's rate on the same "
                  "evaluation data, so each arm's own best draw is in this table and its verdict leans towards "
                  "the arm whose grid fit that seed best. For reference only; the verdict is the table above.", "",
                  format_paired(report["paired_with_selection"])]
    lines += _every_pair_md(plan, report) + _reach_md(plan, report) + _plateau_md(plan, report)
    failed = [c for c in cells if c["state"] == "failed"]
    todo = [c for c in cells if c["state"] == "todo"]
    lines += ["## Cells", ""]
    lines += [f"- failed: `{c['folder']}`: exit {c['failure']['exit_code']}: {c['failure']['error']}" for c in failed]
    lines += [f"- not finished: `{c['folder']}`" for c in todo]
    if not failed and not todo:
        lines.append(f"- all {n_done} finished")
    figures = report.get("figures") or []
    if figures:
        lines += ["", *[f"![{f}]({f})" for f in figures]]
    return "\n".join(lines) + "\n"


def _every_pair_md(plan: Plan, report: dict) -> list[str]:
    rows = report["every_pair"]
    if not rows:
        return []
    lines = ["## Every pair of arms", "", f"Seeds {_seeds(report['verdict_seeds'])}; each later arm against each "
             "earlier one, paired by seed.", "", f"| arm | against | Δ final {plan.metric}, mean [95 % interval] "
             "verdict | n pairs |", "|---|---|---|---:|"]
    lines += [f"| {r['arm']} | {r['baseline']} | {stats.fmt(r['verdict'], 4)} | {r['verdict']['n']} |" for r in rows]
    return lines + ["", stats.family_caption("this table's rows (every pair of arms)",
                                             rows[0]["verdict"]["family_size"]), ""]


def _reach_md(plan: Plan, report: dict) -> list[str]:
    reach, base = report["reach"], plan.arms[0]
    if not reach:
        return []
    per_epoch = reach["steps_per_epoch"]
    epochs = (lambda x: f"{x / per_epoch:.2f}") if per_epoch else (lambda x: "—")  # noqa: E731
    lines = [f"## Steps to {base}'s final {plan.metric}", "",
             f"Seeds {_seeds(report['verdict_seeds'])}. For seed s the target is {base}'s final {plan.metric} at "
             f"seed s; a run reaches it at its first evaluation at least as good (interpolated from the one "
             f"before). A run that never reaches it is *censored*: it counts at its last step, less than the truth, "
             f"so a difference leans towards the arm with censored seeds. "
             + (f"Epochs: steps ÷ {per_epoch:.4g} steps per epoch." if per_epoch else
                "No epochs: the runs do not all record the same steps per epoch."),
             "", "| arm | steps, mean over seeds | epochs | seeds that reach it |", "|---|---:|---:|---:|"]
    for arm, by_seed in reach["arms"].items():
        xs = [r["steps"] for r in by_seed.values()]
        mean = sum(xs) / len(xs)
        lines.append(f"| {arm} | {mean:.0f} | {epochs(mean)} | "
                     f"{sum(not r['censored'] for r in by_seed.values())} of {len(xs)} |")
    lines += ["", "| arm | against | Δ steps, mean [95 % interval] verdict | Δ epochs | n pairs | censored seeds "
              "(arm / against) |", "|---|---|---|---|---:|---:|"]
    for r in reach["rows"]:
        v = r["verdict"]
        lines.append(f"| {r['arm']} | {r['against']} | {stats.fmt(v, 1)} | "
                     f"{stats.fmt(v, 2, 1 / per_epoch) if per_epoch else '—'} | {v['n']} | "
                     f"{r['censored'][0]} / {r['censored'][1]} |")
    family = reach["rows"][0]["verdict"]["family_size"]
    return lines + ["", stats.family_caption("this table's rows (every pair of arms; fewer steps is better)",
                                             family), ""]


def _plateau_md(plan: Plan, report: dict) -> list[str]:
    rows = report["plateau"]
    if not rows:
        return []
    better = "falls" if lower_is_better(plan.metric) else "rises"
    lines = ["## Plateau", "",
             f"An arm is on a plateau when its {plan.metric} {better} by less than {plan.plateau:g} (the plan's "
             f"--plateau, in the metric's units) over the last fifth of training, on average over its seeds at its "
             "rate (the selection seed's too: this is about the training's length, not a comparison): the final "
             "value against the curve's value at 80 % of the run's steps.", "",
             "| arm | gain over the last fifth, mean | per seed | plateau |", "|---|---:|---|---|"]
    word = {True: "met", False: "not met", None: "not known (no evaluation before the last fifth)"}
    num = lambda x: "—" if x is None else f"{x:+.4g}"  # noqa: E731
    for r in rows:
        seeds = ", ".join(f"{s}: {num(g)}" for s, g in r["gains"].items())
        lines.append(f"| {r['arm']} | {num(r['mean'])} | {seeds} | {word[r['met']]} |")
    return lines + [""]


def _plot_grid(plan: Plan, report: dict, path: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for a, r in report["rates"].items():
        pts = [(float(lr), v) for lr, v in r["values"].items() if isinstance(v, float) and math.isfinite(v)]
        if pts:
            line, = ax.plot(*zip(*pts), marker="o", label=a)
            if r["best"] is not None:
                ax.plot([r["best"]], [dict(pts)[r["best"]]], marker="*", markersize=14, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel(f"final {plan.metric}, seed {plan.select_seed}")
    ax.set_title("learning-rate grid (star: the rate each arm's seeds ran at)")
    ax.legend()
    fig.savefig(path, dpi=110)
    return path


def write_report(plan: Plan, out: str) -> dict:
    """Build the report, draw the figures, write ``report.json`` and ``report.md``; returns the report."""
    report = build_report(plan, out)
    arms = report.pop("_arms")
    done = [a for a in arms if a.runs]
    figures = []
    if plan.grid:
        figures.append(os.path.basename(_plot_grid(plan, report, os.path.join(out, "report_lr.png"))))
    if done and max(len(r.eval_curve(plan.metric)[0]) for a in done for r in a.runs.values()) > 1:
        path = plot_eval_curves([a.item() for a in done], os.path.join(out, "report_eval.png"), plan.metric)
        figures.append(os.path.basename(path))
        path = curves.plot_curves_with_intervals(arms, plan.metric, os.path.join(out, "report_curves.png"))
        figures.append(os.path.basename(path))
    report["figures"] = figures
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(markdown(plan, out, report))
    return report
