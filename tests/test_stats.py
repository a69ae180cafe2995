"""The verdict rule lives in the library (hf_condinit.stats); the benchmarks' reports use it (no copy), and the
library alone, on the committed records, gives the intervals and verdicts README.md states.
(The rule itself against scipy and hand examples: tests/test_verdict.py; every generated block: test_findings.py.)"""

import glob
import json
import os
import sys

import pytest

pytest.importorskip("scipy")
from hf_condinit import stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _common as C  # noqa: E402

DEPTH = os.path.join(ROOT, "benchmarks", "results", "depth", "runs")


def test_benchmarks_use_the_library_rule():
    assert C.crossing_step is stats.crossing_step
    assert C.flat_sentence.func is stats.flat_sentence and C.family_caption.func is stats.family_caption
    assert C.RULE_CITED in C.family_caption("x", 2) and "hf_condinit.stats" in stats.family_caption("x", 2)
    for path in glob.glob(os.path.join(ROOT, "benchmarks", "*.py")):  # no module of their own for the rule
        with open(path, encoding="utf-8") as f:
            assert "import _verdict" not in f.read(), path


def _side(setting, arm):
    """seed -> one side of a pair: the final loss on WikiText-2 valid of a committed depth-sweep record."""
    out = {}
    for path in glob.glob(os.path.join(DEPTH, setting, arm, "seed*.json")):
        with open(path) as f:
            rec = json.load(f)
        out[rec["seed"]] = stats.entry(rec, rec["eval_files"]["wiki.valid.raw"]["loss"])
    return out


def test_readme_depth_8_numbers_from_the_records_with_the_library_alone():
    """README: depth 8, each arm at its own rate of the depth-8 grid (1e-2 for all), against default there, 5 seeds.
    Conditioned pairs with default's own runs (both: seeds 0-2 on the H200, 3-4 on the CPU); mimetic ran on the CPU
    only, so the library pairs it with default's own runs at seeds 3-4 alone (the devices differ at 0-2) and at every
    seed once default's CPU re-runs of seeds 0-2 (``default@cpu``, the device-matched baseline) are offered too.
    docs/results.md keeps the depth-4 grid's rates: conditioned at 1e-2 against default at 3e-3, -0.132 [-0.150, -0.115]."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        results = " ".join(f.read().split())
    cond = _side("8x64_tpp20_lr0.01", "conditioned")
    default = _side("8x64_tpp20_lr0.01", "default")
    same = stats.judge({"conditioned": stats.paired(cond, default)})["conditioned"]
    assert same["n"] == 5 and f"depth 8 {stats.fmt(same).replace(' no', '')}, n = 5, no" in readme
    old = stats.interval(stats.paired(cond, _side("8x64_tpp20_lr0.003", "default")).values())
    assert old["n"] == 5 and f"{old['mean']:+.3f} [{old['lo']:+.3f}, {old['hi']:+.3f}]".replace("-", "−") in results
    mimetic = _side("8x64_tpp20_lr0.01", "mimetic")
    assert sorted(stats.paired(mimetic, default)) == [3, 4]
    matched = {**default, **_side("8x64_tpp20_lr0.01", "default@cpu")}
    assert {e["device"] for e in matched.values()} == {"cpu"}
    gap = stats.interval(stats.paired(mimetic, matched).values())
    assert gap["n"] == 5 and f"mimetic {gap['mean']:+.3f} [{gap['lo']:+.3f}, {gap['hi']:+.3f}], n = 5" in readme
