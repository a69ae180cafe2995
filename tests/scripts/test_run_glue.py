"""run_glue.py on small slices of the real GLUE files, the local readers, and bad input."""

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import datasets
import pytest
import torch

from hf_condinit.glue import GlueFormatError, get_task, read_glue_file, task_to_keys
from hf_condinit.models.crammed_bert import CrammedBertConfig, CrammedBertForMaskedLM, train_wordpiece_tokenizer

from utils import GLUE_DIR as GLUE
from utils import WIKI_TRAIN, load_script, needs, require

needs_glue = needs(GLUE)
run_glue = load_script("run_glue.py")

COMMON = [
    "--max_train_samples", "32", "--max_eval_samples", "48", "--max_steps", "3",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16",
    "--do_train", "--do_eval", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
    "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Crammed BERT MLM checkpoint with a WordPiece tokenizer trained on real text."""
    text = require(WIKI_TRAIN)
    lines = [line.strip() for line in text.open(encoding="utf-8") if line.strip()]
    tokenizer = train_wordpiece_tokenizer(lines, vocab_size=2000, model_max_length=64)
    config = CrammedBertConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = CrammedBertForMaskedLM(config)
    out = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def _results(out_dir):
    with open(os.path.join(out_dir, "eval_results.json")) as handle:
        return json.load(handle)


# --------------------------------------------------------------------------------------------------------------------
# readers


@needs_glue
@pytest.mark.parametrize(
    "task, path, n, first",
    [
        ("cola", "CoLA/train.tsv", 8551, {"sentence": "Our friends won't buy this analysis, let alone the next one we propose.", "label": 1}),
        ("cola", "CoLA/dev.tsv", 1043, None),
        ("mrpc", "MRPC/dev.tsv", 408, None),
        ("stsb", "STS-B/dev.tsv", 1500, {"sentence1": "A man with a hard hat is dancing.", "sentence2": "A man wearing a hard hat is dancing.", "label": 5.0}),
        ("rte", "RTE/dev.tsv", 277, None),
        ("qnli", "QNLI/dev.tsv", 5463, None),
        ("mnli", "MNLI/kshot16-42_dev.tsv", 48, None),
        ("qqp", "QQP/kshot16-42_dev.tsv", 32, None),
        ("mnli", "MNLI/train_sample_1k.json", 1000, {"premise": "Salt kept the town fed.", "hypothesis": "Salt kept the town thriving.", "label": 0}),
        ("qqp", "QQP/train_sample_1k.json", 1000, None),
    ],
)
def test_read_real_glue_files(task, path, n, first):
    ds = read_glue_file(str(GLUE / path), task)
    keys = [k for k in task_to_keys[task] if k is not None]
    assert len(ds) == n
    assert ds.column_names == keys + ["label"]
    if first is not None:
        assert ds[0] == first
    if get_task(task).is_regression:
        assert all(0.0 <= v <= 5.0 for v in ds["label"])
    else:
        assert set(ds["label"]) <= set(range(get_task(task).num_labels))
        assert len(set(ds["label"])) > 1


@needs_glue
def test_mrpc_train_header_with_bom_and_labels():
    ds = read_glue_file(str(GLUE / "MRPC" / "train.tsv"), "mrpc")
    assert len(ds) == 3668 and ds.features["label"].names == ["not_equivalent", "equivalent"]
    assert ds[0]["sentence1"].startswith("Amrozi accused his brother") and ds[0]["label"] == 1


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_malformed_tsv_row_names_file_and_line(tmp_path):
    path = _write(
        tmp_path, "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tC.\tD. not_entailment\n",
    )
    with pytest.raises(GlueFormatError, match=r"train\.tsv:3: expected 4 tab-separated fields, found 3"):
        read_glue_file(path, "rte")
    assert len(read_glue_file(path, "rte", bad_lines="skip")) == 1


def test_missing_label_column_names_file_and_line(tmp_path):
    path = _write(tmp_path, "dev.tsv", "index\tsentence1\tsentence2\n0\tA.\tB.\n")
    with pytest.raises(GlueFormatError, match=r"dev\.tsv:1: missing label column for task rte"):
        read_glue_file(path, "rte")
    assert read_glue_file(path, "rte", require_label=False).column_names == ["sentence1", "sentence2"]


def test_bad_label_value_names_file_and_line(tmp_path):
    path = _write(tmp_path, "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tC.\tD.\tmaybe\n")
    with pytest.raises(GlueFormatError, match=r"dev\.tsv:3: label 'maybe' is not a label of task rte"):
        read_glue_file(path, "rte")
    path = _write(tmp_path, "sts.tsv", "sentence1\tsentence2\tscore\nA.\tB.\thigh\n")
    with pytest.raises(GlueFormatError, match=r"sts\.tsv:2: label 'high' is not a number"):
        read_glue_file(path, "stsb")


def test_csv_and_json_readers(tmp_path):
    csv_path = _write(tmp_path, "d.csv", 'sentence1,sentence2,label\n"A, b.",B.,1\nC.,D.,entailment\n')
    ds = read_glue_file(csv_path, "rte")
    assert ds["sentence1"] == ["A, b.", "C."] and ds["label"] == [1, 0]
    bad_csv = _write(tmp_path, "bad.csv", "sentence1,sentence2,label\nA.,B.,1\nC.,D.\n")
    with pytest.raises(GlueFormatError, match=r"bad\.csv:3: expected 3 comma-separated fields, found 2"):
        read_glue_file(bad_csv, "rte")
    jsonl = _write(tmp_path, "d.jsonl", '{"text_a": "A.", "text_b": "B.", "label": "0"}\n{"text_a": "C.", "label": "1"}\n')
    with pytest.raises(GlueFormatError, match=r"d\.jsonl:2: missing text column 'sentence2'"):
        read_glue_file(jsonl, "rte")
    records = _write(tmp_path, "r.json", json.dumps([{"sentence": "good", "label": 1}, {"sentence": "bad", "label": 0}]))
    assert read_glue_file(records, "sst2")["label"] == [1, 0]


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="Unknown GLUE task 'squad'"):
        get_task("squad")
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_glue_file(str(tmp_path / "nope.tsv"), "rte")
    with pytest.raises(ValueError, match="unsupported file extension"):
        read_glue_file(_write(tmp_path, "x.parquet", "x"), "rte")


