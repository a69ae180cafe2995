"""The verdict rule (hf_condinit.stats) against scipy.stats and a hand-made Holm example."""

import math
import statistics

import pytest

stats = pytest.importorskip("scipy.stats")
from hf_condinit import stats as V  # noqa: E402


def test_interval_matches_scipy():
    xs = [-0.071, -0.052, -0.094, -0.060]
    v = V.interval(xs)
    n, m, sd = len(xs), statistics.fmean(xs), statistics.stdev(xs)
    t = stats.t.ppf(0.975, n - 1)
    assert v["n"] == 4 and v["mean"] == pytest.approx(m)
    assert v["lo"] == pytest.approx(m - t * sd / math.sqrt(n)) and v["hi"] == pytest.approx(m + t * sd / math.sqrt(n))
    assert v["p"] == pytest.approx(stats.ttest_1samp(xs, 0.0).pvalue, rel=1e-10)
    lo, hi = stats.t.interval(0.95, n - 1, loc=m, scale=stats.sem(xs))
    assert (v["lo"], v["hi"]) == pytest.approx((lo, hi))


def test_one_seed_and_zero_spread():
    assert V.judge({"a": [0.3]})["a"]["verdict"] == V.NA
    v = V.judge({"a": [0.2, 0.2], "b": [0.0, 0.0]})
    assert v["a"]["p"] == 0.0 and v["a"]["verdict"] == "worse"
    assert v["b"]["p"] == 1.0 and v["b"]["verdict"] == "no"


def test_holm_hand_example():
    # m = 4, sorted p 0.01, 0.02, 0.03, 0.04 -> 4*0.01, max(0.04, 3*0.02), max(.06, 2*.03), max(.06, .04)
    assert V.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert V.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert V.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 × 0.8 capped at 1, then monotone
    assert V.holm([0.04, 0.3]) == pytest.approx([0.08, 0.3])


def test_holm_changes_a_verdict():
    # alone: p ≈ 0.022 (better); in a family of 3 its Holm p ≈ 0.066 (no)
    d = [-0.12, -0.10, -0.07]
    p = V.interval(d)["p"]
    alone = V.judge({"x": d})["x"]
    fam = V.judge({"x": d, "y": [0.1, -0.1, 0.05], "z": [0.2, -0.3, 0.1]})["x"]
    assert alone["p_holm"] == pytest.approx(p) and fam["p_holm"] == pytest.approx(min(1.0, 3 * p))
    assert p < 0.05 < 3 * p
    assert alone["verdict"] == "better" and fam["verdict"] == "no"


def test_direction_for_accuracy():
    v = V.judge({"acc": [0.02, 0.03, 0.025]}, higher_is_better=True)["acc"]
    assert v["verdict"] == "better"
    assert V.judge({"acc": [0.02, 0.03, 0.025]})["acc"]["verdict"] == "worse"


def _old_rule(gaps, arm, default):
    """The rule this replaces: |mean paired Δ| > 2 × pooled unpaired seed std, every seed one sign."""
    spread = math.sqrt((statistics.stdev(arm) ** 2 + statistics.stdev(default) ** 2) / 2)
    return abs(statistics.fmean(gaps)) > 2 * spread and (all(g < 0 for g in gaps) or all(g > 0 for g in gaps))


def test_pairing_matters():
    """Seeds differ a lot between themselves, the arm is lower by about the same amount on each: the unpaired
    spread hides it, the paired interval does not (the shape of conditioned at 5 tokens/param)."""
    default = {0: 6.722, 1: 6.663, 2: 6.778}
    arm = {0: 6.642, 1: 6.610, 2: 6.692}
    d = V.paired({s: {"value": v} for s, v in arm.items()}, {s: {"value": v} for s, v in default.items()})
    assert not _old_rule(list(d.values()), list(arm.values()), list(default.values()))
    v = V.judge({"cell": d})["cell"]
    assert v["verdict"] == "better" and v["hi"] < 0
    # the same values unpaired (Welch) do not separate the arms
    assert stats.ttest_ind(list(arm.values()), list(default.values()), equal_var=False).pvalue > 0.05


def test_pairs_never_cross_devices_or_batches():
    arm = {0: {"value": 1.0, "device": "cpu", "batches": "a"}, 1: {"value": 2.0, "device": "cuda: X", "batches": "b"},
           2: {"value": 3.0, "device": "cpu", "batches": "c"}, 3: {"value": None}}
    default = {0: {"value": 0.5, "device": "cpu", "batches": "a"}, 1: {"value": 1.0, "device": "cpu", "batches": "b"},
               2: {"value": 2.0, "device": "cpu", "batches": "other"}, 3: {"value": 1.0}}
    assert V.paired(arm, default) == {0: 0.5}


def test_fmt():
    v = V.judge({"a": [-0.1, -0.12, -0.08]})["a"]
    assert V.fmt(v).endswith("better") and V.fmt(v).startswith("-0.100 [")
    assert V.fmt(V.judge({"a": [0.1]})["a"]) == "+0.100 (n/a (1 seed))"
