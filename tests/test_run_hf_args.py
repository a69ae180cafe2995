"""Issue 37: the scripts take HF's own ``run_*.py`` flags: ``--model_type`` + ``--config_overrides`` (train from
scratch), the hub fields (``--model_revision``, ``--trust_remote_code``, ``--use_fast_tokenizer``, ``--dtype``,
``--config_name``, ``--train_dir``), ``run_glue.py`` on one's own csv / json files without ``--task_name``, and
refuse what cannot work with one line each. Tiny models, a few steps, no hub."""

import csv
import json
import os
import random

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

from transformers import AutoConfig  # noqa: E402

from hf_condinit.scripts_common import UsageError  # noqa: E402

from utils import load_script  # noqa: E402

run_clm = load_script("run_clm.py")
run_mlm = load_script("run_mlm.py")
run_glue = load_script("run_glue.py")
run_image_classification = load_script("run_image_classification.py")

WORDS = "good bad fine great awful nice poor okay plain dull bright dark".split()
TINY_BERT = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64"


def _common(tmp_path, out="out"):
    return ["--output_dir", str(tmp_path / out), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true",
            "--cache_dir", str(tmp_path / "cache"), "--seed", "3", "--save_strategy", "no"]


@pytest.fixture
def text_file(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "text.txt"
    path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "\n" for _ in range(300)))
    return str(path)


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


HF_FLAGS = ["--model_revision", "main", "--trust_remote_code"]
TOKENIZER_FLAGS = ["--use_fast_tokenizer", "False"]  # HF's text scripts only


def test_every_script_takes_hfs_hub_flags(tmp_path, text_file):
    """The parse of each script takes HF's hub fields with HF's meaning and defaults."""
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    parses = [
        (run_clm.parse, TOKENIZER_FLAGS + ["--train_file", text_file, "--dtype", "float32", "--config_name", "gpt2-tiny"]),
        (run_mlm.parse, TOKENIZER_FLAGS + ["--train_file", text_file, "--model_type", "bert"]),
        (run_glue.parse, TOKENIZER_FLAGS + ["--train_file", text_file]),
        (run_image_classification.parse, ["--train_dir", str(tmp_path / "images"), "--model_type", "vit"]),
    ]
    for parse, argv in parses:
        (model_args, data_args, *_), _ = parse(_common(tmp_path) + HF_FLAGS + argv)
        assert model_args.model_revision == "main" and model_args.trust_remote_code is True
        assert model_args.hub_kwargs()["revision"] == "main"
    (model_args, data_args, *_), _ = run_clm.parse(_common(tmp_path) + ["--train_file", text_file])
    assert (model_args.model_revision, model_args.trust_remote_code, model_args.use_fast_tokenizer) == ("main", False, True)
    assert model_args.model_type is None and data_args.streaming is False
    (model_args, data_args, *_), _ = run_image_classification.parse(
        _common(tmp_path) + ["--train_dir", str(tmp_path / "images"), "--config_name", "vit-cpu-cifar"])
    assert data_args.train_file == str(tmp_path / "images") and model_args.model_config == "vit-cpu-cifar"


def test_model_type_trains_from_scratch(tmp_path, text_file):
    """HF's way to train from scratch: the model type's default config with --config_overrides typed like it."""
    run_clm.main(_common(tmp_path) + [
        "--model_type", "gpt2", "--config_overrides", "n_layer=2,n_embd=64,n_head=2,n_positions=64",
        "--train_file", text_file, "--block_size", "32", "--tokenizer_vocab_size", "300", "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--max_eval_samples", "4",
    ])  # fmt: skip
    config = AutoConfig.from_pretrained(tmp_path / "out")
    assert (config.model_type, config.n_layer, config.n_embd, config.n_head, config.n_positions) == ("gpt2", 2, 64, 2, 64)
    assert config.n_inner is None and config.activation_function == "gelu_new"  # the rest: GPT-2's own defaults
    assert "perplexity" in json.loads((tmp_path / "out" / "eval_results.json").read_text())


