"""A study on SLURM: the rounds of the plan (each needs only the rounds before it), the jobs ``--submit`` /
``--slurm`` write, and — under a real one-node SLURM (``tests/slurm_cluster.py``) — a study submitted on a fresh
folder that runs to its report, with a task sent ``scancel --signal=TERM`` mid-cell requeued and the same report as
an uninterrupted local run, and a cancelled study not requeued.

The cluster needs root and Debian's slurm-wlm / munge (installed with apt-get when missing); where it cannot start,
the cluster tests skip with one line, unless ``HF_CONDINIT_REQUIRE_SLURM=1`` (CI: ``.ci/run``) makes that a failure.
The cells run ``tests/study_fake_run.py``."""

import json
import os
import re
import shutil
import subprocess
import time

import pytest
from test_study import ENV, FAKE, REPO, study  # noqa: F401  (study: the fixture)

import slurm_cluster
from hf_condinit.study.plan import Cell, Plan, resolve, rounds, slots

ARGS = ["--arms", "default", "conditioned", "--seeds", "2", "--lr", "1e-3", "3e-3"]


def fake_loss(cell: Cell) -> float:
    """study_fake_run.py's final eval_loss (its docstring), for a plan's rounds without running anything."""
    import math

    best, offset = (3e-3, 0.0) if cell.arm == "default" else (1e-2, -0.05)
    return 3 + (math.log10(cell.lr) - math.log10(best)) ** 2 + 0.01 * cell.seed + offset


@pytest.mark.parametrize("lrs, extend, seeds", [([1e-3, 3e-3], 1, 3), ([1e-4, 3e-4], 3, 2), ([1e-3, 3e-3, 1e-2], 0, 2),
                                                ([3e-3], 1, 3), ([], 1, 2)])
def test_each_round_needs_only_the_rounds_before_it(lrs, extend, seeds):
    """Once every cell of the rounds before is finished, no slot of a round waits; every slot is in one round."""
    p = Plan(arms=["default", "conditioned"], seeds=seeds, lrs=lrs, command=[FAKE], workdir=REPO, lr_extend=extend)
    order = rounds(p)
    assert sorted(i for r in order for i in r) == list(range(len(slots(p))))
    done: set = set()
    for r in order:
        cells = [resolve(p, slots(p)[i], lambda c: fake_loss(c) if c in done else None) for i in r]
        assert "wait" not in cells
        done |= {c for c in cells if isinstance(c, Cell)}
    assert len(order) == (1 if len(lrs) < 2 else 2 + extend)
    assert {c.seed for c in done} == set(range(seeds)) and {c.arm for c in done} == set(p.arms)


def _sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("job=$(sbatch")]


def test_slurm_script_chains_the_rounds_and_lists_only_what_is_left(tmp_path, study):
    out = tmp_path / "s"
    code, script, err = study(out, *ARGS, "--slurm", "--slurm_option=--time=00:30:00")
    assert code == 0, err
    assert (out / "logs").is_dir()  # every job's --output folder exists before anything is submitted
    lines = _sbatch_lines(script)
    assert len(lines) == 4  # the grid, its extension, the other seed, the report
    assert "--array=0-3 " in lines[0] and "--array=4-5 " in lines[1] and "--array=6-7 " in lines[2]
    assert "--dependency" not in lines[0] and all("--dependency=afterok:$job " in x for x in lines[1:])
    for x in lines:
        assert "--requeue" in x and "--signal=TERM@" in x and "--kill-on-invalid-dep=yes" in x
        assert x.index("--time=00:30:00") > x.index("--signal=TERM@")  # the user's options come after: they win
    assert "--slot \"$SLURM_ARRAY_TASK_ID\"" in lines[0] and "--report" in lines[3]
    for i in range(4):  # the grid done here: the script now starts at the extension round
        assert study(out, "--slot", str(i), command=None)[0] == 0
    lines = _sbatch_lines(study(out, "--slurm", command=None)[1])
    assert len(lines) == 3 and "--array=4-5 " in lines[0] and "--dependency" not in lines[0]
    assert study(out, command=None)[0] == 0  # the rest, locally
    assert "nothing left to run" in study(out, "--slurm", command=None)[1]


def test_a_slot_run_before_its_round_stops_at_once(tmp_path, study):
    """A seed slot whose arm's rate is not chosen yet is refused in one line (it would hold an allocation while it
    waited); a slot past the end too."""
    out = tmp_path / "s"
    code, _, err = study(out, *ARGS, "--slurm")
    assert code == 0, err
    code, _, err = study(out, "--slot", "6", command=None)
    assert code == 2 and "learning rate is not chosen yet" in err and len(err.strip().splitlines()) == 1
    code, _, err = study(out, "--slot", "8", command=None)
    assert code == 2 and "the study has 8 slots" in err
    assert not (out / "arms").exists()


