"""A study's report from its finished cells: ``<out>/report.md``, ``<out>/report.json`` and the figures.

- **Learning rate per arm**: the grid's values at the selection seed, the rate chosen, whether the grid was
  extended and whether the best is still at its edge (then the chosen rate is a bound, not a best).
- **Arms**: :func:`hf_condinit.compare.compare_table` of every arm's seeds at its rate (means over seeds).
- **Paired against the baseline** (the first arm): :func:`hf_condinit.compare.paired_rows`, the rule of
  :mod:`hf_condinit.stats` (paired Δ by seed, 95 % Student-t interval, Holm over the study's arms, steps to the
  baseline's final value, flat-curve flag).
- **Cells**: finished, failed (exit code and last line), not finished.

``report_eval.png``: the metric over training, every arm (mean over seeds with a ±1 std band; drawn when the runs
evaluated more than once). ``report_lr.png``: the grid, metric against learning rate at the selection seed (with a
grid). Paths in the report are relative to ``<out>``, so the same cells give the same report wherever they ran.
"""

from __future__ import annotations

import json
import math
import os

from ..compare import Arm, compare_table, format_paired, format_table, load_run, paired_rows
from ..reporting.plots import plot_eval_curves
from ..reporting.runs import lower_is_better
from .cells import cell_state, failure_of, outcome_of
from .plan import Cell, Plan, arm_rates, resolve, slots

__all__ = ["build_report", "write_report"]


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
    arms = []
    for a in plan.arms:
        rate = rates[a]["best"] if plan.grid else (plan.lrs[0] if plan.lrs else None)
        arm = Arm(a, a, rate)
        for c in cells:
            if c["arm"] == a and c["lr"] == rate and c["state"] == "finished":
                arm.runs[c["seed"]] = load_run(os.path.join(out, c["folder"]), name=a)
        arms.append(arm)
    done = [a for a in arms if a.runs]
    base = arms[0]
    report = dict(plan=dict(arms=plan.arms, seeds=plan.seeds, lrs=plan.lrs, metric=plan.metric,
                            select_seed=plan.select_seed, lr_extend=plan.lr_extend, command=plan.command),
                  rates={a: None if r is None else dict(r, values={
                      f"{lr:g}": None if v is None else "failed" if v == math.inf else sign * v
                      for lr, v in r["values"].items()}) for a, r in rates.items()},
                  cells=cells, table=None, paired=None)
    if done:
        report["table"] = compare_table([a.item() for a in done], plan.metric)
    if base.runs and len(done) > 1:
        report["paired"] = paired_rows([(a, base) for a in done if a is not base], plan.metric)
    report["_arms"] = done
    return report


def _rates_md(plan: Plan, report: dict) -> list[str]:
    if not plan.grid:
        rate = f"{plan.lrs[0]:g}" if plan.lrs else "the command's own"
        return [f"Every arm at learning rate {rate} (no grid)."]
    lines = [f"Each arm's rate: the best final {plan.metric} at seed {plan.select_seed} on the grid "
             f"{', '.join(f'{x:g}' for x in sorted(plan.lrs))} (extended by one step past an edge, at most "
             f"{plan.lr_extend} time(s)).", "",
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


def _markdown(plan: Plan, out: str, report: dict) -> str:
    cells = report["cells"]
    n_done = sum(c["state"] == "finished" for c in cells)
    lines = [f"# Study {os.path.basename(os.path.abspath(out))}", "",
             f"Command: `{' '.join(plan.command)}`; arms {', '.join(plan.arms)} (baseline: {plan.arms[0]}); seeds "
             f"0-{plan.seeds - 1}; metric {plan.metric}. Cells finished: {n_done} of {len(cells)} planned so far.", "",
             "## Learning rate per arm", "", *_rates_md(plan, report), ""]
    if report["table"]:
        lines += ["## Arms", "", format_table(report["table"])]
    if report["paired"]:
        lines += [f"## Paired against {plan.arms[0]}", "", format_paired(report["paired"])]
    else:
        lines += ["## Paired against the baseline", "", "No pairs yet: the baseline and another arm need finished "
                  "seeds at their rates.", ""]
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
    figures = []
    if plan.grid:
        figures.append(os.path.basename(_plot_grid(plan, report, os.path.join(out, "report_lr.png"))))
    if arms and max(len(r.eval_curve(plan.metric)[0]) for a in arms for r in a.runs.values()) > 1:
        path = plot_eval_curves([a.item() for a in arms], os.path.join(out, "report_eval.png"), plan.metric)
        figures.append(os.path.basename(path))
    report["figures"] = figures
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(plan, out, report))
    return report
