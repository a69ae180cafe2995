"""README's "What we found" and docs/results.md's result tables are generated from the committed records
(benchmarks/findings.py): regenerate them in memory and compare with the committed text."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
pytest.importorskip("scipy")
import findings as F  # noqa: E402


def test_committed_blocks_are_what_the_records_give():
    for path, named in F.blocks().items():
        with open(path, encoding="utf-8") as f:
            committed = f.read()
        for name, block in named.items():
            i = committed.index(F.begin(name)) + len(F.begin(name))
            got = committed[i:committed.index(F.end(name))]
            assert got == "\n" + block.strip("\n") + "\n", (
                f"{os.path.relpath(path, ROOT)} block {name!r} is stale: run python benchmarks/findings.py")


def test_splice_replaces_only_the_block():
    text = "a\n" + F.begin("x") + "\nold\n" + F.end("x") + "\nb\n"
    assert F.splice(text, "x", "new") == "a\n" + F.begin("x") + "\nnew\n" + F.end("x") + "\nb\n"
    with pytest.raises(ValueError):
        F.splice("no markers", "x", "new")


def test_headline_numbers_come_from_the_records():
    """The default mode's perplexities in README's block are the committed records' means (computed here
    without the harness's aggregation)."""
    import glob
    import json
    import statistics

    block = F.blocks()[F.README]["findings"]
    for arm in ("default", "conditioned", "affine_scaled", "preconditioned"):
        ppl = [json.load(open(p))["final_eval_ppl"]
               for p in glob.glob(os.path.join(F.RESULTS, "compare", "runs", "base", arm, "seed*.json"))]
        assert len(ppl) >= 2
        assert f"{arm} {statistics.fmean(ppl):.2f} ± {statistics.stdev(ppl):.2f}" in block
    assert "At CPU scale only" not in block


def test_every_committed_run_record_says_where_and_from_what_it_ran():
    """Device, and commit + command + library versions (``_common.provenance``); a record written before those
    fields carries ``provenance_backfill`` (the commit that added it) instead."""
    import glob
    import json

    paths = glob.glob(os.path.join(F.RESULTS, "**", "runs", "**", "*.json"), recursive=True)
    assert len(paths) > 200
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        where = os.path.relpath(path, ROOT)
        assert rec.get("device"), where
        if "provenance_backfill" in rec:
            assert len(rec["provenance_backfill"]["added_in_commit"]) == 40, where
        else:
            assert rec.get("commit") and rec.get("command") and rec.get("versions", {}).get("torch"), where


def test_vision_study_block_at_every_stage(tmp_path, monkeypatch, capsys):
    """No record: one line; an unfinished record: N of M cells done; a finished one: the study's report, its
    paired difference being the fake run's closed form (tests/study_fake_run.py: at 3e-3, mimetic's final loss
    is default's + log10(3e-3 / 1e-2)² − 0.05)."""
    import math

    from hf_condinit.commands import run_main
    from hf_condinit.study.cli import main

    folder = tmp_path / "study"
    assert F.vision_study_block(str(folder)).startswith("Not run yet: no record of the study")
    fake = os.path.join(ROOT, "tests", "study_fake_run.py")
    argv = ["--out", str(folder), "--arms", "default", "mimetic", "--seeds", "2", "--lr", "3e-3", "--", fake]
    assert (run_main(main, argv, prog="hf-condinit-study") or 0) == 0
    capsys.readouterr()
    block = F.vision_study_block(str(folder))
    delta = math.log10(0.3) ** 2 - 0.05
    assert f"| mimetic | 0.003 | default | 0.003 | {delta:+.4f} [{delta:+.4f}, {delta:+.4f}]" in block
    assert "#### Paired against default" in block and "## Study" not in block
    assert os.path.relpath(str(folder), os.path.join(ROOT, "docs")) + "/report_curves.png" in block
    assert "κ(J) over training" not in block
    (tmp_path / "kappa.png").write_bytes(b"")
    assert "#### κ(J) over training" in F.vision_study_block(str(folder))
    os.remove(folder / "arms" / "mimetic" / "seed1_lr0.003" / "train_results.json")
    assert F.vision_study_block(str(folder)).startswith("Not finished yet: 3 of 4 cells done")
