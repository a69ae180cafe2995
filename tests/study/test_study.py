"""``python -m hf_condinit.study`` plans arms × seeds × each arm's rate, runs the cells (claimed, resumable; dead
workers named and replaced), grows a plan without redoing finished cells, reports a verdict without the cells that
chose the rates and its power, and refuses what it cannot do in one line before anything is saved (SLURM:
tests/study/test_study_slurm.py).

The cells run ``tests/study_fake_run.py`` (a stand-in for run_clm.py whose final loss is known: default is best at
3e-3, the other arms at 1e-2 and 0.05 lower); ``test_real_run_clm_study`` runs run_clm.py itself."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hf_condinit import stats
from hf_condinit.commands import run_main
from hf_condinit.study.cli import main
from hf_condinit.study.plan import Cell, Plan, arm_rates, slots
from hf_condinit.study.recipes import parse_recipe

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
REPO = os.path.dirname(HERE)
FAKE = os.path.join(HERE, "study_fake_run.py")
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=REPO)


@pytest.fixture
def study(monkeypatch, capsys):
    """``python -m hf_condinit.study --out OUT ARGS -- COMMAND`` in this process (a study process costs seconds of
    imports); returns ``(exit code, stdout, stderr)``; ``env``: variables set for it and its cells."""

    def run(out, *args, command=(FAKE,), env=None):
        argv = ["--out", str(out), "--poll_seconds", "0.2", *args] + (["--", *command] if command else [])
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        try:
            code = run_main(main, argv, prog="hf-condinit-study") or 0
        except SystemExit as e:
            code = e.code
        printed = capsys.readouterr()
        return code, printed.out, printed.err

    return run


def plan(**kw):
    base = dict(arms=["default", "conditioned"], seeds=3, lrs=[1e-3, 3e-3], command=[FAKE], workdir=HERE)
    return Plan(**{**base, **kw})


def test_recipes_and_their_flags():
    assert parse_recipe("conditioned").flags() == ["--init", "conditioned"]
    assert parse_recipe("default+affine_scaled").flags() == ["--init", "default", "--attention", "affine_scaled"]
    r = parse_recipe("conditioned+affine_scaled:v_gain=0.25,qk_gain=2")
    assert r.flags()[-4:] == ["--v_gain", "0.25", "--qk_gain", "2"]
    assert r.slug == "conditioned_affine_scaled_v_gain_0.25_qk_gain_2"
    # in process (the benchmarks' runs): the options with CondInitConfig's types
    typed = parse_recipe("conditioned:v_gain=0.25,value_init=per_head,mimetic_vo_sign=1").typed_options()
    assert typed == {"v_gain": 0.25, "value_init": "per_head", "mimetic_vo_sign": 1}
    assert type(typed["mimetic_vo_sign"]) is int
    assert type(parse_recipe("default+sdpa:spectral_lambda=10").typed_options()["spectral_lambda"]) is float
    with pytest.raises(ValueError, match="option v_gain='x' is not a float"):
        parse_recipe("conditioned:v_gain=x").typed_options()
    for bad, hint in [("conditoned", "did you mean 'conditioned'"), ("default+afine_scaled", "'affine_scaled'"),
                      ("conditioned:v_gian=1", "'v_gain'"), ("conditioned:v_gain", "KEY=VALUE")]:
        with pytest.raises(ValueError, match=hint):
            parse_recipe(bad)


def test_grid_chooses_each_arms_rate_and_extends_past_an_edge():
    p = plan(lrs=[1e-3, 3e-3, 1e-2])
    losses = {("default", 1e-3): 3.5, ("default", 3e-3): 3.1, ("default", 1e-2): 3.3,
              ("conditioned", 1e-3): 3.9, ("conditioned", 3e-3): 3.4, ("conditioned", 1e-2): 3.2}
    outcome = lambda c: losses.get((c.arm, c.lr))  # noqa: E731
    assert arm_rates(p, "default", outcome)["best"] == 3e-3
    r = arm_rates(p, "conditioned", outcome)  # best at the top edge: one step more, 1e-2 × 10/3, not yet run
    assert r["extensions"] == [0.0333] and not r["decided"]
    losses[("conditioned", 0.0333)] = float("inf")  # diverged there: 1e-2 stays, at the edge of the tried grid
    r = arm_rates(p, "conditioned", outcome)
    assert r["decided"] and r["best"] == 1e-2 and not r["at_edge"]
    kinds = [s[0] for s in slots(p)]
    assert kinds == ["cell"] * 6 + ["extend"] * 2 + ["seed"] * 4


def test_study_runs_every_cell_once_and_reports_the_paired_verdict(tmp_path, study):
    log = tmp_path / "starts.log"
    code, _, err = study(tmp_path / "s", "--arms", "default", "conditioned", "--seeds", "3", "--lr", "1e-3", "3e-3",
                         env={"FAKE_RUN_LOG": str(log)})
    assert code == 0, err
    starts = log.read_text().split()
    assert len(starts) == len(set(starts)) == 2 * 2 + 2 + 2 * 2  # grid, one extension each, seeds 1-2
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["rates"]["default"]["best"] == 3e-3 and rep["rates"]["conditioned"]["best"] == 9e-3
    assert rep["rates"]["conditioned"]["at_edge"] and rep["rates"]["default"]["extensions"] == [0.009]
    (row,) = rep["paired"]
    assert row["arm"] == "conditioned" and (row["lr"], row["baseline_lr"]) == (9e-3, 3e-3)
    v = row["verdict"]
    assert v["n"] == 2 and v["verdict"] == "better" and v["lo"] < v["mean"] < v["hi"] < 0
    # the verdict leaves out seed 0, whose cells chose the rates; the optimistic table has it, and says so
    final = lambda arm, seed, lr: json.loads((tmp_path / "s" / "arms" / arm / f"seed{seed}_lr{lr}" /  # noqa: E731
                                              "eval_results.json").read_text())["eval_loss"]
    diffs = {s: final("conditioned", s, 0.009) - final("default", s, 0.003) for s in (0, 1, 2)}
    assert rep["verdict_seeds"] == [1, 2] and set(map(int, v["diffs"])) == {1, 2}
    assert all(math.isclose(v["diffs"][str(k)], diffs[k], rel_tol=1e-12) for k in (1, 2))
    ref = stats.interval([diffs[1], diffs[2]])
    assert all(math.isclose(v[k], ref[k], rel_tol=1e-9) for k in ("mean", "sd", "lo", "hi", "p"))
    (biased,) = rep["paired_with_selection"]
    assert biased["verdict"]["n"] == 3 and math.isclose(biased["verdict"]["mean"], sum(diffs.values()) / 3)
    # power: from the verdict's paired sd at its n, the effect 1 % of the baseline's mean final value
    (pw,) = rep["power"]
    base_mean = (final("default", 1, 0.003) + final("default", 2, 0.003)) / 2
    assert math.isclose(pw["effect"], 0.01 * base_mean, rel_tol=1e-12) and pw["alpha"] == 0.05
    assert math.isclose(pw["detectable"], stats.detectable_effect(ref["sd"], 2), rel_tol=1e-12)
    assert pw["pairs_needed"] == stats.seeds_needed(pw["effect"], ref["sd"]) and pw["seeds_needed"] == pw[
        "pairs_needed"] + 1
    md = (tmp_path / "s" / "report.md").read_text()
    assert "best at the edge of the grid" in md and "better" in md and "![report_eval.png]" in md
    assert "at seed 0 on the grid" in md and "Seed 0's cells chose the rates, so they are kept out" in md
    assert "## With the selection seed 0 too (optimistic)" in md and "### Power" in md
    assert (tmp_path / "s" / "report_lr.png").read_bytes()[:4] == b"\x89PNG"
    before = (tmp_path / "s" / "report.md").read_bytes(), (tmp_path / "s" / "report.json").read_bytes()
    code, _, _ = study(tmp_path / "s", command=None)  # --out alone: the saved plan, nothing left to run
    assert code == 0 and log.read_text().split() == starts
    assert ((tmp_path / "s" / "report.md").read_bytes(), (tmp_path / "s" / "report.json").read_bytes()) == before


def test_a_killed_worker_is_restarted_without_redoing_finished_cells(tmp_path, study):
    log = tmp_path / "starts.log"
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "hf_condinit.study", "--out", str(out), "--arms", "default", "mimetic", "--seeds",
           "2", "--lr", "3e-3", "--", FAKE, "--sleep", "1.5"]
    worker = subprocess.Popen(cmd, env={**ENV, "FAKE_RUN_LOG": str(log)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while time.time() < deadline and (not log.exists() or len(log.read_text().split()) < 2):
        time.sleep(0.1)
    worker.send_signal(signal.SIGKILL)  # mid-study: the first cell finished, the second is running
    worker.wait()
    first = log.read_text().split()
    assert len(first) == 2
    code, _, err = study(out, command=None, env={"FAKE_RUN_LOG": str(log)})
    assert code == 0, err
    starts = log.read_text().split()
    assert starts[:2] == first and starts.count(first[0]) == 1  # finished: not redone
    assert starts.count(first[1]) == 2 and len(set(starts)) == 4  # killed mid-run: run again; the rest once each


@pytest.mark.parametrize("args, command, message", [
    (["--arms", "default", "conditoned"], [FAKE], "did you mean 'conditioned'"),
    (["--arms", "default"], [FAKE], "at least two recipes"),
    (["--arms", "default", "conditioned"], [FAKE, "--seed", "3"], "the command sets --seed"),
    (["--arms", "default", "conditioned:v_gain=1"], [FAKE, "--v_gain=2"], "the command sets --v_gain"),
    (["--arms", "default", "conditioned"], None, "no command"),
    (["--arms", "default", "mimetic", "--seeds", "0"], [FAKE], "--seeds 0 must be"),
    (["--arms", "default", "mimetic", "--bogus"], [FAKE], "unrecognized arguments"),
    (["--report"], None, "no study there"),
    (["--arms", "default", "mimetic", "--effect", "-1"], [FAKE], "--effect -1: give an effect > 0"),
    # checked before the plan is saved: a study flag after --, the command's own parser, --do_train missing
    (["--arms", "default", "mimetic"], [FAKE, "--slurm", "--workers=2"],
     "--slurm, --workers after -- goes to the command, but it is a flag of the study: put it before --"),
    (["--arms", "default", "mimetic"], [FAKE, "--sleep", "soon"],
     "study_fake_run.py exited 2): fake_run: error: argument --sleep: invalid float value: 'soon'"),
    (["--arms", "default", "mimetic"], [FAKE, "--do_eval"], "the command does not train"),
])
def test_user_errors_are_one_line_and_exit_2_and_leave_no_folder(tmp_path, study, args, command, message):
    code, _, err = study(tmp_path / "s", *args, command=command)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hf-condinit-study: error: ")
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_run_clm_parser_checks_the_command_before_the_plan_is_saved(tmp_path):
    """run_clm.py's own parser (a fresh Python importing transformers: seconds) sees a command that evaluates but
    does not train; nothing is written."""
    cmd = [sys.executable, "-m", "hf_condinit.study", "--out", str(tmp_path / "s"), "--arms", "default",
           "conditioned", "--", "run_clm.py", "--do_eval", "--max_steps", "2"]
    proc = subprocess.run(cmd, env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hf-condinit-study: error: the command does not train (it has another --do_* flag but not --do_train): add "
        "--do_train (and --do_eval for the metric)"]
    assert not (tmp_path / "s").exists()


def test_skip_check_saves_a_plan_the_parser_here_refuses(tmp_path, study):
    code, _, err = study(tmp_path / "s", "--arms", "default", "mimetic", "--skip_check", "--slurm",
                         command=(FAKE, "--sleep", "soon"))
    assert code == 0 and json.loads((tmp_path / "s" / "study.json").read_text())["command"][-1] == "soon"


def test_a_metric_the_command_does_not_write_stops_the_study(tmp_path, study):
    code, _, err = study(tmp_path / "s", "--arms", "default", "mimetic", "--metric", "eval_bleu")
    assert code == 2 and "is --metric one of its eval results" in err and len(err.strip().splitlines()) == 1


def test_a_grown_plan_runs_only_its_new_cells_and_a_change_that_breaks_finished_cells_is_refused(tmp_path, study):
    """2 seeds grown to 3, then one more arm, then a wider grid: each step runs only the new cells; the report says
    what was added and when; another command or metric, fewer seeds, another baseline are refused in one line."""
    log, out = tmp_path / "starts.log", tmp_path / "s"
    env = {"FAKE_RUN_LOG": str(log)}
    assert study(out, "--arms", "default", "conditioned", "--seeds", "2", "--lr", "3e-3", "1e-2", env=env)[0] == 0
    first = log.read_text().split()
    assert len(first) == 4 + 2 + 2  # grid, one extension each, seed 1
    code, printed, err = study(out, "--seeds", "3", command=None, env=env)
    assert code == 0, err
    assert "the plan grew: seeds 2 → 3" in printed
    new = log.read_text().split()[len(first):]
    assert sorted(new) == ["conditioned/seed2_lr0.01", "default/seed2_lr0.003"]  # only seed 2
    assert study(out, "--arms", "default", "conditioned", "mimetic", command=None, env=env)[0] == 0
    new = log.read_text().split()[len(first) + 2:]
    assert len(new) == 2 + 1 + 2 and {c.split("/")[0] for c in new} == {"mimetic"}  # its grid, extension, seeds
    before = len(log.read_text().split())
    assert study(out, "--lr", "3e-3", "1e-2", "1e-3", command=None, env=env)[0] == 0
    new = log.read_text().split()[before:]
    assert sorted(new) == ["conditioned/seed0_lr0.001", "default/seed0_lr0.001", "mimetic/seed0_lr0.001"]
    rep = json.loads((out / "report.json").read_text())
    assert [h["added"] for h in rep["plan"]["history"]] == ["seeds 2 → 3", "arm mimetic", "rate 0.001"]
    assert {c["state"] for c in rep["cells"]} == {"finished"} and len(rep["paired"]) == 2
    md = (out / "report.md").read_text()
    assert "## Plan grown" in md and ": seeds 2 → 3" in md and ": arm mimetic" in md
    for args, command, message in [
            (["--metric", "perplexity"], None, "--metric was eval_loss, now perplexity"),
            (["--seeds", "2"], None, "--seeds was 3, now 2 (a study only grows)"),
            (["--arms", "conditioned", "default"], None, "a study keeps its baseline first"),
            (["--lr", "3e-3", "1e-2"], None, "a grid only grows"),
            ([], (FAKE, "--sleep", "1"), "the command differs from word 2 on (was '(nothing)', now '--sleep 1')")]:
        code, _, err = study(out, *args, command=command)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert "use another --out" in err
    assert json.loads((out / "study.json").read_text())["seeds"] == 3  # nothing saved by a refusal


def test_a_failing_command_stops_the_study(tmp_path, study):
    args = ["--arms", "default", "conditioned", "--seeds", "2", "--lr", "3e-3"]
    code, _, err = study(tmp_path / "b", *args, command=(FAKE, "--exit", "2"))
    assert code == 2 and "exited 2 (a user error): fake_run: error: exiting 2" in err
    code, printed, err = study(tmp_path / "f", *args, command=(FAKE, "--exit", "1"))  # e.g. a non-finite loss
    assert code == 1 and "not every cell finished: 4 failed, 0 not finished" in printed, err
    rep = json.loads((tmp_path / "f" / "report.json").read_text())
    assert {c["state"] for c in rep["cells"]} == {"failed"} and rep["paired"] is None
    assert "- failed: `arms/default/seed0_lr0.003`: exit 1: fake_run: error: exiting 1" in (
        tmp_path / "f" / "report.md").read_text()


def test_cell_folder_and_key():
    c = Cell("conditioned:v_gain=0.25", 1, 3e-3)
    assert c.folder("S") == os.path.join("S", "arms", "conditioned_v_gain_0.25", "seed1_lr0.003")
    assert c.key == "conditioned_v_gain_0.25__seed1_lr0.003"


def test_console_script_entry_point():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10 (the declared floor): tomli, the same parser (dev extra)
        import tomli as tomllib

    with open(os.path.join(HERE, "..", "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["hf-condinit-study"] == "hf_condinit.study.cli:console"


def _close(a, b, rel=1e-9) -> bool:
    """``a == b`` for JSON values, floats within ``rel`` of each other."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=rel)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    return a == b


