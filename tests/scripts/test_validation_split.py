"""``--validation_split_percentage``: whole and fractional percentages (HF's example flag), streamed or not, in
run_clm.py and run_mlm.py; the validation rows are the first ``round(n · p / 100)`` rows of the training file.

The reference for the scripts is the same run given those rows as an explicit ``--validation_file`` (and the rest as
``--train_file``): the same tokenizer, blocks and model (learning rate 0: the model as built), so the same losses.
For whole percentages the rows are ``datasets``' own ``train[:p%]`` slice.
"""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from datasets import load_dataset  # noqa: E402

from hf_condinit.data.text import split_validation  # noqa: E402

from utils import load_script  # noqa: E402

run_clm = load_script("run_clm.py")
run_mlm = load_script("run_mlm.py")

WORDS = "the cat dog sat on a mat and ran far away home big small red blue".split()
LINES = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(12 + i % 5)) for i in range(80)]


@pytest.mark.parametrize("n_rows, percentage, expected", [
    (40, 12.5, 5), (80, 12.5, 10), (80, 10, 8), (200, 0.5, 1), (10, 15, 2), (30, 5, 2), (50, 5, 2), (7, 33.3, 2),
])  # fmt: skip
def test_split_validation_takes_the_first_rows(n_rows, percentage, expected):
    from datasets import Dataset

    ds = Dataset.from_dict({"text": [f"row {i}" for i in range(n_rows)]})
    split = split_validation(ds, n_rows, percentage)
    assert split["validation"]["text"] == [f"row {i}" for i in range(expected)]
    assert split["train"]["text"] == [f"row {i}" for i in range(expected, n_rows)]
    streamed = split_validation(ds.to_iterable_dataset(), n_rows, percentage)
    assert [r["text"] for r in streamed["validation"]] == split["validation"]["text"]
    assert [r["text"] for r in streamed["train"]] == split["train"]["text"]


@pytest.mark.parametrize("percentage", [1, 5, 10, 15, 33, 50])
def test_a_whole_percentage_takes_the_rows_of_datasets_own_slice(percentage, tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("".join(f"row {i}\n" for i in range(30)))
    whole = load_dataset("text", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
    try:
        head = load_dataset("text", data_files=str(path), split=f"train[:{percentage}%]", cache_dir=str(tmp_path / "c"))
    except ValueError as err:  # datasets refuses a slice of no row
        assert "corresponds to no data" in str(err)
        with pytest.raises(ValueError, match="is no row"):
            split_validation(whole, len(whole), percentage)
        return
    assert split_validation(whole, len(whole), percentage)["validation"]["text"] == head["text"]


def _common(tmp_path, out):
    return ["--output_dir", str(tmp_path / out), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true",
            "--seed", "5", "--learning_rate", "0", "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "4", "--cache_dir", str(tmp_path / f"cache-{out}"), "--save_strategy", "no"]


SCRIPTS = {
    "run_clm": (run_clm, ["--model_config", "gpt2-tiny", "--block_size", "16", "--tokenizer_vocab_size", "300"]),
    "run_mlm": (run_mlm, ["--config_overrides", "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,"
                          "intermediate_size=64", "--max_seq_length", "16"]),
}


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """One WordPiece for every run_mlm run (training one is not deterministic: ties come out in any order)."""
    from hf_condinit.models.crammed_bert import train_wordpiece_tokenizer

    folder = tmp_path_factory.mktemp("wordpiece")
    train_wordpiece_tokenizer(iter([LINES]), vocab_size=200, model_max_length=16).save_pretrained(folder)
    return str(folder)


def _results(script, argv, tmp_path, out, wordpiece):
    module, flags = SCRIPTS[script]
    if script == "run_mlm":
        flags = flags + ["--tokenizer_name", wordpiece]
    module.main(_common(tmp_path, out) + flags + argv)
    return json.loads((tmp_path / out / "all_results.json").read_text())


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("percentage, n_validation, streaming", [("12.5", 10, False), ("10", 8, False),
                                                                 ("12.5", 10, True)])
def test_the_scripts_split_as_an_explicit_validation_file(script, percentage, n_validation, streaming, tmp_path,
                                                          wordpiece):
    train = tmp_path / "train.txt"
    train.write_text("".join(line + "\n" for line in LINES))
    head, rest = tmp_path / "head.txt", tmp_path / "rest.txt"
    head.write_text("".join(line + "\n" for line in LINES[:n_validation]))
    rest.write_text("".join(line + "\n" for line in LINES[n_validation:]))
    split = _results(script, ["--train_file", str(train), "--validation_split_percentage", percentage,
                              *(["--streaming"] if streaming else [])], tmp_path, "split", wordpiece)
    reference = _results(script, ["--train_file", str(rest), "--validation_file", str(head)], tmp_path, "files",
                         wordpiece)
    assert split["eval_samples"] == reference["eval_samples"] > 0
    assert split["eval_loss"] == reference["eval_loss"]  # learning rate 0: the same model on the same blocks
    if not streaming:  # a stream is read in order, the cached blocks in the sampler's shuffled order
        assert split["train_loss"] == reference["train_loss"]