# --------------------------------------------------------------------------------------------------------------------
# run_glue.py


@needs_glue
@pytest.mark.parametrize(
    "task, folder, keys",
    [
        ("rte", "RTE", {"eval_accuracy"}),
        ("mrpc", "MRPC", {"eval_accuracy", "eval_f1"}),
        ("stsb", "STS-B", {"eval_pearson", "eval_spearmanr"}),
        ("cola", "CoLA", {"eval_matthews_correlation"}),
    ],
)
def test_run_glue_local_tsv(checkpoint, tmp_path, task, folder, keys):
    out = tmp_path / task
    run_glue.main([
        "--model_name_or_path", checkpoint, "--task_name", task,
        "--train_file", str(GLUE / folder / "train.tsv"), "--validation_file", str(GLUE / folder / "dev.tsv"),
        "--output_dir", str(out), *COMMON,
    ])
    results = _results(out)
    assert keys <= set(results), results
    assert results["eval_samples"] == 48
    assert math.isfinite(results["eval_loss"])
    for key in keys:
        low = -1.0 if key in ("eval_pearson", "eval_spearmanr", "eval_matthews_correlation") else 0.0
        value = results[key]
        assert math.isnan(value) or low <= value <= 1.0, (key, value)  # correlations of a constant predictor: nan
    with open(out / "config.json") as handle:
        config = json.load(handle)
    assert config["model_type"] == "crammed_bert"
    if task == "stsb":
        assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    else:
        assert config["id2label"]["0"] == get_task(task).label_list[0]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()


@needs_glue
def test_run_glue_mnli_matched_and_mismatched(checkpoint, tmp_path):
    out = tmp_path / "mnli"
    run_glue.main([
        "--model_name_or_path", checkpoint, "--task_name", "mnli",
        "--train_file", str(GLUE / "MNLI" / "train_sample_1k.json"),
        "--validation_file", str(GLUE / "MNLI" / "kshot16-42_dev.tsv"),
        "--validation_mismatched_file", str(GLUE / "MNLI" / "kshot16-42_train.tsv"),
        "--output_dir", str(out), *COMMON,
    ])
    results = _results(out)
    assert {"eval_accuracy", "eval_accuracy_mm", "eval_loss_mm"} <= set(results)
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and 0.0 <= results["eval_accuracy_mm"] <= 1.0


@needs_glue
def test_run_glue_from_scratch_conditioned_trains_tokenizer(tmp_path):
    out = tmp_path / "scratch"
    run_glue.main([
        "--task_name", "rte", "--init", "conditioned", "--attention", "eager",
        "--config_overrides", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128",
        "--tokenizer_vocab_size", "1000",
        "--train_file", str(GLUE / "RTE" / "train.tsv"), "--validation_file", str(GLUE / "RTE" / "dev.tsv"),
        "--output_dir", str(out), *COMMON,
    ])
    with open(out / "config.json") as handle:
        config = json.load(handle)
    assert config["condinit"]["method"] == "conditioned" and config["condinit"]["seed"] == 0
    assert 0.0 <= _results(out)["eval_accuracy"] <= 1.0


