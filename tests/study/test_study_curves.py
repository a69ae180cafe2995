"""The study report's curve claims (steps to the baseline's final value, paired; the plateau rule; the curve
figure) on a hand-built study of a higher-is-better metric whose curves are straight lines, so every number has a
closed form; and ``--export``: a study's record without weights reports the same bytes and reruns no cell."""

import json
import math
import os

import pytest

from hf_condinit.commands import run_main
from hf_condinit.scripts.lifecycle import run_finished
from hf_condinit.study.cli import main
from hf_condinit.study.plan import Plan

scipy_stats = pytest.importorskip("scipy.stats")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
FAKE = os.path.join(HERE, "study_fake_run.py")
SEEDS = range(4)
STEPS = list(range(10, 101, 10))  # evaluations; the run's last step is 100, in 2 epochs
K = {s: 0.006 + 0.0007 * s for s in SEEDS}  # conditioned's slope per seed


def _curve(arm: str, seed: int, step: int) -> float:
    """eval_accuracy of the hand-built runs: default rises 0.004 a step to 0.5 + 0.01 s at step 100; conditioned
    rises faster (K[s]) and stays at 0.55 + 0.01 s once there; mimetic rises slower and never gets to default's."""
    start = 0.1 + 0.01 * seed
    if arm == "default":
        return start + 0.004 * step
    if arm == "conditioned":
        return min(start + K[seed] * step, 0.55 + 0.01 * seed)
    return start + (0.0039 - 0.0001 * (seed % 2)) * step


def _run_main(*argv):
    try:
        return run_main(main, list(argv), prog="hf-condinit-study") or 0
    except SystemExit as e:
        return e.code


def _build(out, arms=("default", "mimetic", "conditioned")):
    Plan(arms=list(arms), seeds=len(SEEDS), lrs=[1e-3], command=[FAKE], workdir=HERE, metric="eval_accuracy",
         plateau=0.005).save(str(out))
    for arm in arms:
        for seed in SEEDS:
            folder = out / "arms" / arm / f"seed{seed}_lr0.001"
            folder.mkdir(parents=True)
            history = [{"step": s, "epoch": s / 50, "eval_accuracy": _curve(arm, seed, s)} for s in STEPS]
            (folder / "trainer_state.json").write_text(json.dumps(
                {"global_step": 100, "epoch": 2.0, "log_history": history}))
            (folder / "eval_results.json").write_text(json.dumps({"eval_accuracy": _curve(arm, seed, 100)}))
            (folder / "train_results.json").write_text(json.dumps({"train_loss": 1.0}))
    return out


def _holm(ps):
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


def test_steps_to_the_baselines_final_value_are_paired_by_seed_with_holm_over_every_pair(tmp_path):
    out = _build(tmp_path / "s")
    assert _run_main("--out", str(out), "--report") == 0
    rep = json.loads((out / "report.json").read_text())
    reach = rep["reach"]
    assert reach["steps_per_epoch"] == 50
    # the crossing of a straight line: conditioned reaches 0.5 + 0.01 s at 0.4 / K[s]; default at its last step;
    # mimetic never (censored at 100)
    expect = {"default": {s: 100.0 for s in SEEDS}, "conditioned": {s: 0.4 / K[s] for s in SEEDS},
              "mimetic": {s: 100.0 for s in SEEDS}}
    for arm, by_seed in expect.items():
        for s, steps in by_seed.items():
            got = reach["arms"][arm][str(s)]
            assert math.isclose(got["steps"], steps, rel_tol=1e-9) and got["censored"] == (arm == "mimetic")
    rows = {(r["arm"], r["against"]): r for r in reach["rows"]}
    assert set(rows) == {("mimetic", "default"), ("conditioned", "default"), ("conditioned", "mimetic")}
    pvalues = {}
    for (a, b), row in rows.items():
        diffs = [expect[a][s] - expect[b][s] for s in SEEDS]
        v = row["verdict"]
        assert v["n"] == 4 and math.isclose(v["mean"], sum(diffs) / 4, abs_tol=1e-9)
        if len(set(round(d, 9) for d in diffs)) > 1:
            sd = math.sqrt(sum((d - v["mean"]) ** 2 for d in diffs) / 3)
            half = scipy_stats.t.ppf(0.975, 3) * sd / 2
            assert math.isclose(v["lo"], v["mean"] - half, rel_tol=1e-9)
            assert math.isclose(v["hi"], v["mean"] + half, rel_tol=1e-9)
        pvalues[(a, b)] = v["p"]
    assert row["verdict"]["family_size"] == 3
    keys = list(pvalues)
    for key, adj in zip(keys, _holm([pvalues[k] for k in keys])):
        assert math.isclose(rows[key]["verdict"]["p_holm"], adj, rel_tol=1e-9)
    assert rows[("conditioned", "default")]["verdict"]["verdict"] == "better"
    assert rows[("mimetic", "default")]["censored"] == [4, 0]
    assert rows[("conditioned", "mimetic")]["censored"] == [0, 4]
    md = (out / "report.md").read_text()
    assert "## Steps to default's final eval_accuracy" in md
    v = rows[("conditioned", "default")]["verdict"]
    steps = f"{v['mean']:+.1f} [{v['lo']:+.1f}, {v['hi']:+.1f}] better"
    epochs = f"{v['mean'] / 50:+.2f} [{v['lo'] / 50:+.2f}, {v['hi'] / 50:+.2f}] better"
    assert f"| conditioned | default | {steps} | {epochs} | 4 | 0 / 0 |" in md
    assert "| mimetic | 100 | 2.00 | 0 of 4 |" in md


