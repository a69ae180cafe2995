"""The one rule for "better" / "worse" than a baseline: every verdict of the project comes from here
(``python -m hf_condinit.study``, ``python -m hf_condinit.compare`` and ``benchmarks/``).

A *cell* is one comparison (an arm against the baseline in one setting). Its values are the **paired differences by
seed**, arm − baseline, over the seeds both ran on the same batches and the same device (:func:`paired`: a pair whose
records name different devices or different training-batch digests is not formed). Per cell (:func:`interval`): n
pairs, mean, sample std, the 95 % Student-t interval ``mean ± t_{0.975, n−1} · sd / √n`` and the two-sided
one-sample t-test p-value of "mean = 0" (``scipy.stats.ttest_1samp``'s statistic). A *family* is the cells of one
report table with n ≥ 2 (each table's caption says which: a study's arms, one benchmark table); :func:`judge` adjusts
their p-values with Holm's step-down method and says

- ``"better"`` / ``"worse"`` when the Holm-adjusted p < 0.05 — equivalently, the cell's interval at the Holm level
  (the k-th smallest p tested at 0.05 / (m − k + 1), in order, stopping at the first that fails) excludes zero; the
  direction is the sign of the mean and whether lower is better (loss) or higher (accuracy);
- ``"no"`` otherwise; ``"n/a (1 seed)"`` with fewer than 2 pairs (no spread is known; not in the family).

The per-seed differences stay in the results (``diffs``), so a reader can apply another rule.

The regime word "near convergence" has its rule here too (:func:`flat_curve`): a cell's eval curve is *flat* when
the loss change over the last third of the run (least-squares slope of the eval-curve points at steps ≥ 2/3 of the
run, times a third of the run; mean over seeds) is no larger in size than the seed spread of the final eval-curve
loss (sample std over seeds). Only a flat cell may be called near convergence.

"Steps to reach" the baseline's final value is :func:`crossing_step`: the first step at which an eval curve is at
least as good as the target, linearly interpolated between the two evaluations around the crossing.

**Power** of the same test (:func:`power`, :func:`detectable_effect`, :func:`seeds_needed`): the probability that
the two-sided paired t-test at level ``alpha`` rejects "mean = 0" when the true mean difference is ``effect`` and
the paired differences' standard deviation is ``sd``, from the noncentral t distribution (n − 1 dof, noncentrality
``effect · √n / sd``). A report gives, per comparison, the smallest effect its n detects with probability
:data:`POWER` (80 %) and the pairs needed to detect a stated effect, both from the observed paired sd.

The text helpers (:func:`flat_sentence`, :func:`fmt`, :func:`family_caption`) name the rule by ``source``, the
module a report cites for it (``benchmarks/_verdict.py`` re-exports this module under its own name).
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Optional

__all__ = ["ALPHA", "LEVEL", "NA", "POWER", "SOURCE", "crossing_step", "detectable_effect", "entry",
           "family_caption", "flat_curve", "flat_sentence", "fmt", "holm", "interval", "judge", "mean_std", "paired",
           "power", "seeds_needed"]

ALPHA = 0.05
LEVEL = 0.95
#: The power a report's detectable effect and seeds needed are computed for.
POWER = 0.8
NA = "n/a (1 seed)"
#: How reports cite this rule unless told otherwise.
SOURCE = "hf_condinit.stats"


def paired(arm: dict, default: dict) -> dict:
    """seed -> arm value − baseline value over the seeds both have, on the same device and batches.

    ``arm`` / ``default``: seed -> ``{"value": float | None, "device": str | None, "batches": str | None}`` (a
    missing or None ``device`` / ``batches`` is not checked; a None or non-finite value drops the seed)."""
    out = {}
    for s in sorted(set(arm) & set(default)):
        a, d = arm[s], default[s]
        if a.get("value") is None or d.get("value") is None:
            continue
        if not (math.isfinite(a["value"]) and math.isfinite(d["value"])):
            continue
        if a.get("device") and d.get("device") and a["device"] != d["device"]:
            continue
        if a.get("batches") and d.get("batches") and a["batches"] != d["batches"]:
            continue
        out[s] = a["value"] - d["value"]
    return out


def entry(rec: dict, value: Optional[float]) -> dict:
    """One side of a pair for :func:`paired`: ``value`` of the run record ``rec`` with its device and the digest of
    its training batches (``train_batches_sha256``; records without one are not checked on it)."""
    return dict(value=value, device=rec.get("device"), batches=rec.get("train_batches_sha256"))


def interval(diffs: Iterable[float], level: float = LEVEL) -> dict:
    """``n``, ``mean``, ``sd`` (sample, n − 1), ``lo`` / ``hi`` (Student-t interval, n − 1 dof) and ``p`` (two-sided
    one-sample t-test of mean 0) of the paired differences; with n < 2 only ``n`` and ``mean`` (others None). A
    zero spread gives p = 0 (mean ≠ 0) or 1 (mean = 0) and a zero-width interval."""
    from scipy import stats

    xs = [float(x) for x in diffs]
    n = len(xs)
    out = dict(n=n, mean=statistics.fmean(xs) if xs else None, sd=None, lo=None, hi=None, p=None, level=level)
    if n < 2:
        return out
    sd = statistics.stdev(xs)
    se = sd / math.sqrt(n)
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    if se == 0:
        p = 0.0 if out["mean"] != 0 else 1.0
    else:
        p = float(2 * stats.t.sf(abs(out["mean"]) / se, n - 1))
    out.update(sd=sd, lo=out["mean"] - t * se, hi=out["mean"] + t * se, p=p)
    return out


def mean_std(values: Iterable) -> tuple[float | None, float | None]:
    """The "mean ± std over seeds" of a report table: mean and sample std (0 for one value) of the finite values
    (None and non-finite ones dropped: a diverged seed shows as missing, not as an infinite mean); ``(None, None)``
    when none is left. Describes the seeds; the verdict is :func:`interval`'s."""
    xs = [x for x in values if x is not None and math.isfinite(x)]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the k-th (from 0) becomes
    ``max_{j ≤ k} min(1, (m − j) p_(j))``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adj = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * pvalues[i]))
        adj[i] = running
    return adj


