"""``benchmarks/compare.py --task vision --quick`` end to end, in-process, on CPU (a 1-layer ViT, 6 steps, 2 arms, 1
seed, 250 training images of the real CIFAR-10 files).

Checks that the outputs exist and agree with each other (one JSON per run, results.json / results.md / plots), that
the arms saw the same data (same initial curve point for the default-init parameters is not guaranteed, but the
same number of training images and steps is), that a second call skips the finished runs, and that --report-only
rebuilds the report from them.
"""

import json
import math

import pytest

from utils import REPO, load_script

CIFAR = REPO.parent / "shared" / "data" / "cifar10"


def _vision():
    load_script("benchmarks/compare.py", "hf_condinit_bench_compare")  # puts benchmarks/ on sys.path
    return load_script("benchmarks/_vision.py", "_vision")


def test_crossing_step_interpolates_between_curve_points():
    _vision()  # benchmarks/ on sys.path
    from _vision_report import crossing_step
    curve = [dict(step=0, accuracy=0.1), dict(step=40, accuracy=0.3), dict(step=80, accuracy=0.5)]
    assert crossing_step(curve, 0.4) == pytest.approx(60.0)
    assert crossing_step(curve, 0.05) == 0.0
    assert crossing_step(curve, 0.5) == pytest.approx(80.0)
    assert crossing_step(curve, 0.6) is None


def test_balanced_subset_takes_the_same_count_per_class(tmp_path):
    import datasets

    labels = [0] * 30 + [1] * 12 + [2] * 20  # sorted by class, unbalanced, like a class-sorted file
    src = tmp_path / "src.parquet"
    datasets.Dataset.from_dict({"label": labels, "idx": list(range(len(labels)))}).to_parquet(str(src))
    dst = _vision().balanced_subset(str(src), 30, str(tmp_path / "sub.parquet"))
    sub = datasets.load_dataset("parquet", data_files=dst, split="train")
    assert sub["label"] == [0, 1, 2] * 10  # 10 per class, interleaved
    assert len(set(sub["idx"])) == 30 and all(labels[i] == y for i, y in zip(sub["idx"], sub["label"]))
    with pytest.raises(SystemExit, match="fewer than"):
        _vision().balanced_subset(str(src), 45, str(tmp_path / "too_many.parquet"))


@pytest.mark.skipif(not (CIFAR / "train.parquet").exists(), reason="needs ../shared/data/cifar10")
def test_compare_vision_quick(tmp_path):
    compare = load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    out = tmp_path / "vq"
    argv = ["--task", "vision", "--quick", "--out", str(out), "--threads", "2"]
    results = compare.main(argv)

    run_files = sorted(p.relative_to(out).as_posix() for p in (out / "runs").rglob("*.json"))
    assert run_files == ["runs/n250/default/seed0.json", "runs/n250/mimetic/seed0.json"]
    for name in ("results.json", "results.md", "accuracy.png", "loss.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    arms = results["settings"]["n250"]
    assert list(arms) == ["default", "mimetic"]
    recs = {a: json.loads((out / "runs" / "n250" / a / "seed0.json").read_text()) for a in arms}
    for arm, a in arms.items():
        rec = recs[arm]
        assert rec["n_train"] == 250 and rec["n_test"] == 200
        assert rec["condinit"]["method"] == arm
        assert 0.0 <= rec["test_accuracy"] <= 1.0 and math.isfinite(rec["test_loss"])
        assert a["acc_mean"] == rec["test_accuracy"]
        assert [p["step"] for p in rec["curve"]] == [0, 3, 6]
        assert rec["train_curve"] and rec["train_curve"][-1]["step"] == 6
        assert rec["kappa_init"]["mean"] >= 1.0 and rec["kappa_end"]["mean"] >= 1.0
        layers = rec["step0"]["layers"]
        assert len(layers) == 1 and 0.0 < layers[0]["attn_entropy"] <= layers[0]["uniform_entropy"] + 1e-6
    assert arms["mimetic"]["delta_mean"] == pytest.approx(recs["mimetic"]["test_accuracy"]
                                                          - recs["default"]["test_accuracy"])
    # mimetic's step-0 attention is not the default's (its W_Q W_Kᵀ ≈ α I + β Z): the init really differs
    assert recs["mimetic"]["step0"]["layers"][0]["logit_std"] != recs["default"]["step0"]["layers"][0]["logit_std"]
    md = (out / "results.md").read_text()
    assert md.count("| default |") == 2 and md.count("| mimetic |") == 2  # result and step-0 tables

    # resumable: nothing is retrained; --report-only rebuilds the same numbers
    before = {p: (out / p).stat().st_mtime_ns for p in run_files}
    again = compare.main(argv)
    assert {p: (out / p).stat().st_mtime_ns for p in run_files} == before
    assert again["settings"]["n250"]["mimetic"]["acc_mean"] == arms["mimetic"]["acc_mean"]
    (out / "results.md").unlink()
    compare.main([*argv, "--report-only"])
    assert (out / "results.md").read_text() == md


@pytest.mark.skipif(not (CIFAR / "train.parquet").exists(), reason="needs ../shared/data/cifar10")
def test_a_signal_during_a_vision_run_writes_no_record(tmp_path):
    """SIGTERM during training: the Trainer saves a checkpoint and stops early (the stock ``train()`` would then
    return normally; ``CondInitTrainer.train`` raises); the harness must not record that partly trained model as the
    finished run. It exits 75 (run the same command again) and leaves no record of the run."""
    import os
    import signal

    import torch

    compare = load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    out = tmp_path / "vq"

    def sigterm_at_first_training_forward(module, args):
        if module.training and type(module).__name__.endswith("ForImageClassification"):
            os.kill(os.getpid(), signal.SIGTERM)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(sigterm_at_first_training_forward)
    try:
        with pytest.raises(SystemExit) as stop:
            compare.main(["--task", "vision", "--quick", "--out", str(out), "--threads", "2"])
    finally:
        handle.remove()
    assert stop.value.code == 75
    assert not list((out / "runs").rglob("*.json"))
    assert list((out / "work").rglob("checkpoint-1"))
