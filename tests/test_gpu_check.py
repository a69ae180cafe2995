"""benchmarks/gpu_check.py: the smoke mode end to end (every part on CPU, tiny shapes), the per-part time cap, and
the user errors. The full mode needs a GPU; this keeps its code paths from rotting on CPU-only machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from utils import REPO, load_script

gpu_check = load_script("benchmarks/gpu_check.py", "gpu_check")


def test_smoke_run_writes_every_part(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    md = (out / "gpu_check.md").read_text()
    assert result["settings"]["smoke"] is True
    assert "SMOKE RUN" in md and "not GPU results" in md
    parts = result["parts"]
    assert list(parts) == list(gpu_check.PARTS)
    for name, part in parts.items():
        assert part["state"] == "done", (name, part)
        assert part["rows"] and not any("error" in r for r in part["rows"] if r.get("kind") != "case"), name
    a = {r["kind"] for r in parts["a"]["rows"]}
    assert a == {"env", "sdpa_backend", "matmul"}
    assert next(r for r in parts["a"]["rows"] if r["kind"] == "env")["peak_bf16_tflops"] is None  # CPU: unknown
    cases = [r for r in parts["b"]["rows"] if r["kind"] == "case"]
    failed = [(r["case"], r["dtype"], r.get("error")) for r in cases if not r["passed"]]
    assert not failed
    names = " ".join(r["case"] for r in cases)
    for needle in ("affine_scaled fast", "attention_sink fast", "preconditioned fast", "KV-cache", "spectral",
                   "conditioned init", "mimetic init", "torch.device('meta')"):
        assert needle in names
    assert {r["dtype"] for r in cases} == {"fp32", "bf16"}
    speed = [r for r in parts["c"]["rows"] if r["kind"] == "speed"]
    assert {r["impl"] for r in speed} == set(gpu_check.SPEED_IMPLS)
    assert all(r["throughput_vs_sdpa"] == 1.0 for r in speed if r["impl"] == "sdpa")
    train = [r for r in parts["d"]["rows"] if r["kind"] == "train"]
    assert [r["arm"] for r in train] == [arm[0] for arm in gpu_check.TRAIN_ARMS]
    for r in train:
        assert r["tokens_per_s"] > 0 and r["measured_steps"] == 2 and r["mfu"] is None  # no peak on CPU
    e = parts["e"]["rows"]
    assert {(r["size"], r["method"]) for r in e if r["kind"] == "build"} == {
        (s, m) for s in ("472m", "1.72b") for m in ("default", "conditioned")}
    assert sum(r["kind"] == "mimetic" for r in e) == 2


def _slow_part(ctx, record):
    record(kind="x", value=1)
    time.sleep(60)


def _quick_part(ctx, record):
    record(kind="x", value=2)


def test_cap_kills_a_slow_part_and_the_next_one_runs(tmp_path):
    out = str(tmp_path)
    os.makedirs(os.path.join(out, "parts"))
    with open(os.path.join(out, "status.json"), "w") as f:
        json.dump({"settings": {"smoke": True, "parts": ["a", "b"]}}, f)
    t0 = time.perf_counter()
    result = gpu_check.orchestrate(out, [("a", _slow_part), ("b", _quick_part)], {"a": 2, "b": 30}, {})
    assert time.perf_counter() - t0 < 30
    assert result["parts"]["a"]["state"] == "timeout"
    assert [r["value"] for r in result["parts"]["a"]["rows"]] == [1]  # measured before the kill: kept
    assert result["parts"]["b"]["state"] == "done"
    assert "Killed at its time cap" in open(os.path.join(out, "gpu_check.md")).read()


def test_user_errors(tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--smoke", "--out", str(full)])
    assert e.value.code == 2 and "not empty" in capsys.readouterr().err
    assert (full / "keep.txt").read_text() == "mine"
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--smoke", "--out", str(tmp_path / "x"), "--cap", "z=3"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--smoke", "--device", "cuda", "--out", str(tmp_path / "y")])
    assert e.value.code == 2
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            gpu_check.main(["--out", str(tmp_path / "z")])
        assert e.value.code == 2 and "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()