def judge(cells: dict, higher_is_better=False, alpha: float = ALPHA) -> dict:
    """The verdict of every cell of one family. ``cells``: key -> paired differences (arm − baseline; a list or a
    seed -> value dict); ``higher_is_better``: one bool for every cell, or key -> bool (e.g. loss and accuracy
    cells of one table). Returns key -> :func:`interval` plus ``diffs`` (seed -> Δ when a dict was given, else the
    list), ``p_holm`` (None outside the family), ``family_size`` and ``verdict`` ("better", "worse", "no",
    ``NA``)."""
    out = {}
    for key, d in cells.items():
        vals = list(d.values()) if isinstance(d, dict) else list(d)
        out[key] = dict(interval(vals), diffs=d)
    family = [k for k, v in out.items() if v["n"] >= 2]
    adj = holm([out[k]["p"] for k in family])
    for k, v in out.items():
        v["family_size"] = len(family)
        v["p_holm"] = None
        v["verdict"] = NA
    for k, p in zip(family, adj):
        v = out[k]
        v["p_holm"] = p
        if p < alpha:
            hib = higher_is_better.get(k, False) if isinstance(higher_is_better, dict) else higher_is_better
            good = v["mean"] > 0 if hib else v["mean"] < 0
            v["verdict"] = "better" if good else "worse"
        else:
            v["verdict"] = "no"
    return out


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """The power of the two-sided paired t-test at level ``alpha`` with ``n`` ≥ 2 pairs (module docstring): the
    probability that ``|T| > t_{1 − alpha/2, n − 1}`` for ``T`` noncentral t with n − 1 dof and noncentrality
    ``|effect| · √n / sd``; ``sd`` > 0."""
    from scipy import stats

    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(effect) * math.sqrt(n) / sd
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    # far in the tails scipy's series may give NaN: there the upper tail is 1 and the lower one 0
    return (upper if math.isfinite(upper) else 1.0) + (lower if math.isfinite(lower) else 0.0)


