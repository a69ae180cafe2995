"""Issue 35 item 1: ``python -m hf_condinit.study`` plans arms × seeds × each arm's rate, runs the cells (claimed,
resumable), prints a SLURM array script that gives the same report, and refuses what it cannot do in one line.

The cells run ``tests/study_fake_run.py`` (a stand-in for run_clm.py whose final loss is known: default is best at
3e-3, the other arms at 1e-2 and 0.05 lower); ``test_real_run_clm_study`` runs run_clm.py itself."""

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hf_condinit import stats
from hf_condinit.scripts.errors import run_main
from hf_condinit.study.cli import main
from hf_condinit.study.plan import Cell, Plan, arm_rates, slots
from hf_condinit.study.recipes import parse_recipe

HERE = os.path.dirname(os.path.abspath(__file__))
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
    assert v["n"] == 3 and v["verdict"] == "better" and v["lo"] < v["mean"] < v["hi"] < 0
    md = (tmp_path / "s" / "report.md").read_text()
    assert "best at the edge of the grid" in md and "better" in md and "![report_eval.png]" in md
    assert (tmp_path / "s" / "report_lr.png").read_bytes()[:4] == b"\x89PNG"
    code, _, _ = study(tmp_path / "s", command=None)  # --out alone: the saved plan, nothing left to run
    assert code == 0 and log.read_text().split() == starts


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


def test_slurm_array_tasks_give_the_same_report(tmp_path, study):
    """The printed script, run once per SLURM_ARRAY_TASK_ID, gives the report of a local run of the same plan. Tasks
    0 and 1 run the script itself with bash, at once as SLURM starts them; tasks 2 and 3 run its command line in this
    process (each Python start costs seconds of torch imports)."""
    args = ["--arms", "default", "conditioned:v_gain=0.5", "--seeds", "2", "--lr", "1e-2"]
    assert study(tmp_path / "local", *args)[0] == 0
    code, script, _ = study(tmp_path / "array", *args, "--slurm", "--slurm_option=--gpus-per-task=1")
    assert code == 0 and "#SBATCH --array=0-3\n" in script and "#SBATCH --gpus-per-task=1\n" in script
    (tmp_path / "study.sbatch").write_text(script)
    tasks = [subprocess.Popen(["bash", str(tmp_path / "study.sbatch")], env={**ENV, "SLURM_ARRAY_TASK_ID": str(i)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for t in tasks:
        assert t.wait(timeout=120) == 0, t.stderr.read()
    exec_line = shlex.split(script.strip().splitlines()[-1])
    assert exec_line[:4] == ["exec", sys.executable, "-m", "hf_condinit.study"]
    assert exec_line[-2:] == ["--slot", "$SLURM_ARRAY_TASK_ID"]
    for i in (2, 3):
        argv = [a.replace("$SLURM_ARRAY_TASK_ID", str(i)) for a in exec_line[4:]]
        assert study(argv[1], *argv[2:], command=None)[0] == 0  # argv: --out OUT --poll_seconds P --slot i
    assert not (tmp_path / "array" / "report.json").exists()  # a task runs its cell only
    assert study(tmp_path / "array", "--report", command=None)[0] == 0
    reports = [json.loads((tmp_path / d / "report.json").read_text()) for d in ("local", "array")]
    assert reports[0] == reports[1] and reports[0]["paired"][0]["verdict"]["verdict"] == "better"
    assert len(reports[0]["cells"]) == 4 and {c["state"] for c in reports[0]["cells"]} == {"finished"}


@pytest.mark.parametrize("args, command, message", [
    (["--arms", "default", "conditoned"], [FAKE], "did you mean 'conditioned'"),
    (["--arms", "default"], [FAKE], "at least two recipes"),
    (["--arms", "default", "conditioned"], [FAKE, "--seed", "3"], "the command sets --seed"),
    (["--arms", "default", "conditioned:v_gain=1"], [FAKE, "--v_gain=2"], "the command sets --v_gain"),
    (["--arms", "default", "conditioned"], None, "no command"),
    (["--arms", "default", "mimetic", "--seeds", "0"], [FAKE], "--seeds 0 must be"),
    (["--arms", "default", "mimetic", "--bogus"], [FAKE], "unrecognized arguments"),
    (["--report"], None, "no study there"),
    (["--arms", "default", "mimetic", "--metric", "eval_bleu"], [FAKE], "is --metric one of its eval results"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path, study, args, command, message):
    code, _, err = study(tmp_path / "s", *args, command=command)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hf-condinit-study: error: ")


def test_changed_flags_are_refused_and_a_failing_command_stops_the_study(tmp_path, study):
    args = ["--arms", "default", "conditioned", "--seeds", "2", "--lr", "3e-3"]
    assert study(tmp_path / "s", *args)[0] == 0
    code, _, err = study(tmp_path / "s", "--arms", "default", "conditioned", "--seeds", "3")
    assert code == 2 and "--seeds was 2, now 3" in err
    code, _, err = study(tmp_path / "b", *args, command=(FAKE, "--exit", "2"))
    assert code == 2 and "exited 2 (a user error): fake_run: error: exiting 2" in err
    code, _, err = study(tmp_path / "f", *args, command=(FAKE, "--exit", "1"))  # e.g. a non-finite loss: recorded
    assert code == 0, err
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
    assert (row["lr"], row["baseline_lr"], row["verdict"]["n"], row["verdict"]["verdict"]) == (9e-3, 3e-3, 3, "no")
    assert f"| conditioned | 0.009 | default | 0.003 | {stats.fmt(row['verdict'], 4)} | 3 |" in open(
        os.path.join(REPO, "docs", "study.md"), encoding="utf-8").read()
