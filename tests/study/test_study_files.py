"""The one claim primitive (:mod:`hf_condinit.locks`) of the study's workers and of the
benchmark harness (``benchmarks/_common.run_slot``): a live ``flock`` holder (another process, locking with plain
``fcntl``, not this code) holds the path; a lock file without one is free, including a harness ``<record>.lock`` of
the old PID-file format left by a dead process; the kernel frees the claim of a killed holder."""

import json
import os
import subprocess
import sys

import pytest

from hf_condinit import locks
from hf_condinit.study import files
from utils import load_script

HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)")


@pytest.fixture
def holder():
    """``holder(path)``: a live process holding an ``flock`` on ``path``; killed at the end of the test."""
    procs = []

    def start(path):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _dead_pid() -> int:
    """The PID of a process that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_a_live_holder_takes_the_path_and_its_death_frees_it(tmp_path, holder):
    path = tmp_path / "cell.lock"
    proc = holder(path)
    assert locks.is_claimed(str(path)) and locks.try_claim(str(path)) is None
    with locks.claimed(str(path)) as fd:
        assert fd is None
    proc.kill()
    proc.wait()  # the kernel drops a dead process's flock
    assert not locks.is_claimed(str(path))
    fd = locks.try_claim(str(path))
    assert fd is not None and f"pid {os.getpid()}" in path.read_text()
    # held by this process now: a second claim (another open file, as another worker's) is refused
    assert locks.try_claim(str(path)) is None and locks.is_claimed(str(path))
    locks.release_claim(fd, str(path))
    assert not path.exists() and not locks.is_claimed(str(path))


def test_an_old_pid_lock_file_of_a_dead_worker_is_free(tmp_path):
    path = tmp_path / "runs" / "seed0.json.lock"
    path.parent.mkdir()
    path.write_text(str(_dead_pid()))  # the harness's claim before: the claimant's PID
    assert not locks.is_claimed(str(path))
    with locks.claimed(str(path)) as fd:
        assert fd is not None and "host" in path.read_text()
    assert not path.exists()


def test_is_claimed_creates_nothing(tmp_path):
    assert not locks.is_claimed(str(tmp_path / "none.lock"))
    assert not (tmp_path / "none.lock").exists()


def test_a_claim_released_while_another_worker_opens_it_is_never_held_twice(tmp_path, monkeypatch):
    """Worker B opens the file, then A releases (removes) it before B locks: B's lock is on a removed file, so B
    must start again on a new file, which a third worker then finds held."""
    path = str(tmp_path / "cell.lock")
    a = locks.try_claim(path)
    real_open = os.open
    calls = []

    def open_then_release(*args, **kw):
        fd = real_open(*args, **kw)
        calls.append(args[0])
        if len(calls) == 1:
            locks.release_claim(a, path)  # A lets go between B's open and B's lock
        return fd

    monkeypatch.setattr(locks.os, "open", open_then_release)
    b = locks.try_claim(path)
    monkeypatch.undo()
    assert b is not None and len(calls) == 2  # B tried again on the new file
    assert os.path.samestat(os.fstat(b), os.stat(path))
    assert locks.try_claim(path) is None
    locks.release_claim(b, path)


def test_write_json_is_whole_and_converts_numbers(tmp_path):
    import numpy as np

    path = tmp_path / "a" / "b.json"
    files.write_json(str(path), {"x": np.float32(0.5), "n": [1, 2]})
    assert json.loads(path.read_text()) == {"x": 0.5, "n": [1, 2]}
    assert os.listdir(path.parent) == ["b.json"]  # no temporary file left


class _Spec:
    def __init__(self, key):
        self._key = key

    def key(self):
        return self._key


def test_the_harness_run_slot_uses_the_shared_claim(tmp_path, holder):
    """``benchmarks/_common.run_slot``: finished (a record with the spec's key), locked (a live holder of
    ``<record>.lock``), claimed (free, or only a dead worker's PID file there); a record of other settings is no
    finished run."""
    load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _common as C

    path = str(tmp_path / "runs" / "base" / "default" / "seed0.json")
    os.makedirs(os.path.dirname(path))
    with open(path + ".lock", "w") as f:
        f.write(str(_dead_pid()))
    with C.run_slot(path, _Spec("k1")) as slot:
        assert slot == "claimed" and locks.is_claimed(path + ".lock")
        C.write_json(path, dict(key="k0"))  # settings changed: not finished for k1
    assert not os.path.exists(path + ".lock")
    assert C.finished_record(path, _Spec("k1")) is None
    proc = holder(path + ".lock")
    with C.run_slot(path, _Spec("k1")) as slot:
        assert slot == "locked" and C.claimed_elsewhere(path)
    proc.kill()
    proc.wait()
    C.write_json(path, dict(key="k1"))
    with C.run_slot(path, _Spec("k1")) as slot:
        assert slot == "finished"
    assert C.finished_record(path, _Spec("k1")) == dict(key="k1")
