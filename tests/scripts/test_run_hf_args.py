"""The scripts take HF's own ``run_*.py`` flags: ``--model_type`` + ``--config_overrides`` (train from
scratch), the hub fields (``--model_revision``, ``--trust_remote_code``, ``--use_fast_tokenizer``, ``--dtype``,
``--config_name``, ``--train_dir``), ``run_glue.py`` on one's own csv / json files without ``--task_name``, and
refuse what cannot work with one line each. Tiny models, a few steps, no hub."""

import csv
import dataclasses
import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

from transformers import AutoConfig, TrainingArguments  # noqa: E402

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


HF_EXAMPLE_ARGS = Path(__file__).parents[1] / "data" / "hf_example_args.json"
SCRIPTS = {"run_clm.py": run_clm, "run_mlm.py": run_mlm, "run_glue.py": run_glue,
           "run_image_classification.py": run_image_classification}
PLACEHOLDER_TYPES = {"distilbert/distilbert-base-uncased": "distilbert", "distilbert/distilgpt2": "gpt2",
                     "openai-community/gpt2": "gpt2", "distilbert/distilroberta-base": "roberta",
                     "google/vit-base-patch16-224-in21k": "vit"}


def _typed(value: str):
    """A command-line value as HF's parser types it for the field it names: booleans, ints, floats, else text."""
    if value in ("True", "False"):
        return value == "True"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _flag_values(argv: list[str]) -> dict[str, object]:
    """``{field name: typed value}`` of ``--flag value`` / ``--flag=value`` / a bare ``--flag`` (True)."""
    values, i = {}, 0
    while i < len(argv):
        flag, _, attached = argv[i].removeprefix("--").partition("=")
        if attached:
            values[flag] = _typed(attached)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values[flag], i = _typed(argv[i + 1]), i + 1
        else:
            values[flag] = True
        i += 1
    return values


@pytest.fixture
def hf_placeholders(tmp_path):
    """HF's hub names and fixture files as local stand-ins: a folder with a config.json of the hub model's type per
    model, an imagefolder for the hub image dataset, MRPC-shaped csv files and a small text file."""
    rng = random.Random(2)
    mapping = {"{tmp_dir}": str(tmp_path / "hf_out")}
    for name, model_type in PLACEHOLDER_TYPES.items():
        folder = tmp_path / "models" / name.replace("/", "--")
        AutoConfig.for_model(model_type).save_pretrained(folder)
        mapping[f"{{model:{name}}}"] = str(folder)
    for label in ("cat", "dog"):
        (tmp_path / "cats_vs_dogs" / label).mkdir(parents=True)
    mapping["{dataset:hf-internal-testing/cats_vs_dogs_sample}"] = str(tmp_path / "cats_vs_dogs")
    rows = [[rng.choice(["equivalent", "not_equivalent"]), " ".join(rng.choices(WORDS, k=8)),
             " ".join(rng.choices(WORDS, k=8))] for _ in range(12)]
    mapping["{mrpc_train}"] = _write_csv(tmp_path / "train.csv", ["label", "sentence1", "sentence2"], rows)
    mapping["{mrpc_dev}"] = _write_csv(tmp_path / "dev.csv", ["label", "sentence1", "sentence2"], rows[:4])
    (tmp_path / "sample_text.txt").write_text("".join(" ".join(rng.choices(WORDS, k=10)) + "\n" for _ in range(30)))
    mapping["{sample_text}"] = str(tmp_path / "sample_text.txt")
    return mapping