def test_every_pair_of_arms_gets_the_final_metrics_paired_verdict(tmp_path):
    out = _build(tmp_path / "s")
    assert _run_main("--out", str(out), "--report") == 0
    rep = json.loads((out / "report.json").read_text())
    rows = {(r["arm"], r["baseline"]): r["verdict"] for r in rep["every_pair"]}
    diffs = [_curve("conditioned", s, 100) - _curve("mimetic", s, 100) for s in SEEDS]
    assert math.isclose(rows[("conditioned", "mimetic")]["mean"], sum(diffs) / 4, rel_tol=1e-9)
    assert rows[("conditioned", "mimetic")]["family_size"] == 3
    assert "## Every pair of arms" in (out / "report.md").read_text()


def test_plateau_rule_per_arm_with_the_plans_threshold(tmp_path):
    """Gain over the last fifth (steps 80 to 100): default 0.08, mimetic 0.078 / 0.076 by seed, conditioned 0 (flat
    from step 0.45 / K[s] ≤ 75 on). A threshold above default's gain makes it met."""
    out = _build(tmp_path / "s")
    assert _run_main("--out", str(out), "--report") == 0
    rep = json.loads((out / "report.json").read_text())
    rows = {r["arm"]: r for r in rep["plateau"]}
    assert all(math.isclose(g, 0.08, rel_tol=1e-9) for g in rows["default"]["gains"].values())
    assert [round(g, 9) for g in rows["mimetic"]["gains"].values()] == [0.078, 0.076, 0.078, 0.076]
    assert all(abs(g) < 1e-12 for g in rows["conditioned"]["gains"].values())
    assert (rows["default"]["met"], rows["mimetic"]["met"], rows["conditioned"]["met"]) == (False, False, True)
    assert "| default | +0.08 | 0: +0.08, 1: +0.08, 2: +0.08, 3: +0.08 | not met |" in (out / "report.md").read_text()
    assert _run_main("--out", str(out), "--report", "--plateau", "0.1") == 0
    assert Plan.load(str(out)).plateau == 0.1 and Plan.load(str(out)).history == []
    rows = {r["arm"]: r for r in json.loads((out / "report.json").read_text())["plateau"]}
    assert rows["default"]["met"] and rows["mimetic"]["met"]


def test_the_report_and_its_figures_are_the_same_bytes_on_a_rerun(tmp_path):
    out = _build(tmp_path / "s")
    assert _run_main("--out", str(out), "--report") == 0
    names = ["report.md", "report.json", "report_eval.png", "report_curves.png"]
    first = {n: (out / n).read_bytes() for n in names}
    assert _run_main("--out", str(out), "--report") == 0
    assert {n: (out / n).read_bytes() for n in names} == first
    assert "![report_curves.png](report_curves.png)" in first["report.md"].decode()


