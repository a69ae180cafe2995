"""Figures of one run (``loss.png``, ``kappa.png``) and overlays of several (``hf_condinit.compare``).

Every figure is drawn on its own ``matplotlib.figure.Figure`` with the Agg canvas: nothing touches pyplot's global
state or the user's backend, and no display is needed.

Overlays take *curves*: a :class:`Curve` given directly, a ``RunSummary`` (one run), or a :class:`RunGroup` (the
seeds of one arm, drawn as their mean with a band). Bands: mean ± one standard deviation over the seeds for
evaluation metrics; for κ, which spans orders of magnitude, the geometric mean times/divided by the geometric
standard deviation (mean ± std of log10 κ). Seeds are aggregated at the steps all of them have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, Union

from .runs import KappaRecord, RunSummary, eval_curve, lower_is_better, primary_metric, train_loss_curve

__all__ = [
    "Curve",
    "RunGroup",
    "aggregate_curves",
    "plot_loss",
    "plot_kappa_layers",
    "plot_curves",
    "plot_eval_curves",
    "plot_kappa",
    "common_metric",
]


@dataclass
class Curve:
    """One line of an overlay: ``values[i]`` at ``steps[i]``; ``lower`` / ``upper`` (same length) draw a band."""

    label: str
    steps: list[float]
    values: list[float]
    lower: list[float] | None = None
    upper: list[float] | None = None


@dataclass
class RunGroup:
    """Several runs of one arm (seeds), drawn as one curve: their mean with a band (module docstring)."""

    label: str
    runs: list[RunSummary] = field(default_factory=list)


CurveSource = Union[Curve, RunSummary, RunGroup]


def aggregate_curves(label: str, curves: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                     log: bool = False) -> Curve:
    """Mean and band of several ``(steps, values)`` curves at the steps they all have (module docstring).

    With one curve, no band. NaN / non-positive (when ``log``) values are left out of a step's statistics."""
    if not curves:
        return Curve(label, [], [])
    common = sorted(set.intersection(*(set(s) for s, _ in curves)))
    lookup = [dict(zip(s, v)) for s, v in curves]
    steps, mean, lower, upper = [], [], [], []
    for step in common:
        vals = [d[step] for d in lookup if _usable(d[step], log)]
        if not vals:
            continue
        xs = [math.log10(v) for v in vals] if log else vals
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        steps.append(step)
        if log:
            mean.append(10**m), lower.append(10 ** (m - sd)), upper.append(10 ** (m + sd))
        else:
            mean.append(m), lower.append(m - sd), upper.append(m + sd)
    band = len(curves) > 1
    return Curve(label, steps, mean, lower if band else None, upper if band else None)


def _usable(v: float, log: bool) -> bool:
    return v is not None and not math.isnan(v) and not math.isinf(v) and (v > 0 or not log)


def _new_figure(ncols: int = 1, width: float = 6.4, height: float = 4.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, path: str) -> str:
    fig.savefig(path, dpi=110)
    return path