def detectable_effect(sd: float, n: int, alpha: float = ALPHA, target: float = POWER) -> float | None:
    """The smallest mean difference (in the metric's units, > 0) the paired t-test with ``n`` pairs detects with
    probability ``target`` at level ``alpha`` when the paired sd is ``sd``; 0 for a zero sd, None for n < 2."""
    from scipy import optimize

    if n < 2 or sd is None:
        return None
    if sd == 0:
        return 0.0
    hi = 1.0
    while power(hi, 1.0, n, alpha) < target:
        hi *= 2
    return sd * float(optimize.brentq(lambda d: power(d, 1.0, n, alpha) - target, 0.0, hi, xtol=1e-12, rtol=1e-12))


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, target: float = POWER) -> int | None:
    """The fewest pairs n ≥ 2 whose paired t-test detects a mean difference ``effect`` with probability ``target``
    at level ``alpha`` when the paired sd is ``sd`` (2 for a zero sd); None when ``effect`` is 0 or ``sd`` unknown."""
    if sd is None or not effect:
        return None
    if sd == 0:
        return 2
    hi = 2
    while power(effect, sd, hi, alpha) < target:
        hi *= 2
    lo = max(2, hi // 2)
    while lo < hi:  # the power grows with n: the first n that reaches the target
        mid = (lo + hi) // 2
        if power(effect, sd, mid, alpha) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def flat_curve(curves: Iterable, steps: int) -> dict:
    """The flatness rule of the module docstring. ``curves``: one ``[[step, loss], ...]`` eval curve per seed of
    one cell; ``steps``: the run length. Returns ``n`` (seeds with ≥ 2 points in the last third), ``drop`` (mean
    loss change over the last third; negative = still falling), ``spread`` (std over seeds of the last point) and
    ``flat`` (bool; None with fewer than 2 seeds)."""
    changes, finals = [], []
    for curve in curves:
        pts = [(float(s), float(v)) for s, v in curve if s >= 2 * steps / 3 and math.isfinite(v)]
        if len(pts) < 2:
            continue
        sb, vb = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
        sxx = sum((p[0] - sb) ** 2 for p in pts)
        changes.append(sum((p[0] - sb) * (p[1] - vb) for p in pts) / sxx * steps / 3)
        finals.append(pts[-1][1])
    out = dict(n=len(changes), drop=statistics.fmean(changes) if changes else None, spread=None, flat=None)
    if len(changes) >= 2:
        out["spread"] = statistics.stdev(finals)
        out["flat"] = abs(out["drop"]) <= out["spread"]
    return out


def crossing_step(curve, target: float, lower_better: bool = True) -> float | None:
    """First step at which a curve of ``(step, value)`` pairs reaches ``target`` (``<=`` when lower is better, else
    ``>=``), linearly interpolated between the two points around the crossing; None if never."""
    prev = None
    for step, value in curve:
        if (value <= target) if lower_better else (value >= target):
            if prev is None or prev[1] == value:
                return float(step)
            s0, v0 = prev
            return s0 + (target - v0) / (value - v0) * (step - s0)
        prev = (step, value)
    return None


def flat_sentence(f: Optional[dict], who: str = "default", source: str = SOURCE) -> str:
    """One sentence on a :func:`flat_curve` result for a report, citing the rule as ``source``."""
    if not f or f["flat"] is None:
        return f"Eval curve of {who}: flatness not known (fewer than 2 seeds)."
    word = (f"flat by the rule of {source} flat_curve — necessary for 'near convergence', not sufficient: the "
            "cosine schedule's decay flattens the end of every run" if f["flat"]
            else f"not flat: still improving, so not near convergence (rule: {source} flat_curve)")
    return (f"Eval curve of {who}: loss changed by {f['drop']:+.3f} over the last third of the run against a seed "
            f"spread of {f['spread']:.3f} ({word}).")


def fmt(v: Optional[dict], nd: int = 3, scale: float = 1.0) -> str:
    """A verdict record as table text: ``mean [lo, hi] verdict`` (n ≥ 2), ``mean (1 seed)`` or "–". ``scale``
    multiplies the numbers (100 for accuracy points)."""
    if not v or v.get("n", 0) == 0:
        return "–"
    m = scale * v["mean"]
    if v["n"] < 2:
        return f"{m:+.{nd}f} ({NA})"
    return f"{m:+.{nd}f} [{scale * v['lo']:+.{nd}f}, {scale * v['hi']:+.{nd}f}] {v['verdict']}"


def family_caption(what: str, v: int, source: str = SOURCE) -> str:
    """The caption sentence naming a table's family (``v``: its cells with n ≥ 2), citing the rule as ``source``."""
    return (f"Verdict rule ({source}): paired Δ by seed (same batches, same device), mean [95 % Student-t interval, "
            f"n − 1 dof]; *better* / *worse* when the Holm-adjusted two-sided t-test p < 0.05 over the family of "
            f"{what} ({v} cells with ≥ 2 seeds); *no* otherwise; {NA} with one seed.")