def test_a_lower_is_better_metric_counts_steps_down_to_the_target(tmp_path):
    """eval_loss: the same straight lines, negated; the same steps and verdicts."""
    out = _build(tmp_path / "s")
    for path in (out / "arms").glob("*/*/"):
        state = json.loads((path / "trainer_state.json").read_text())
        for e in state["log_history"]:
            e["eval_loss"] = -e.pop("eval_accuracy")
        (path / "trainer_state.json").write_text(json.dumps(state))
        final = json.loads((path / "eval_results.json").read_text())
        (path / "eval_results.json").write_text(json.dumps({"eval_loss": -final["eval_accuracy"]}))
    plan = Plan.load(str(out))
    plan.metric = "eval_loss"
    plan.save(str(out))
    assert _run_main("--out", str(out), "--report") == 0
    rep = json.loads((out / "report.json").read_text())
    assert math.isclose(rep["reach"]["arms"]["conditioned"]["1"]["steps"], 0.4 / K[1], rel_tol=1e-9)
    assert {r["arm"]: r["met"] for r in rep["plateau"]} == {"default": False, "mimetic": False, "conditioned": True}


def test_export_copies_the_record_without_weights_and_a_rerun_of_the_study_runs_no_cell(tmp_path, monkeypatch):
    """A real study of the fake run, with weights, checkpoints and the run lock added to its cells: the export holds
    only the record, reports the same bytes, and the study's own command on it runs nothing."""
    src = tmp_path / "a" / "study"
    args = ["--arms", "default", "mimetic", "--seeds", "2", "--lr", "1e-3", "3e-3", "--poll_seconds", "0.2"]
    assert _run_main("--out", str(src), *args, "--", FAKE) == 0
    for cell in (src / "arms").glob("*/*/"):
        (cell / "checkpoint-8").mkdir()
        (cell / "checkpoint-8" / "trainer_state.json").write_text("{}")
        for name in ("model.safetensors", "training_args.bin", ".hf_condinit.lock"):
            (cell / name).write_text("x")
    rep = json.loads((src / "report.json").read_text())
    assert rep["verdict_seeds"] == [1]  # with a grid the selection seed 0 is out of the verdict, not of the plateau
    assert {r["arm"]: sorted(r["gains"]) for r in rep["plateau"]} == {"default": ["0", "1"], "mimetic": ["0", "1"]}
    dest = tmp_path / "b" / "study"
    assert _run_main("--out", str(src), "--export", str(dest)) == 0
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert not [p for p in copied if "checkpoint" in p or p.endswith((".safetensors", ".bin", ".lock", ".log"))]
    assert "study.json" in copied and "arms/default/seed1_lr0.003/trainer_state.json" in copied
    assert run_finished(str(dest / "arms" / "default" / "seed1_lr0.003"))  # what a rerun of the script would see
    for name in ("report.md", "report.json", "report_eval.png", "report_curves.png", "report_lr.png"):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name
    log = tmp_path / "starts.log"
    monkeypatch.setenv("FAKE_RUN_LOG", str(log))
    assert _run_main("--out", str(dest), *args, "--", FAKE) == 0
    assert not log.exists()
    assert (dest / "report.md").read_bytes() == (src / "report.md").read_bytes()


@pytest.mark.parametrize("where, message", [
    ("inside", "give a folder outside the study"),
    ("full", "exists and is not an empty folder"),
])
def test_export_refuses_to_overwrite_in_one_line(tmp_path, capsys, where, message):
    out = _build(tmp_path / "s", arms=("default", "conditioned"))
    dest = out / "copy" if where == "inside" else tmp_path / "full"
    if where == "full":
        dest.mkdir()
        (dest / "mine.txt").write_text("keep")
    assert _run_main("--out", str(out), "--export", str(dest)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert where == "inside" and not dest.exists() or (dest / "mine.txt").read_text() == "keep"


def test_a_negative_plateau_is_a_one_line_user_error(tmp_path, capsys):
    out = _build(tmp_path / "s", arms=("default", "conditioned"))
    before = (out / "study.json").read_bytes()
    assert _run_main("--out", str(out), "--report", "--plateau", "-0.01") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plateau -0.01: give a gain ≥ 0" in err[0]
    assert (out / "study.json").read_bytes() == before and not (out / "report.md").exists()