@needs_glue
def test_run_glue_suite_writes_table(checkpoint, tmp_path):
    files = {
        "rte": {"train": str(GLUE / "RTE" / "train.tsv"), "validation": str(GLUE / "RTE" / "dev.tsv")},
        "mrpc": {"train": str(GLUE / "MRPC" / "train.tsv"), "validation": str(GLUE / "MRPC" / "dev.tsv")},
    }
    files_path = tmp_path / "files.json"
    files_path.write_text(json.dumps(files))
    out = tmp_path / "suite"
    result = run_glue.main([
        "--model_name_or_path", checkpoint, "--glue_suite", "--suite_tasks", "rte,mrpc",
        "--suite_files", str(files_path), "--suite_label", "tiny", "--output_dir", str(out), *COMMON,
    ])
    saved = json.loads((out / "glue_suite.json").read_text())
    assert saved["n_tasks"] == 2 and set(saved["tasks"]) == {"rte", "mrpc"}
    assert saved["average"] == pytest.approx(result["average"])
    table = (out / "glue_suite.md").read_text()
    assert table.startswith("| Run | RTE | MRPC (F1/acc) | Avg |") and "| tiny |" in table
    assert (out / "rte" / "eval_results.json").is_file() and (out / "mrpc" / "eval_results.json").is_file()


@needs_glue
def test_task_name_alone_loads_the_hub_dataset(checkpoint, tmp_path, monkeypatch):
    """The hub path cannot run offline: check that it asks for nyu-mll/glue with the task config."""
    calls = []
    local = datasets.DatasetDict(
        train=read_glue_file(str(GLUE / "RTE" / "train.tsv"), "rte"),
        validation=read_glue_file(str(GLUE / "RTE" / "dev.tsv"), "rte"),
    )

    def fake_load_dataset(name, config=None, **kwargs):
        calls.append((name, config))
        return local

    monkeypatch.setattr(run_glue.datasets, "load_dataset", fake_load_dataset)
    out = tmp_path / "hub"
    run_glue.main(["--model_name_or_path", checkpoint, "--task_name", "rte", "--output_dir", str(out), *COMMON])
    assert calls == [("nyu-mll/glue", "rte")]
    assert "eval_accuracy" in _results(out)


@needs_glue
def test_run_glue_bad_inputs(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="Unknown GLUE task 'squad'"):
        run_glue.main(["--model_name_or_path", checkpoint, "--task_name", "squad", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="needs --task_name"):
        run_glue.main(["--model_name_or_path", checkpoint, "--output_dir", str(tmp_path)])
    bad = tmp_path / "train.tsv"
    lines = (GLUE / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()[:6]
    lines[4] = lines[4].rsplit("\t", 1)[0]  # drop the label field of data row 4 (file line 5)
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # user errors: UsageError (a ValueError) with the reader's message; run_main prints it as one line, exit 2
    with pytest.raises(ValueError, match=r"train\.tsv:5: expected 4 tab-separated fields, found 3"):
        run_glue.main([
            "--model_name_or_path", checkpoint, "--task_name", "rte", "--train_file", str(bad),
            "--validation_file", str(GLUE / "RTE" / "dev.tsv"), "--output_dir", str(tmp_path / "o"), *COMMON,
        ])
    with pytest.raises(ValueError, match=r"test\.tsv:1: missing label column for task rte"):
        run_glue.main([
            "--model_name_or_path", checkpoint, "--task_name", "rte", "--train_file", str(GLUE / "RTE" / "train.tsv"),
            "--validation_file", str(GLUE / "RTE" / "test.tsv"), "--output_dir", str(tmp_path / "o2"), *COMMON,
        ])
    with pytest.raises(ValueError, match="missing.tsv"):
        run_glue.main([
            "--model_name_or_path", checkpoint, "--task_name", "rte", "--train_file", str(tmp_path / "missing.tsv"),
            "--output_dir", str(tmp_path / "o3"), *COMMON,
        ])


@pytest.mark.parametrize("script", ["run_glue.py", "run_mlm.py"])
def test_help_formats(script, capsys):
    """Every help string must format: a bare '%' in a field's help breaks ``--help`` in argparse."""
    module = load_script(script)  # imported once per session: the module the other tests use
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0 and "--init" in capsys.readouterr().out
