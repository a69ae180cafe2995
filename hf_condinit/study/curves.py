"""What a study's eval curves say beyond the final value: how soon each arm reaches the baseline's final value
(paired by seed), whether training reached a plateau, and the curves themselves (mean and 95 % interval per arm).

Inputs are the report's arms (:class:`hf_condinit.compare.Arm`, ``arms[0]`` the baseline), each with its verdict
seeds' runs at its rate; a run's curve is :meth:`hf_condinit.reporting.runs.RunSummary.eval_curve` of the metric
(every evaluation logged in ``trainer_state.json`` plus the final one at the last step). "Better" follows the
metric (:func:`hf_condinit.reporting.runs.lower_is_better`).

- **Steps to the baseline's final value** (:func:`reach_rows`): for seed ``s`` the target is the baseline's final
  value at seed ``s``; each arm's run of seed ``s`` reaches it at :func:`hf_condinit.stats.crossing_step` (the first
  evaluation at least as good, linearly interpolated from the one before). The baseline reaches its own target by
  its last step (earlier when its curve was there before). A run that never reaches it is **censored**: it counts
  at its last step, which is less than the truth, so the difference leans towards that arm; each row says how many
  seeds were censored on each side. Every pair of arms (a later arm against each earlier one, in the plan's order)
  is one row: the paired difference by seed (arm − other, fewer steps is better), its 95 % Student-t interval and
  Holm's verdict over the table's rows (:func:`hf_condinit.stats.judge`). Epochs are steps ÷ the steps per epoch
  (``global_step / epoch`` of ``trainer_state.json``), given when every run has the same.
- **Plateau** (:func:`plateau_rows`): per arm, each seed's gain over the last fifth of training: the final value
  minus the curve's value at 80 % of the run's steps (interpolated between evaluations), signed so that a gain is an
  improvement; the arm is on a plateau when the mean gain over its seeds is under ``threshold`` (in the metric's
  units: 0.005 is half a point of an accuracy in [0, 1]). Unknown (None) without an evaluation at or before the
  last fifth.
- **Figure** (:func:`plot_curves_with_intervals`): each arm's mean over seeds at the evaluations every seed has,
  with the 95 % Student-t interval of that mean (none with one seed), against epochs (steps when the runs differ in
  steps per epoch), and the baseline's mean final value as a dashed line.
"""

from __future__ import annotations

import json
import math
import os

from .. import stats
from ..compare import Arm, training_facts
from ..reporting.plots import Curve, curves_figure
from ..reporting.runs import RunSummary, lower_is_better

__all__ = ["DEFAULT_PLATEAU", "plateau_rows", "plot_curves_with_intervals", "reach_rows", "steps_per_epoch"]

#: The plateau threshold when the plan gives none: half a point of an accuracy in [0, 1].
DEFAULT_PLATEAU = 0.005

#: The fraction of training the plateau rule looks at: the last fifth.
LAST_PART = 0.2


def _final(run: RunSummary, metric: str) -> float | None:
    steps, values = run.eval_curve(metric)
    return values[-1] if values else None


def _last_step(run: RunSummary, metric: str) -> float | None:
    steps, _ = run.eval_curve(metric)
    return float(run.global_step) if run.global_step else (float(steps[-1]) if steps else None)


def _run_steps_per_epoch(run: RunSummary) -> float | None:
    path = os.path.join(run.path, "trainer_state.json")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    epoch, step = state.get("epoch"), state.get("global_step")
    return step / epoch if epoch and step else None


def steps_per_epoch(arms: list[Arm]) -> float | None:
    """The steps per epoch every run of ``arms`` shares (``global_step / epoch``), None when they differ or one
    does not say."""
    found = [_run_steps_per_epoch(r) for a in arms for r in a.runs.values()]
    if not found or any(x is None for x in found):
        return None
    return found[0] if all(math.isclose(x, found[0], rel_tol=1e-9) for x in found) else None


def _interpolate(curve: list[tuple[float, float]], at: float) -> float | None:
    """The curve's value at step ``at``, linear between its points; None outside them."""
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
        if s0 <= at <= s1:
            return v0 if s1 == s0 else v0 + (at - s0) / (s1 - s0) * (v1 - v0)
    return curve[0][1] if curve and curve[0][0] == at else None