def plot_loss(log_history: list[dict], path: str, *, final_metrics: dict | None = None,
              final_step: int | None = None, title: str | None = None) -> str:
    """Training loss (``loss`` entries) and evaluation loss (``eval_loss`` entries plus the final evaluation) vs
    optimizer step, from a ``trainer_state.json`` ``log_history``. Raises ``ValueError`` when there is no loss."""
    train = train_loss_curve(log_history)
    ev = eval_curve(log_history, "eval_loss", final_metrics, final_step)
    if not train[0] and not ev[0]:
        raise ValueError("the log history has no training or evaluation loss")
    fig, (ax,) = _new_figure()
    if train[0]:
        ax.plot(*train, label="train loss", color="C0", lw=1.2)
    if ev[0]:
        ax.plot(*ev, label="eval loss", color="C1", marker="o", ms=3.5, lw=1.4)
    ax.set(xlabel="step", ylabel="loss", title=title or "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_kappa_layers(records: Sequence[KappaRecord], path: str, *, title: str | None = None) -> str:
    """κ(J) per layer vs step, log scale: left the mean over heads with the layer's bound dashed (same colour),
    right the max over heads. Raises ``ValueError`` when no record has a finite positive κ."""
    layers = sorted({lay for r in records for lay in r.layers})
    if not any(_usable(r.layers[lay][k], True) for r in records for lay in r.layers for k in ("mean", "max")):
        raise ValueError("no finite positive κ in the records")
    fig, (ax_mean, ax_max) = _new_figure(ncols=2, width=5.2)
    for i, lay in enumerate(layers):
        color = f"C{i % 10}"
        for ax, key, style in ((ax_mean, "mean", "-"), (ax_max, "max", "-"), (ax_mean, "bound", "--")):
            pts = [(r.step, r.layers[lay][key]) for r in records if lay in r.layers and _usable(r.layers[lay][key], True)]
            if pts:
                ax.plot(*zip(*pts), style, color=color, marker="o" if style == "-" else None, ms=3,
                        lw=1.0 if style == "--" else 1.4, label=f"layer {lay}" if key != "bound" else None)
    for ax, what in ((ax_mean, "mean over heads (dashed: bound)"), (ax_max, "max over heads")):
        ax.set_yscale("log")
        ax.set(xlabel="step", ylabel="κ(J)", title=what)
        ax.grid(alpha=0.3, which="both")
    ax_mean.legend(fontsize="small", ncol=2 if len(layers) > 6 else 1)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_curves(curves: Sequence[Curve], path: str, *, ylabel: str, title: str, logy: bool = False) -> str:
    """Overlay of curves (markers on each point; a band where ``lower`` / ``upper`` are given)."""
    if not any(c.steps for c in curves):
        raise ValueError(f"nothing to plot for {title!r}: no curve has points")
    fig, (ax,) = _new_figure()
    for i, c in enumerate(curves):
        if not c.steps:
            continue
        color = f"C{i % 10}"
        ax.plot(c.steps, c.values, color=color, marker="o", ms=3, lw=1.4, label=c.label)
        if c.lower is not None and c.upper is not None:
            ax.fill_between(c.steps, c.lower, c.upper, color=color, alpha=0.2, lw=0)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, path)


def common_metric(runs: Sequence[RunSummary]) -> str | None:
    """The primary metric (``runs.primary_metric``) of the first run that every run evaluated, else ``None``."""
    for run in runs:
        metric = primary_metric(run.final_metrics, run.log_history)
        if metric and all(metric in r.final_metrics or any(metric in e for e in r.log_history) for r in runs):
            return metric
    return None


def _runs_of(items: Sequence[CurveSource]) -> list[RunSummary]:
    out = []
    for item in items:
        out += item.runs if isinstance(item, RunGroup) else [item] if isinstance(item, RunSummary) else []
    return out


def _to_curve(item: CurveSource, get, *, log: bool) -> Curve:
    if isinstance(item, Curve):
        return item
    if isinstance(item, RunGroup):
        return aggregate_curves(f"{item.label} (n={len(item.runs)})", [get(r) for r in item.runs], log=log)
    if isinstance(item, RunSummary):
        steps, values = get(item)
        return Curve(item.name, list(steps), list(values))
    raise TypeError(f"expected a Curve, RunSummary or RunGroup, got {type(item).__name__}")


def plot_eval_curves(runs: Sequence[CurveSource], path: str, metric: str | None = None) -> str:
    """Overlay of an evaluation metric vs step (default: :func:`common_metric` of the runs), one curve per run or
    group. Raises ``ValueError`` when no metric is common to the runs or nothing was evaluated."""
    metric = metric or common_metric(_runs_of(runs))
    if metric is None:
        raise ValueError("the runs have no evaluation metric in common; pass metric=")
    curves = [_to_curve(item, lambda r: r.eval_curve(metric), log=False) for item in runs]
    better = "lower" if lower_is_better(metric) else "higher"
    return plot_curves(curves, path, ylabel=metric, title=f"{metric} ({better} is better)")


def _kappa_curve(run: RunSummary) -> tuple[list[int], list[float]]:
    pts = [(r.step, r.mean) for r in run.kappa if _usable(r.mean, True)]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_kappa(runs: Sequence[CurveSource], path: str) -> str:
    """Overlay of κ(J) (mean over layers of the per-layer mean over heads, the ``kappa/mean`` log key) vs step, log
    scale. Raises ``ValueError`` when no run logged κ."""
    curves = [_to_curve(item, _kappa_curve, log=True) for item in runs]
    return plot_curves(curves, path, ylabel="κ(J), mean over layers and heads", title="attention-Jacobian κ",
                       logy=True)
