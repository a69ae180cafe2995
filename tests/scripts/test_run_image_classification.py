"""run_image_classification.py end to end on a few images, and its pieces in hf_condinit.vision against naive
references (augmentation, normalisation, accuracy)."""

import json
import os
import re
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_condinit.scripts_common import run_main
from hf_condinit.vision import ImageTransform, load_accuracy_metric, random_crop_flip

from utils import REPO, load_script

run_ic = load_script("run_image_classification.py")

CIFAR_TRAIN = REPO.parent / "shared" / "data" / "cifar10" / "train.parquet"
# A tiny ViT on 32x32 images: 1 layer, 32 wide, 2 heads, patch 8 (16 patches + [CLS]).
TINY = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64,patch_size=8"
COMMON = ["--model_config", "vit-cpu-cifar", "--config_overrides", TINY, "--do_train", "--do_eval",
          "--max_steps", "3", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16",
          "--use_cpu", "--report_to", "none", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0"]
CLASSES = ["red", "green", "blue"]


def _images(n, seed=0):
    """n random 32x32 RGB images, each tinted by its class (class = i % 3), as (PIL images, labels)."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n):
        a = rng.integers(0, 96, size=(32, 32, 3), dtype=np.uint8)
        a[..., i % 3] += 150
        images.append(Image.fromarray(a))
        labels.append(i % 3)
    return images, labels


def _parquet(path, n, seed):
    images, labels = _images(n, seed)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    datasets.Dataset.from_dict({"img": images, "label": labels}, features=features).to_parquet(str(path))
    return str(path)


def _imagefolder(root, n, seed):
    images, labels = _images(n, seed)
    for i, (im, y) in enumerate(zip(images, labels)):
        os.makedirs(root / CLASSES[y], exist_ok=True)
        im.save(root / CLASSES[y] / f"{i}.png")
    return str(root)


# --------------------------------------------------------------------------------------------------------------------
# pieces


def _naive_crop_flip(images, padding, flip, seed):
    """Per image: paste into a zero canvas, cut the window at the drawn offset, mirror the columns if drawn."""
    gen = torch.Generator().manual_seed(seed)
    B, C, H, W = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (B, 2), generator=gen).tolist()
    flips = (torch.rand(B, generator=gen) < 0.5).tolist() if flip else [False] * B
    out = torch.empty_like(images)
    for b in range(B):
        canvas = torch.zeros(C, H + 2 * padding, W + 2 * padding, dtype=images.dtype)
        canvas[:, padding:padding + H, padding:padding + W] = images[b]
        y, x = offsets[b]
        for i in range(H):
            for j in range(W):
                out[b, :, i, j] = canvas[:, y + i, x + (W - 1 - j if flips[b] else j)]
    return out


def test_random_crop_flip_matches_a_naive_reference():
    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    got = random_crop_flip(images, 2, True, torch.Generator().manual_seed(3))
    assert torch.equal(got, _naive_crop_flip(images, 2, True, 3))
    assert not torch.equal(got, images)  # something moved
    assert torch.equal(random_crop_flip(images, 0, False, torch.Generator()), images)


def test_eval_transform_normalises_and_resizes():
    a = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    t = ImageTransform("img", "label", (16, 16), (0.5, 0.4, 0.3), (0.5, 0.2, 0.1), train=False)
    out = t({"img": [Image.fromarray(a)], "label": [2]})
    want = (torch.from_numpy(a).permute(2, 0, 1).double() / 255 - torch.tensor([0.5, 0.4, 0.3]).double()[:, None, None]) \
        / torch.tensor([0.5, 0.2, 0.1]).double()[:, None, None]
    assert out["labels"] == [2]
    torch.testing.assert_close(out["pixel_values"][0].double(), want, rtol=0, atol=1e-5)
    small = ImageTransform("img", "label", (8, 8), (0.5,) * 3, (0.5,) * 3, train=False)
    assert small({"img": [Image.fromarray(a).convert("L")]})["pixel_values"][0].shape == (3, 8, 8)


def test_accuracy_metric_is_the_fraction_of_matches():
    rng = np.random.default_rng(0)
    preds, refs = rng.integers(0, 10, 200), rng.integers(0, 10, 200)
    got = load_accuracy_metric().compute(predictions=preds, references=refs)
    assert got == {"accuracy": sum(int(p == r) for p, r in zip(preds, refs)) / 200}


# --------------------------------------------------------------------------------------------------------------------
# end to end


def _eval_results(out):
    with open(os.path.join(out, "eval_results.json")) as f:
        return json.load(f)


def _reference_accuracy(model_dir, images, labels):
    """Accuracy of the saved model on the images, with the normalisation written out by hand (mean = std = 0.5)."""
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    x = torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32)).permute(2, 0, 1) for im in images])
    with torch.no_grad():
        logits = model(pixel_values=(x / 255 - 0.5) / 0.5).logits
    return int((logits.argmax(-1) == torch.tensor(labels)).sum()) / len(labels)


def test_parquet_mimetic_end_to_end(tmp_path):
    train = _parquet(tmp_path / "train.parquet", 24, seed=0)
    valid = _parquet(tmp_path / "valid.parquet", 12, seed=1)
    out = str(tmp_path / "out")
    results = run_ic.main(["--init", "mimetic", "--train_file", train, "--validation_file", valid,
                           "--output_dir", out, *COMMON])
    saved = _eval_results(out)
    assert saved["eval_samples"] == 12 and saved["eval_accuracy"] == results["eval_accuracy"]
    images, labels = _images(12, seed=1)
    assert saved["eval_accuracy"] == pytest.approx(_reference_accuracy(out, images, labels), abs=1e-9)
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["condinit"]["method"] == "mimetic"
    assert config["id2label"] == {"0": "red", "1": "green", "2": "blue"}
    assert os.path.isfile(os.path.join(out, "preprocessor_config.json"))  # the image processor travels with it


def test_imagefolder_conditioned_logs_kappa(tmp_path):
    train = _imagefolder(tmp_path / "train", 18, seed=0)
    out = str(tmp_path / "out")
    run_ic.main(["--init", "conditioned", "--train_file", train, "--train_val_split", "0.34", "--output_dir", out,
                 "--log_condition_number_every", "3", "--condition_number_probe_size", "1", *COMMON])
    assert 0.0 <= _eval_results(out)["eval_accuracy"] <= 1.0
    with open(os.path.join(out, "condition_number.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [0, 3]
    assert all(r["log"]["kappa/mean"] >= 1.0 for r in records)
    assert records[0]["probe_shape"] == [1, 3, 32, 32]


@pytest.mark.skipif(not CIFAR_TRAIN.exists(), reason="needs ../shared/data/cifar10")
def test_real_cifar_slice(tmp_path):
    out = str(tmp_path / "out")
    run_ic.main(["--train_file", str(CIFAR_TRAIN), "--max_train_samples", "32", "--max_eval_samples", "16",
                 "--output_dir", out, *COMMON])
    saved = _eval_results(out)
    assert saved["eval_samples"] == 16 and 0.0 <= saved["eval_accuracy"] <= 1.0
    assert json.load(open(os.path.join(out, "config.json")))["id2label"]["3"] == "cat"


@pytest.mark.parametrize("flags, message", [
    (["--train_file", "/nonexistent/train.parquet"], "does not exist"),
    (["--train_file", __file__], "is not a .parquet file"),
    ([], "needs data"),
])
def test_bad_data_flags_fail_before_any_work(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        run_ic.main([*flags, "--output_dir", str(tmp_path / "out"), "--do_train"])


def test_swin_from_a_config_path(tmp_path):
    from transformers import SwinConfig

    SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
               mlp_ratio=2.0).save_pretrained(tmp_path / "swin")
    train = _parquet(tmp_path / "train.parquet", 16, seed=0)
    out = str(tmp_path / "out")
    common = [a for a in COMMON if a not in ("vit-cpu-cifar", TINY, "--model_config", "--config_overrides")]
    run_ic.main(["--init", "conditioned", "--model_config", str(tmp_path / "swin"), "--train_file", train,
                 "--validation_file", train, "--output_dir", out, *common])
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == "swin" and config["condinit"]["layout"] == "swin_qkvo_proj"
    assert 0.0 <= _eval_results(out)["eval_accuracy"] <= 1.0


# --------------------------------------------------------------------------------------------------------------------
# the script policy shared with run_clm.py / run_mlm.py / run_glue.py


@pytest.fixture
def no_work(monkeypatch):
    """Any data loading or model building fails the test: the checks must come first."""

    def boom(*a, **k):
        raise AssertionError("work started before the input was validated")

    monkeypatch.setattr(run_ic, "load_image_datasets", boom)
    monkeypatch.setattr(run_ic.AutoModelForImageClassification, "from_config", boom)
    monkeypatch.setattr(run_ic.AutoModelForImageClassification, "from_pretrained", boom)


def _exit_line(argv, capsys):
    """Run the script as ``__main__`` would (``run_main``); returns (exit code, stderr lines)."""
    capsys.readouterr()  # drop what the test's own set-up printed
    with pytest.raises(SystemExit) as exit_info:
        run_main(run_ic.main, argv, prog="run_image_classification.py")
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def test_flags_that_cannot_work_exit_2_before_any_work(tmp_path, capsys, no_work):
    train = _parquet(tmp_path / "train.parquet", 6, seed=0)
    saved = tmp_path / "saved"
    saved.mkdir()
    cases = [
        (["--attention", "flash_attention_2"], "needs a GPU"),
        (["--attention", "paged|eager"], "continuous batching"),
        (["--init", "mimetic", "--value_init", "per_head"], "value_init is read by method 'conditioned' only"),
        (["--model_config", "no-such-config"], "not a config in"),
        (["--config_overrides", "hidden_sizes=3"], "has no attribute 'hidden_sizes'"),
        (["--model_name_or_path", str(saved), "--init", "conditioned"], "--init cannot be used with --model_name_or_path"),
        (["--model_name_or_path", str(saved), "--model_config", "vit-cpu-cifar"], "--model_config describes a new model"),
    ]
    out = tmp_path / "out"
    for argv, message in cases:
        code, err = _exit_line(["--train_file", train, "--output_dir", str(out), "--do_train", "--use_cpu", *argv],
                               capsys)
        assert code == 2 and len(err) == 1 and message in err[0], (argv, err)
        assert err[0].startswith("run_image_classification.py: error: ")
        assert not out.exists()


def test_bad_files_exit_2_with_one_line_and_leave_nothing(tmp_path, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was built before the data was validated")

    monkeypatch.setattr(run_ic.AutoModelForImageClassification, "from_config", boom)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(bytes(range(256)) * 8)
    no_images = tmp_path / "no_images.parquet"
    datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}).to_parquet(str(no_images))
    good = _parquet(tmp_path / "good.parquet", 6, seed=0)
    cases = [
        (["--train_file", str(garbage)], r"--train_file '.*garbage\.parquet' is not a readable parquet file"),
        (["--train_file", good, "--validation_file", str(garbage)], r"--validation_file '.*garbage\.parquet'"),
        (["--train_file", str(no_images)], r"cannot tell the image column among .*; pass --image_column_name"),
    ]
    out = tmp_path / "out"
    for argv, message in cases:
        code, err = _exit_line([*argv, "--output_dir", str(out), *COMMON], capsys)
        assert code == 2 and len(err) == 1 and re.search(message, err[0]), (argv, err)
        assert not out.exists(), f"{argv} left {list(out.rglob('*'))}"


def test_a_rerun_into_a_finished_output_dir_is_refused(tmp_path, capsys, monkeypatch):
    train = _parquet(tmp_path / "train.parquet", 12, seed=0)
    argv = ["--train_file", train, "--validation_file", train, "--output_dir", str(tmp_path / "out"), *COMMON]
    run_ic.main(argv)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())

    def boom(*a, **k):
        raise AssertionError("the rerun loaded data or built a model")

    monkeypatch.setattr(run_ic, "load_image_datasets", boom)
    monkeypatch.setattr(run_ic.AutoModelForImageClassification, "from_config", boom)
    code, err = _exit_line(argv, capsys)
    assert code == 2 and len(err) == 1 and "already holds a finished run" in err[0], err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


def test_each_arm_gets_its_own_default_output_dir(tmp_path):
    train = _parquet(tmp_path / "train.parquet", 3, seed=0)
    dirs = [run_ic.parse(["--train_file", train, *arm])[0][3].output_dir for arm in (
        [], ["--init", "conditioned"], ["--init", "mimetic"], ["--attention", "affine_scaled"],
        ["--init", "conditioned", "--spectral_lambda", "10"],
    )]  # fmt: skip
    assert len(set(dirs)) == 5 and dirs[2] == os.path.join("runs", "image-mimetic-sdpa")
    assert run_ic.parse(["--train_file", train, "--output_dir", "x"])[0][3].output_dir == "x"


def test_the_script_exits_2_with_one_line(tmp_path):
    """As a program (``python run_image_classification.py``): a user error is one line and exit code 2."""
    train = _parquet(tmp_path / "train.parquet", 3, seed=0)
    proc = subprocess.run([sys.executable, str(REPO / "run_image_classification.py"), "--train_file", train,
                           "--init", "mimetic", "--value_init", "per_head", "--output_dir", str(tmp_path / "out"),
                           "--do_train", "--use_cpu"], capture_output=True, text=True, cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith("run_image_classification.py: error: ") and "value_init" in err[0]
    assert not (tmp_path / "out").exists()