@pytest.fixture
def no_model(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("work started before the input was validated")

    for script, auto in ((run_clm, "AutoModelForCausalLM"), (run_mlm, "AutoModelForMaskedLM"),
                         (run_image_classification, "AutoModelForImageClassification")):
        monkeypatch.setattr(getattr(script, auto), "from_config", boom)
        monkeypatch.setattr(getattr(script, auto), "from_pretrained", boom)


def test_bad_hf_flags_are_one_line_errors(tmp_path, text_file, no_model):
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    cases = [
        (run_clm, ["--train_file", text_file, "--model_type", "gtp2"], r"--model_type 'gtp2' \(did you mean 'gpt2'"),
        (run_clm, ["--train_file", text_file, "--model_type", "vit"], "has no AutoModelForCausalLM model"),
        (run_clm, ["--train_file", text_file, "--model_type", "gpt2", "--model_config", "gpt2-tiny"], "pass one"),
        (run_clm, ["--train_file", text_file, "--model_type", "gpt2", "--config_overrides", "n_layers=2"],
         "GPT2Config has no attribute 'n_layers'"),
        (run_clm, ["--train_file", text_file, "--model_name_or_path", str(tmp_path), "--model_type", "gpt2"],
         "--model_type describes a new model"),
        (run_mlm, ["--train_file", text_file, "--model_type", "gpt2"], "has no AutoModelForMaskedLM model"),
        (run_mlm, ["--train_file", text_file, "--model_type", "bert", "--config_name", "bert"], "pass one"),
        (run_mlm, ["--train_file", text_file, "--pad_to_max_length"], "--pad_to_max_length pads --line_by_line"),
        (run_image_classification, ["--train_dir", str(tmp_path / "images"), "--model_type", "vitt"],
         "did you mean 'vit'"),
        (run_glue, ["--do_train"], "needs --task_name"),
        (run_glue, ["--task_name", "rte", "--dataset_name", "x/y"], "--dataset_name is for one's own data"),
    ]
    for script, argv, message in cases:
        with pytest.raises(UsageError, match=message):
            script.main(_common(tmp_path) + argv)
        assert not (tmp_path / "out").exists()


def test_run_glue_on_ones_own_csv_classification_and_regression(tmp_path):
    """HF's custom path: labels from the file's label column (sorted distinct values; floats: a regression), text
    columns found as HF finds them, accuracy / F1 or Pearson / Spearman from the shipped evaluate module."""
    rng = random.Random(1)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(6))

    cls = {split: _write_csv(tmp_path / f"{split}.csv", ["review", "label"],
                             [[sentence(), rng.choice(["pos", "neg", "neutral"])] for _ in range(n)])
           for split, n in (("train", 48), ("dev", 16))}
    reg = {split: _write_csv(tmp_path / f"{split}_reg.csv", ["sentence1", "sentence2", "label"],
                             [[sentence(), sentence(), round(rng.uniform(0, 5), 2)] for _ in range(n)])
           for split, n in (("train", 48), ("dev", 16))}
    args = ["--config_overrides", TINY_BERT, "--tokenizer_vocab_size", "200", "--max_steps", "2",
            "--per_device_train_batch_size", "8"]
    metrics = run_glue.main(_common(tmp_path, "cls") + args + ["--train_file", cls["train"],
                                                                "--validation_file", cls["dev"]])
    assert {"eval_accuracy", "eval_f1"} <= set(metrics) and 0 <= metrics["eval_f1"] <= 1
    config = AutoConfig.from_pretrained(tmp_path / "cls")
    assert config.id2label == {0: "neg", 1: "neutral", 2: "pos"} and config.finetuning_task == "classification"
    metrics = run_glue.main(_common(tmp_path, "reg") + args + ["--train_file", reg["train"],
                                                                "--validation_file", reg["dev"]])
    assert {"eval_pearson", "eval_spearmanr"} <= set(metrics)
    assert AutoConfig.from_pretrained(tmp_path / "reg").problem_type == "regression"


def test_run_glue_own_files_bad_input(tmp_path, monkeypatch):
    monkeypatch.setattr(run_glue.AutoModelForSequenceClassification, "from_config",
                        lambda *a, **k: pytest.fail("a model was built"))
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a b", "x"], ["c d", "y"]])
    unseen = _write_csv(tmp_path / "dev.csv", ["text", "label"], [["a b", "z"]])
    nolabel = _write_csv(tmp_path / "nolabel.csv", ["text", "score"], [["a b", 1]])
    tsv = tmp_path / "t.tsv"
    tsv.write_text("text\tlabel\na\tx\n")
    cases = [
        (["--train_file", train, "--validation_file", unseen], r"has labels the training data does not: \['z'\]"),
        (["--train_file", nolabel], "has no 'label' column"),
        (["--train_file", str(tsv)], "pass --task_name for GLUE's .tsv files"),
    ]
    for argv, message in cases:
        with pytest.raises(UsageError, match=message):
            run_glue.main(_common(tmp_path) + argv)
        assert not (tmp_path / "out").exists()