def reach_rows(arms: list[Arm], metric: str) -> dict | None:
    """The steps-to-the-baseline's-final table (module docstring), or None when the baseline or every other arm
    has no runs. Returns ``target`` (seed -> the baseline's final value), ``steps_per_epoch``, ``arms`` (label ->
    seed -> ``{"steps", "censored"}``) and ``rows``: per pair ``arm``, ``against``, ``verdict`` (of the step
    differences, Holm over the rows), ``censored`` (``[arm's, against's]`` censored seeds among the pairs)."""
    base = arms[0]
    done = [a for a in arms if a.runs]
    if not base.runs or len(done) < 2:
        return None
    lower = lower_is_better(metric)
    target = {s: v for s, r in base.runs.items() if (v := _final(r, metric)) is not None}
    reach: dict = {}
    for a in done:
        reach[a.label] = {}
        for seed, run in a.runs.items():
            if seed not in target:
                continue
            steps, values = run.eval_curve(metric)
            crossed = stats.crossing_step(list(zip(steps, values)), target[seed], lower)
            reach[a.label][seed] = dict(steps=crossed if crossed is not None else _last_step(run, metric),
                                        censored=crossed is None)

    def side(a: Arm) -> dict:
        out = {}
        for seed, r in reach[a.label].items():
            facts = training_facts(a.runs[seed])
            out[seed] = dict(value=r["steps"], device=facts["device"], batches=facts["data"])
        return out

    pairs = [(done[j], done[i]) for j in range(1, len(done)) for i in range(j)]
    diffs = {k: stats.paired(side(a), side(b)) for k, (a, b) in enumerate(pairs)}
    verdicts = stats.judge(diffs, higher_is_better=False)
    rows = []
    for k, (a, b) in enumerate(pairs):
        seeds = sorted(diffs[k])
        rows.append(dict(arm=a.label, against=b.label, verdict=verdicts[k],
                         censored=[sum(reach[x.label][s]["censored"] for s in seeds) for x in (a, b)]))
    return dict(target={str(s): v for s, v in sorted(target.items())}, steps_per_epoch=steps_per_epoch(done),
                arms={label: {str(s): r for s, r in sorted(by_seed.items())} for label, by_seed in reach.items()},
                rows=rows)


def plateau_rows(arms: list[Arm], metric: str, threshold: float) -> list[dict]:
    """Per arm with runs: ``arm``, ``gains`` (seed -> the gain over the last fifth, None when unknown), ``mean``
    (of the known gains), ``met`` (mean gain < ``threshold``; None when no gain is known) and ``threshold``."""
    sign = -1.0 if lower_is_better(metric) else 1.0
    rows = []
    for a in arms:
        if not a.runs:
            continue
        gains = {}
        for seed, run in sorted(a.runs.items()):
            steps, values = run.eval_curve(metric)
            curve = [(float(s), float(v)) for s, v in zip(steps, values)]
            last = _last_step(run, metric)
            start = _interpolate(curve, (1 - LAST_PART) * last) if curve and last else None
            gains[str(seed)] = None if start is None else sign * (curve[-1][1] - start)
        known = [g for g in gains.values() if g is not None]
        mean = sum(known) / len(known) if known else None
        rows.append(dict(arm=a.label, gains=gains, mean=mean, met=None if mean is None else mean < threshold,
                         threshold=threshold))
    return rows


def _mean_interval(label: str, curves: list[tuple[list, list]], scale: float) -> Curve:
    common = sorted(set.intersection(*(set(s) for s, _ in curves)))
    lookup = [dict(zip(s, v)) for s, v in curves]
    xs, mean, lo, hi = [], [], [], []
    for step in common:
        iv = stats.interval([d[step] for d in lookup])
        xs.append(step / scale)
        mean.append(iv["mean"])
        lo.append(iv["lo"] if iv["lo"] is not None else iv["mean"])
        hi.append(iv["hi"] if iv["hi"] is not None else iv["mean"])
    band = len(curves) > 1
    return Curve(f"{label} (n={len(curves)})", xs, mean, lo if band else None, hi if band else None)


def plot_curves_with_intervals(arms: list[Arm], metric: str, path: str) -> str:
    """The figure of the module docstring, saved to ``path``; returns ``path``."""
    done = [a for a in arms if a.runs]
    per_epoch = steps_per_epoch(done)
    curves = [_mean_interval(a.label, [a.runs[s].eval_curve(metric) for s in sorted(a.runs)], per_epoch or 1.0)
              for a in done]
    better = "lower" if lower_is_better(metric) else "higher"
    fig = curves_figure(curves, ylabel=metric, xlabel="epoch" if per_epoch else "step",
                        title=f"{metric} ({better} is better): mean and 95 % interval over seeds")
    finals = [v for r in arms[0].runs.values() if (v := _final(r, metric)) is not None]
    if finals:
        fig.axes[0].axhline(sum(finals) / len(finals), color="C0", ls="--", lw=1,
                            label=f"{arms[0].label}'s mean final")
        fig.axes[0].legend()
    fig.savefig(path, dpi=110)
    return path