def test_submit_without_sbatch_is_one_line(tmp_path, study, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = study(tmp_path / "s", *ARGS, "--submit")
    assert code == 2 and "no sbatch here" in err and len(err.strip().splitlines()) == 1


# --- under a real SLURM ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    try:
        c = slurm_cluster.start()
    except (slurm_cluster.Unavailable, OSError, subprocess.SubprocessError) as e:
        if os.environ.get("HF_CONDINIT_REQUIRE_SLURM") == "1":
            pytest.fail(f"the test SLURM cluster did not start: {e}")
        pytest.skip(f"no test SLURM cluster: {e}")
    yield c
    c.stop()
    shutil.rmtree(c.root, ignore_errors=True)


def _slurm(cluster, *cmd) -> str:
    return subprocess.run(cmd, env={**os.environ, **cluster.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True).stdout


def _job_ids(printed: str) -> list[str]:
    return [line.rsplit("job ", 1)[1] for line in printed.splitlines() if ": job " in line]


def _wait(what: str, check, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.mark.slow
def test_submitted_study_is_requeued_after_a_signal_and_gives_the_local_report(tmp_path, study, cluster):
    """``--submit`` on a fresh folder: the grid's array, the other seed's array after it, the report job. A grid task
    sent ``scancel --signal=TERM`` mid-cell requeues itself; the seed round waits for it (its tasks would exit 2
    otherwise), and the report is the one of an uninterrupted local run. (Each task costs seconds of imports, so the
    grid does not grow here: ``--lr_extend 0``; the extension round is the script test's.)"""
    args = ["--arms", "default", "conditioned", "--seeds", "2", "--lr", "3e-3", "1e-2", "--lr_extend", "0"]
    assert study(tmp_path / "local", *args)[0] == 0
    starts = tmp_path / "starts.log"
    env = {**cluster.env, "PYTHONPATH": REPO, "FAKE_RUN_LOG": str(starts), "FAKE_RUN_SLEEP": "3"}
    code, printed, err = study(tmp_path / "slurm", *args, "--submit", env=env)
    assert code == 0, err
    ids = _job_ids(printed)
    assert len(ids) == 3, printed
    target = "default/seed0_lr0.003"  # slot 0, task 0 of the grid's array
    _wait(f"{target} to start", lambda: starts.exists() and target in starts.read_text())
    time.sleep(1.0)  # mid-cell: the run sleeps 3 s
    # scancel signals the task's step at once, then asks slurmctld to signal the job too, which it refuses while the
    # task requeues ("Job can not be altered now"): scancel retries that for about a minute and a half. SLURM holds a
    # requeued job for about two minutes before it may start again. So: no waiting for either; once the task is
    # requeued, our scancel ends (its retries would signal the task's next run) and the task may start at once.
    scancel = subprocess.Popen(["scancel", "--signal=TERM", f"{ids[0]}_0"], env={**os.environ, **cluster.env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait("the task to be requeued", lambda: re.search(r"JobState=PENDING .*Restarts=1", _slurm(
            cluster, "scontrol", "show", "job", "-o", f"{ids[0]}_0")), timeout=60)
    finally:
        scancel.kill()
        scancel.wait()
    _slurm(cluster, "scontrol", "update", f"JobId={ids[0]}_0", "StartTime=now")
    _wait("the study's jobs to end", lambda: not _slurm(cluster, "squeue", "-h", "-j", ",".join(ids)).strip(),
          timeout=300)
    shown = "".join(_slurm(cluster, "scontrol", "show", "job", "-o", j) for j in ids)
    states = [w for w in shown.split() if w.startswith("JobState=")]
    assert len(states) == 4 + 2 + 1 and set(states) == {"JobState=COMPLETED"}, shown
    log0 = (tmp_path / "slurm" / "logs" / f"slurm-{ids[0]}_0.out").read_text()
    assert "requeued" in log0 and log0.count("run default__seed0_lr0.003") == 2  # appended across the requeue
    runs = starts.read_text().split()
    assert runs.count(target) == 2 and len(runs) == 7 and len(set(runs)) == 6
    reports = [json.loads((tmp_path / d / "report.json").read_text()) for d in ("local", "slurm")]
    assert reports[0] == reports[1] and {c["state"] for c in reports[0]["cells"]} == {"finished"}
    assert (tmp_path / "slurm" / "report.md").read_text() == (tmp_path / "local" / "report.md").read_text().replace(
        "# Study local", "# Study slurm")


@pytest.mark.slow
def test_a_cancelled_study_is_not_requeued(tmp_path, study, cluster):
    """``scancel`` of a running task (SIGTERM, then the job ends): the run stops, the task does not requeue itself,
    and the rounds after it are cancelled too (an invalid dependency)."""
    starts = tmp_path / "starts.log"
    env = {**cluster.env, "PYTHONPATH": REPO, "FAKE_RUN_LOG": str(starts), "FAKE_RUN_SLEEP": "30"}
    code, printed, err = study(tmp_path / "s", "--arms", "default", "conditioned", "--seeds", "2", "--lr", "3e-3",
                               "--submit", env=env)
    assert code == 0, err
    ids = _job_ids(printed)
    assert len(ids) == 2  # one round (no grid), the report
    _wait("a cell to start", lambda: starts.exists() and starts.read_text().strip())
    time.sleep(1.0)
    _slurm(cluster, "scancel", ids[0])
    _wait("the study's jobs to end", lambda: not _slurm(cluster, "squeue", "-h", "-j", ",".join(ids)).strip(),
          timeout=120)
    shown = "".join(_slurm(cluster, "scontrol", "show", "job", "-o", j) for j in ids)
    assert "Restarts=0" in shown and "Restarts=1" not in shown and "JobState=COMPLETED" not in shown, shown
    logs = "".join(p.read_text() for p in (tmp_path / "s" / "logs").glob(f"slurm-{ids[0]}_*.out"))
    assert "not requeued" in logs
    assert not (tmp_path / "s" / "report.json").exists()