def test_committed_demo_report_is_what_its_run_clm_records_give(tmp_path, study):
    """docs/study.md's example: real run_clm.py cells (their small files, committed without the weights) give the
    committed report again."""
    demo = os.path.join(REPO, "benchmarks", "results", "study_demo")
    shutil.copytree(demo, tmp_path / "demo", ignore=shutil.ignore_patterns("report*"))
    assert study(tmp_path / "demo", "--report", command=None)[0] == 0
    with open(os.path.join(demo, "report.json")) as f:
        committed = json.load(f)
    # equal but for the last bits of the Student-t quantile (scipy 1.11, the floors, differs by ~1e-11)
    assert _close(json.loads((tmp_path / "demo" / "report.json").read_text()), committed)
    (row,) = committed["paired"]
    assert (row["lr"], row["baseline_lr"], row["verdict"]["n"], row["verdict"]["verdict"]) == (9e-3, 3e-3, 2, "no")
    (biased,) = committed["paired_with_selection"]
    doc = open(os.path.join(REPO, "docs", "study.md"), encoding="utf-8").read()
    assert f"| conditioned | 0.009 | default | 0.003 | {stats.fmt(row['verdict'], 4)} | 2 |" in doc
    assert f"| conditioned | 0.009 | default | 0.003 | {stats.fmt(biased['verdict'], 4)} | 3 |" in doc
    (pw,) = committed["power"]
    assert f"| conditioned | 2 | {pw['sd']:.4g} | {pw['detectable']:.4g} |" in doc


