"""How sure an accuracy is: the binomial (Wilson score) interval of a count of right items, and where it stands
against chance.

Method: the **Wilson score interval** (Wilson 1927; no continuity correction; the same as
``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``), at 95 % by default. Chosen over the exact
Clopper-Pearson interval because its coverage stays close to the nominal level on average instead of above it (Brown,
Cai & DasGupta 2001); at the sizes used here (300 pairs per BLiMP paradigm and more) the two differ by well under a
point. Every item counts as one independent Bernoulli trial: items generated from one template (BLiMP's paradigms)
are correlated, so the interval is a lower bound on the real uncertainty, not an upper one.

"At chance": the interval contains the chance level (0.5 for a minimal pair, 1/k for a choice among k). A flag per
paradigm is not corrected for the number of paradigms: a model with no grammar at all still shows about 1 in 20 of
BLiMP's 67 paradigms off chance.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["INTERVAL", "LEVEL", "accuracy_stats", "vs_chance", "wilson_interval"]

LEVEL = 0.95
INTERVAL = "wilson 95%"  # what records say about their ``ci95`` entries


def wilson_interval(correct: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` (both in [0, 1]) of a binomial proportion ``correct / n`` at confidence
    ``level``: ``(p + z²/2n ± z √(p(1−p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = correct / n`` and ``z`` the normal
    quantile of ``(1 + level) / 2``. Raises ``ValueError`` for ``n < 1`` or ``correct`` outside ``[0, n]``."""
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"a binomial interval needs 0 <= correct <= n and n >= 1, got correct={correct}, n={n}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = correct / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def vs_chance(low: float, high: float, chance: float) -> str:
    """``"above"``, ``"at"`` (the interval ``[low, high]`` contains ``chance``) or ``"below"`` chance."""
    return "above" if low > chance else "below" if high < chance else "at"


def accuracy_stats(correct: int, n: int, chance: float) -> dict:
    """One accuracy with its interval: ``{"n", "correct", "accuracy", "ci95": [low, high], "chance", "vs_chance",
    "at_chance"}`` (:func:`wilson_interval` at :data:`LEVEL`; ``at_chance``: the interval contains ``chance``)."""
    low, high = wilson_interval(correct, n)
    where = vs_chance(low, high, chance)
    return {"n": n, "correct": correct, "accuracy": correct / n, "ci95": [low, high], "chance": chance,
            "vs_chance": where, "at_chance": where == "at"}
