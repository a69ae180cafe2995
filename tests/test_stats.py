"""Issue 35 item 2: the verdict rule lives in the library (hf_condinit.stats); benchmarks/_verdict.py re-exports it
(no copy), and the library alone, on the committed records, gives the intervals and verdicts README.md states.
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
import _verdict as V  # noqa: E402

DEPTH = os.path.join(ROOT, "benchmarks", "results", "depth", "runs")


def test_benchmarks_use_the_library_rule():
    for name in ("paired", "entry", "interval", "holm", "judge", "flat_curve", "fmt", "crossing_step"):
        assert getattr(V, name) is getattr(stats, name)
    assert C.crossing_step is stats.crossing_step
    assert V.flat_sentence.func is stats.flat_sentence and V.family_caption.func is stats.family_caption
    assert "benchmarks/_verdict.py" in V.family_caption("x", 2) and "hf_condinit.stats" in stats.family_caption("x", 2)


def _side(setting, arm):
    """seed -> one side of a pair: the final loss on WikiText-2 valid of a committed depth-sweep record."""
    out = {}
    for path in glob.glob(os.path.join(DEPTH, setting, arm, "seed*.json")):
        with open(path) as f:
            rec = json.load(f)
        out[rec["seed"]] = stats.entry(rec, rec["eval_files"]["wiki.valid.raw"]["loss"])
    return out


def test_readme_depth_8_numbers_from_the_records_with_the_library_alone():
    """README: depth 8, conditioned (1e-2) against default at its own rate (3e-3): -0.132 [-0.150, -0.115], n = 5;
    with default at conditioned's rate: -0.009 [-0.024, +0.006], n = 5, no (that table is its own family)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    cond = _side("8x64_tpp20_lr0.01", "conditioned")
    own = stats.interval(stats.paired(cond, _side("8x64_tpp20_lr0.003", "default")).values())
    assert own["n"] == 5 and f"depth 8 {own['mean']:+.3f} [{own['lo']:+.3f}, {own['hi']:+.3f}], n = 5, better" in readme
    same = stats.judge({"conditioned": stats.paired(cond, _side("8x64_tpp20_lr0.01", "default"))})["conditioned"]
    assert f"{stats.fmt(same).replace(' no', '')}, n = 5, no" in readme and same["verdict"] == "no"