def test_an_unfinished_cell_makes_the_study_exit_non_zero(tmp_path, study):
    """A run killed by a signal is unfinished: the worker does not rerun it itself, and the study says so and exits
    1; the next run of the same command finishes it."""
    args = ["--arms", "default", "mimetic", "--seeds", "2", "--lr", "3e-3"]
    code, printed, err = study(tmp_path / "s", *args, command=(FAKE, "--kill_seed", "1"))
    assert code == 1, err
    assert "not every cell finished: 0 failed, 2 not finished" in printed
    md = (tmp_path / "s" / "report.md").read_text()
    assert "- not finished: `arms/default/seed1_lr0.003`" in md and "- not finished: `arms/mimetic/seed1_lr0.003`" in md


@pytest.mark.slow
def test_a_dead_local_worker_is_named_and_replaced_and_its_cell_finishes(tmp_path):
    """``kill -9`` of one of 2 workers mid-cell: the study names the worker, its signal and its cell, starts another
    worker, the cell runs again and finishes, every other cell runs once, and the study exits 0. On the CPU each
    worker's torch gets the cores ÷ 2 threads (``OMP_NUM_THREADS``, written by the fake run)."""
    log, out = tmp_path / "starts.log", tmp_path / "s"
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    cmd = [sys.executable, "-m", "hf_condinit.study", "--out", str(out), "--arms", "default", "mimetic", "--seeds",
           "3", "--lr", "3e-3", "--workers", "2", "--poll_seconds", "0.2", "--progress_seconds", "1", "--", FAKE,
           "--sleep", "2"]
    study = subprocess.Popen(cmd, env={**env, "FAKE_RUN_LOG": str(log), "CUDA_VISIBLE_DEVICES": ""}, cwd=HERE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, victim = time.time() + 120, None
    while time.time() < deadline and victim is None:
        time.sleep(0.1)
        for lock in (out / "claims").glob("*.lock") if (out / "claims").is_dir() else []:
            words = lock.read_text().split()
            if len(words) > 3 and log.exists() and lock.stem.replace("__", "/") in log.read_text().split():
                victim = int(words[3]), lock.stem
                break
    assert victim is not None
    os.kill(victim[0], signal.SIGKILL)
    printed, _ = study.communicate(timeout=180)
    assert study.returncode == 0, printed
    assert f"(pid {victim[0]}) died by signal SIGKILL while running cell {victim[1]}; the cell is put back" in printed
    starts = log.read_text().split()
    cell = victim[1].replace("__", "/")
    assert starts.count(cell) == 2 and len(starts) == 6 + 1 and len(set(starts)) == 6
    rep = json.loads((out / "report.json").read_text())
    assert {c["state"] for c in rep["cells"]} == {"finished"} and len(rep["cells"]) == 6
    cores = len(os.sched_getaffinity(0))
    threads = {json.loads((out / c["folder"] / "train_results.json").read_text())["threads"] for c in rep["cells"]}
    assert threads == {str(max(1, cores // 2))}
    assert "progress: " in printed


def test_threads_per_worker_can_be_set(tmp_path, study, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # restored after the test: --threads sets it for the cells
    args = ["--arms", "default", "mimetic", "--seeds", "1", "--lr", "3e-3", "--threads", "3"]
    assert study(tmp_path / "s", *args)[0] == 0
    assert json.loads((tmp_path / "s" / "arms" / "mimetic" / "seed0_lr0.003" / "train_results.json").read_text())[
        "threads"] == "3"


def test_power_of_the_paired_t_test_matches_references():
    """:func:`stats.power` against pwr's ``pwr.t.test(n = 10, d = 1, type = "one.sample")`` (0.8030962) and the
    textbook 34 pairs for d = 0.5 at 80 %; the detectable effect against a simulation of the test itself."""
    import numpy as np
    from scipy import stats as sps

    assert math.isclose(stats.power(1.0, 1.0, 10), 0.8030962, abs_tol=2e-6)
    assert stats.seeds_needed(0.5, 1.0) == 34 and stats.power(0.5, 1.0, 33) < 0.8 <= stats.power(0.5, 1.0, 34)
    assert stats.detectable_effect(0.0, 3) == 0.0 and stats.detectable_effect(1.0, 1) is None
    for n, sd, alpha in [(3, 0.07, 0.05), (5, 2.0, 0.025)]:
        d = stats.detectable_effect(sd, n, alpha)
        assert math.isclose(stats.power(d, sd, n, alpha), 0.8, abs_tol=1e-9)
        rng = np.random.default_rng(0)
        x = rng.normal(d, sd, size=(40000, n))
        p = sps.ttest_1samp(x, 0.0, axis=1).pvalue
        assert abs((p < alpha).mean() - 0.8) < 0.01  # 4 binomial sd
        assert stats.seeds_needed(d, sd, alpha) == n
