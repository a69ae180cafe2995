"""Figures of one run (``loss.png``, ``kappa.png``) and overlays of several (``hf_condinit.compare``).

Every figure is drawn on its own ``matplotlib.figure.Figure`` with the Agg canvas: nothing touches pyplot's global
state or the user's backend, and no display is needed.

Overlays take *curves*: a :class:`Curve` given directly, a ``RunSummary`` (one run), or a :class:`RunGroup` (the
seeds of one arm, drawn as their mean with a band). Bands: mean ± one standard deviation over the seeds for
evaluation metrics; for κ, which spans orders of magnitude, the geometric mean times/divided by the geometric
standard deviation (mean ± std of log10 κ). Seeds are aggregated at the steps all of them have.

κ lower bounds: a κ(J) measurement where some head hit the float64 resolution is only a lower bound
(``KappaRecord.is_lower_bound``). Such points get a hollow upward triangle (:data:`LOWER_BOUND_MARKER`) and the
legend an entry "κ is a lower bound (true value ≥ point)", in ``kappa.png`` and in the compare overlay (for a group,
a step is marked when any seed's value is a lower bound there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, Union

from .runs import KappaRecord, RunSummary, eval_curve, lower_is_better, primary_metric, train_loss_curve

__all__ = [
    "Curve",
    "RunGroup",
    "TooFewPointsError",
    "LOWER_BOUND_MARKER",
    "arm_label",
    "aggregate_curves",
    "plot_loss",
    "plot_kappa_layers",
    "kappa_layers_figure",
    "curves_figure",
    "plot_curves",
    "plot_eval_curves",
    "plot_kappa",
    "kappa_curves",
    "common_metric",
]


#: matplotlib style of a point that is only a lower bound (module docstring).
LOWER_BOUND_MARKER = {"marker": "^", "ms": 9, "mfc": "none", "mew": 1.4, "ls": "none"}
LOWER_BOUND_LABEL = "κ is a lower bound (true value ≥ point)"


@dataclass
class Curve:
    """One line of an overlay: ``values[i]`` at ``steps[i]``; ``lower`` / ``upper`` (same length) draw a band;
    ``lower_bound[i]`` (same length) marks ``values[i]`` as only a lower bound of the quantity."""

    label: str
    steps: list[float]
    values: list[float]
    lower: list[float] | None = None
    upper: list[float] | None = None
    lower_bound: list[bool] | None = None


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


class TooFewPointsError(ValueError):
    """A figure was not drawn because the run logged too few points for a curve (not an error of the run)."""


def _mark_lower_bounds(ax, points, color, labelled: bool) -> bool:
    """Draw ``points`` (``(step, value)`` pairs that are lower bounds) with :data:`LOWER_BOUND_MARKER` in ``color``;
    the first call per axis (``labelled`` False) adds the legend entry. Returns whether the entry exists now."""
    if not points:
        return labelled
    ax.plot(*zip(*points), color=color, **LOWER_BOUND_MARKER, label=None if labelled else LOWER_BOUND_LABEL)
    return True


def plot_loss(log_history: list[dict], path: str, *, final_metrics: dict | None = None,
              final_step: int | None = None, title: str | None = None) -> str:
    """Training loss (``loss`` entries) and evaluation loss (``eval_loss`` entries plus the final evaluation) vs
    optimizer step, from a ``trainer_state.json`` ``log_history``. Raises :class:`TooFewPointsError` when neither
    curve has two points (a one-dot figure says nothing; a short run with ``--logging_steps`` above its length)."""
    train = train_loss_curve(log_history)
    ev = eval_curve(log_history, "eval_loss", final_metrics, final_step)
    if len(train[0]) < 2 and len(ev[0]) < 2:
        raise TooFewPointsError(f"{len(train[0])} training and {len(ev[0])} evaluation loss(es) logged, fewer than "
                                f"two; lower --logging_steps / --eval_steps for a loss curve")
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
    """Save :func:`kappa_layers_figure` to ``path``; returns ``path``."""
    return _save(kappa_layers_figure(records, title=title), path)


def kappa_layers_figure(records: Sequence[KappaRecord], *, title: str | None = None):
    """κ(J) per layer vs step, log scale: left the mean over heads with the layer's papers' surrogate dashed (same
    colour; not an upper bound, ``hf_condinit.diagnostics.condition_number``), right the max over heads; a value
    that is only a lower bound is marked (module docstring). Raises ``ValueError`` when no record has a finite
    positive κ."""
    layers = sorted({lay for r in records for lay in r.layers})
    if not any(_usable(r.layers[lay][k], True) for r in records for lay in r.layers for k in ("mean", "max")):
        raise ValueError("no finite positive κ in the records")
    fig, (ax_mean, ax_max) = _new_figure(ncols=2, width=5.2)
    labelled = {ax_mean: False, ax_max: False}
    for i, lay in enumerate(layers):
        color = f"C{i % 10}"
        for ax, key, style in ((ax_mean, "mean", "-"), (ax_max, "max", "-"), (ax_mean, "bound", "--")):
            pts = [(r.step, r.layers[lay][key]) for r in records if lay in r.layers and _usable(r.layers[lay][key], True)]
            if pts:
                ax.plot(*zip(*pts), style, color=color, marker="o" if style == "-" else None, ms=3,
                        lw=1.0 if style == "--" else 1.4, label=f"layer {lay}" if key != "bound" else None)
            if key != "bound":
                bounded = [(r.step, r.layers[lay][key]) for r in records if r.layer_is_lower_bound(lay)
                           and _usable(r.layers[lay][key], True)]
                labelled[ax] = _mark_lower_bounds(ax, bounded, color, labelled[ax])
    if labelled[ax_max]:
        ax_max.legend(fontsize="small")
    for ax, what in ((ax_mean, "mean over heads (dashed: surrogate, not a bound)"), (ax_max, "max over heads")):
        ax.set_yscale("log")
        ax.set(xlabel="step", ylabel="κ(J)", title=what)
        ax.grid(alpha=0.3, which="both")
    ax_mean.legend(fontsize="small", ncol=2 if len(layers) > 6 else 1)
    if title:
        fig.suptitle(title)
    return fig


def plot_curves(curves: Sequence[Curve], path: str, *, ylabel: str, title: str, logy: bool = False,
                xlabel: str = "step") -> str:
    """Save :func:`curves_figure` to ``path``; returns ``path``."""
    return _save(curves_figure(curves, ylabel=ylabel, title=title, logy=logy, xlabel=xlabel), path)


def curves_figure(curves: Sequence[Curve], *, ylabel: str, title: str, logy: bool = False, xlabel: str = "step"):
    """Overlay of curves (markers on each point; a band where ``lower`` / ``upper`` are given; lower bounds marked
    where ``lower_bound`` says so); ``Curve.steps`` are drawn on the x axis named ``xlabel``."""
    if not any(c.steps for c in curves):
        raise ValueError(f"nothing to plot for {title!r}: no curve has points")
    fig, (ax,) = _new_figure()
    labelled = False
    for i, c in enumerate(curves):
        if not c.steps:
            continue
        color = f"C{i % 10}"
        ax.plot(c.steps, c.values, color=color, marker="o", ms=3, lw=1.4, label=c.label)
        if c.lower is not None and c.upper is not None:
            ax.fill_between(c.steps, c.lower, c.upper, color=color, alpha=0.2, lw=0)
        if c.lower_bound is not None:
            bounded = [(s, v) for s, v, b in zip(c.steps, c.values, c.lower_bound) if b]
            labelled = _mark_lower_bounds(ax, bounded, color, labelled)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return fig


def common_metric(runs: Sequence[RunSummary]) -> str | None:
    """The primary metric (``runs.primary_metric``) of the first run that every run evaluated, else ``None``."""
    for run in runs:
        metric = primary_metric(run.final_metrics, run.log_history)
        if metric and all(metric in r.final_metrics or any(metric in e for e in r.log_history) for r in runs):
            return metric
    return None


def _runs_of(items: Sequence[CurveSource]) -> list[RunSummary]:
    """The runs behind ``items`` (a group's runs; a given :class:`Curve` has none)."""
    out = []
    for item in items:
        if isinstance(item, RunGroup):
            out += item.runs
        elif isinstance(item, RunSummary):
            out.append(item)
    return out


def arm_label(run: RunSummary) -> str:
    """A run's legend label: its folder name and its recipe (``"B: conditioned (seed 0)"``)."""
    return f"{run.name}: {run.recipe}" if run.recipe else run.name


def _group_label(group: RunGroup) -> str:
    """A group's legend label: its label, seed count and the recipe of its runs without the seed."""
    from .runs import recipe_summary

    label = f"{group.label} (n={len(group.runs)})"
    if group.runs:
        first = group.runs[0]
        label += ": " + recipe_summary({k: v for k, v in first.condinit.items() if k != "seed"}, first.attention)
    return label


def _to_curve(item: CurveSource, get, *, log: bool, flags=None) -> Curve:
    """``item`` as a :class:`Curve`: ``get(run)`` gives a run's ``(steps, values)``; ``flags(run)`` (optional) the
    steps at which its value is only a lower bound."""
    if isinstance(item, Curve):
        return item
    if isinstance(item, RunGroup):
        curve = aggregate_curves(_group_label(item), [get(r) for r in item.runs], log=log)
        bounded = set().union(*(flags(r) for r in item.runs)) if flags and item.runs else set()
    elif isinstance(item, RunSummary):
        steps, values = get(item)
        curve = Curve(arm_label(item), list(steps), list(values))
        bounded = flags(item) if flags else set()
    else:
        raise TypeError(f"expected a Curve, RunSummary or RunGroup, got {type(item).__name__}")
    if flags:
        curve.lower_bound = [s in bounded for s in curve.steps]
    return curve


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


def _kappa_lower_bound_steps(run: RunSummary) -> set[int]:
    return {r.step for r in run.kappa if r.is_lower_bound}


def kappa_curves(runs: Sequence[CurveSource]) -> list[Curve]:
    """The curves of :func:`plot_kappa`: one per run or group, labelled with folder and recipe, lower bounds
    flagged (``Curve.lower_bound``)."""
    return [_to_curve(item, _kappa_curve, log=True, flags=_kappa_lower_bound_steps) for item in runs]


def plot_kappa(runs: Sequence[CurveSource], path: str) -> str:
    """Overlay of κ(J) (mean over layers of the per-layer mean over heads, the ``kappa/mean`` log key) vs step, log
    scale; lower bounds marked (module docstring). Raises ``ValueError`` when no run logged κ."""
    return plot_curves(kappa_curves(runs), path, ylabel="κ(J), mean over layers and heads", title="attention-Jacobian κ",
                       logy=True)
