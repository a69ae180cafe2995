"""benchmarks/kappa_curves.py on a tiny real study of run_image_classification.py (a 1-layer ViT, 2 steps, a
checkpoint at each): the init it rebuilds from a cell's config and seed is the run's own (trained at learning rate
0, its final weights are its init), κ is the SVD path's on the kept weights, and a rerun measures nothing again."""

import json
import os
import sys

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_condinit import attention_jacobian_condition_number
from hf_condinit.commands import run_main
from hf_condinit.study.cli import main as study_main

from utils import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import kappa_curves as K  # noqa: E402

TINY = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64,patch_size=8"


def _parquet(path, n):
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)) for _ in range(n)]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"img": images, "label": [i % 2 for i in range(n)]}, features=features).to_parquet(
        str(path))
    return str(path)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("kappa")
    train, val = _parquet(root / "train.parquet", 16), _parquet(root / "val.parquet", 8)
    out = root / "study"
    command = ["run_image_classification.py", "--model_config", "vit-cpu-cifar", "--config_overrides", TINY,
               "--train_file", train, "--validation_file", val, "--do_train", "--do_eval", "--max_steps", "2",
               "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--learning_rate", "0",
               "--save_strategy", "steps", "--save_steps", "1", "--use_cpu", "--report_to", "none",
               "--disable_tqdm", "true", "--metric_for_best_model", "accuracy"]
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        code = run_main(study_main, ["--out", str(out), "--arms", "default", "conditioned", "--seeds", "1",
                                     "--metric", "eval_accuracy", "--", *command], prog="hf-condinit-study")
    finally:
        os.chdir(cwd)
    assert (code or 0) == 0
    return out, val


def test_the_rebuilt_init_is_the_runs_own(tiny_study):
    from transformers import AutoModelForImageClassification

    out, _ = tiny_study
    for arm in ("default", "conditioned"):
        cell = out / "arms" / arm / "seed0"
        final = AutoModelForImageClassification.from_pretrained(str(cell)).state_dict()
        init = K.rebuild_init(str(cell), 0).state_dict()
        assert final.keys() == init.keys()
        for name, tensor in final.items():
            assert torch.equal(tensor, init[name]), (arm, name)
        assert [s for _, s, _ in K.kept_epochs(str(cell))] == [1, 2]
    other = K.rebuild_init(str(out / "arms" / "default" / "seed0"), 1).state_dict()
    assert not torch.equal(other["classifier.weight"], init["classifier.weight"])  # the seed matters


def test_record_holds_svd_kappa_per_head_and_a_rerun_measures_nothing_again(tiny_study, tmp_path, capsys):
    from transformers import AutoModelForImageClassification

    out, val = tiny_study
    record = tmp_path / "kappa.json"
    argv = ["--study", str(out), "--image_file", val, "--out", str(record), "--images", "2"]
    assert K.main(argv) == 0
    rec = json.loads(record.read_text())
    assert sorted(rec["points"]) == [f"{a}/seed0/epoch{e}" for a in ("conditioned", "default")
                                 for e in (0, 0.5, 1)]  # 16 images, batch 8: 2 steps an epoch
    for arm in ("default", "conditioned"):
        cell = out / "arms" / arm / "seed0"
        model = AutoModelForImageClassification.from_pretrained(str(cell / "checkpoint-2")).eval()
        pixels = K.probe_pixels(val, model.config, 2)
        ref = attention_jacobian_condition_number(model, pixels, method="eig")  # G = J Jᵀ: good to ~κ² eps
        got = rec["points"][f"{arm}/seed0/epoch1"]
        assert got["step"] == 2 and got["layers"][0]["kappa"] == pytest.approx([h.kappa for h in ref.layers[0].heads],
                                                                               rel=1e-4)
        # learning rate 0: the init and every checkpoint have the same κ
        assert rec["points"][f"{arm}/seed0/epoch0"]["layers"] == got["layers"]
    assert rec["points"]["default/seed0/epoch0"]["layers"] != rec["points"]["conditioned/seed0/epoch0"]["layers"]
    assert (tmp_path / "kappa.png").is_file()
    capsys.readouterr()
    assert K.main(argv) == 0
    assert "κ" not in capsys.readouterr().out