def test_hfs_own_test_argument_lists_parse_with_hfs_meaning(hf_placeholders, tmp_path):
    """HF's ``examples/pytorch/test_pytorch_examples.py`` argument lists for run_clm / run_mlm / run_glue /
    run_image_classification (tests/data/hf_example_args.json, placeholders mapped to local stand-ins): each
    script's parse takes every list, and every flag lands in the field of HF's name with the value as given.
    ``--overwrite_output_dir``, gone from transformers 5's ``TrainingArguments``, is refused with one line."""
    record = json.loads(HF_EXAMPLE_ARGS.read_text())
    removed = set(record["removed_in_transformers_5"])
    assert removed.isdisjoint("--" + f.name for f in dataclasses.fields(TrainingArguments))
    assert set(record["tests"]) == {"test_run_glue", "test_run_clm", "test_run_clm_config_overrides",
                                    "test_run_mlm", "test_run_image_classification"}
    for test, entry in record["tests"].items():
        script, *argv = entry["argv"]
        argv = [hf_placeholders.get(a, a) for a in argv] + entry["device_flags"]
        assert not [a for a in argv if a.startswith("{")], f"{test}: unmapped placeholder"
        if removed & set(argv):
            with pytest.raises(UsageError, match="^unknown flag --overwrite_output_dir"):
                SCRIPTS[script].parse(argv)
        kept = []
        for i, arg in enumerate(argv):  # drop the removed flags and their value
            if arg not in removed and not (i and argv[i - 1] in removed and arg in ("True", "False")):
                kept.append(arg)
        parsed, _ = SCRIPTS[script].parse(kept)
        for name, value in _flag_values(kept).items():
            holders = [args for args in parsed if hasattr(args, name)]
            assert holders, f"{test}: no field {name!r} (HF's name) in {script}"
            assert all(getattr(args, name) == value for args in holders), (test, name, value)


REMOTE_CONFIG = '''from transformers import GPT2Config


class TinyRemoteConfig(GPT2Config):
    model_type = "tiny_remote_gpt2"
'''
REMOTE_MODELING = '''from transformers import GPT2LMHeadModel

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteLMHeadModel(GPT2LMHeadModel):
    config_class = TinyRemoteConfig
'''


@pytest.fixture
def remote_code_model(tmp_path, text_file):
    """A folder holding a model whose code lives next to its weights (``auto_map`` to ``modeling_tiny_remote.py``,
    a ``model_type`` transformers does not know), with a BPE tokenizer: what ``--trust_remote_code`` is for."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_condinit.data import batch_iterator, train_bpe_tokenizer

    folder = tmp_path / "remote_model"
    lines = Path(text_file).read_text().splitlines()
    tokenizer = train_bpe_tokenizer(batch_iterator(lines), vocab_size=300, model_max_length=64)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=len(tokenizer),
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "configuration_tiny_remote.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny_remote.py").write_text(REMOTE_MODELING)
    saved = json.loads((folder / "config.json").read_text())
    saved.update(model_type="tiny_remote_gpt2",
                 auto_map={"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                           "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteLMHeadModel"})
    (folder / "config.json").write_text(json.dumps(saved))
    return str(folder)


def test_trust_remote_code_runs_a_folders_own_model_code(tmp_path, text_file, remote_code_model):
    """``--trust_remote_code``: ``run_clm.py`` continues a model whose class lives in its folder (the class, not
    GPT-2's, is what trains and is saved); without the flag, one line naming the flag (exit 2) and nothing written.
    A checkpoint of this plugin with an attention variant (``condinit_modeling.py``) is not refused."""
    argv = ["--model_name_or_path", remote_code_model, "--train_file", text_file, "--block_size", "16",
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--max_eval_samples", "4"]
    with pytest.raises(UsageError, match="^--model_name_or_path .*remote_model runs its own model code .*"
                                         "pass --trust_remote_code"):
        run_clm.main(_common(tmp_path) + argv)
    assert not (tmp_path / "out").exists()
    results = run_clm.main(_common(tmp_path) + argv + ["--trust_remote_code"])
    assert "perplexity" in results and results["train_runtime"] > 0
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["model_type"] == "tiny_remote_gpt2"
    assert saved["architectures"] == ["TinyRemoteLMHeadModel"]
    assert (tmp_path / "out" / "modeling_tiny_remote.py").is_file()  # save_pretrained copies the class's code
    # the plugin's own portable checkpoints (auto_map to condinit_modeling.py) load without the flag
    from transformers import AutoModelForCausalLM, GPT2Config

    from hf_condinit.scripts.flag_checks import check_remote_code

    portable = tmp_path / "portable"
    AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=64),
                                     attn_implementation="affine_scaled").save_pretrained(portable)
    assert "auto_map" in json.loads((portable / "config.json").read_text())
    check_remote_code(str(portable), trust_remote_code=False)
