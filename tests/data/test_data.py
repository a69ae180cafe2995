"""hf_condinit.data: synthetic corpus, text loading/validation/packing, offline BPE."""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from hf_condinit.data import (  # noqa: E402
    MQARSpec,
    batch_iterator,
    check_data_file,
    group_texts,
    load_raw_datasets,
    make_mqar_datasets,
    make_mqar_texts,
    mqar_recall_accuracy,
    mqar_tokenizer,
    mqar_value_positions,
    pack_datasets,
    tokenize_datasets,
    train_bpe_tokenizer,
)

from utils import TINYSTORIES, WIKI_VALID, needs  # noqa: E402

needs_tinystories = needs(TINYSTORIES)
needs_wikitext = needs(WIKI_VALID)


# ---------------------------------------------------------------------------------------------- synthetic (MQAR)


def test_mqar_is_deterministic_and_seeded():
    spec = MQARSpec(n_pairs=4, n_queries=6, n_keys=10, n_values=7)
    a = make_mqar_texts(50, spec, seed=3)
    assert a == make_mqar_texts(50, spec, seed=3)
    assert a != make_mqar_texts(50, spec, seed=4)
    ds = make_mqar_datasets(20, 10, spec, seed=3)
    assert list(ds["train"]["text"]) == a[:20]
    assert list(ds["validation"]["text"]) != make_mqar_texts(10, spec, seed=3)  # its own stream


def test_mqar_answers_are_consistent():
    spec = MQARSpec(n_pairs=5, n_queries=9, n_keys=12, n_values=4)
    for text in make_mqar_texts(30, spec, seed=0):
        words = text.split()
        assert len(words) == spec.seq_len and words[-1] == "<|endoftext|>" and words[2 * spec.n_pairs] == "|"
        pairs = dict(zip(words[0 : 2 * spec.n_pairs : 2], words[1 : 2 * spec.n_pairs : 2]))
        assert len(pairs) == spec.n_pairs  # distinct keys
        q = words[2 * spec.n_pairs + 1 : -1]
        for key, value in zip(q[0::2], q[1::2]):
            assert pairs[key] == value


def test_mqar_tokenizer_and_accuracy():
    spec = MQARSpec()
    tok = mqar_tokenizer(spec)
    texts = make_mqar_texts(8, spec, seed=1)
    ids = np.array(tok(texts)["input_ids"])
    assert ids.shape == (8, spec.seq_len)
    assert tok.decode(ids[0]).split() == texts[0].split()
    assert len(tok) == 3 + spec.n_keys + spec.n_values and tok.eos_token_id == 0
    # the perfect predictor (prediction at t is token t+1) scores 1; predicting the key itself scores 0
    perfect = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)
    assert mqar_recall_accuracy(perfect, ids, spec) == 1.0
    assert mqar_recall_accuracy(ids, ids, spec) == 0.0
    pos = mqar_value_positions(spec)
    half = perfect.copy()
    half[:, pos[::2] - 1] = 1  # wrong on every other query
    assert mqar_recall_accuracy(half, ids, spec) == pytest.approx((len(pos) - len(pos[::2])) / len(pos))
    with pytest.raises(ValueError):
        mqar_recall_accuracy(ids[:, :-1], ids[:, :-1], spec)


def test_mqar_spec_validation():
    with pytest.raises(ValueError, match="distinct"):
        MQARSpec(n_pairs=40, n_keys=32)


# ---------------------------------------------------------------------------------------------- file checks


def test_check_data_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_data_file(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        check_data_file(str(tmp_path / "empty.txt"))
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    with pytest.raises(ValueError, match="only whitespace"):
        check_data_file(str(tmp_path / "blank.txt"), "validation_file")
    (tmp_path / "x.parquet").write_text("abc")
    with pytest.raises(ValueError, match="unsupported extension"):
        check_data_file(str(tmp_path / "x.parquet"))
    with pytest.raises(ValueError, match="directory"):
        check_data_file(str(tmp_path))
    (tmp_path / "ok.raw").write_text("hello\n")
    assert check_data_file(str(tmp_path / "ok.raw")) == "text"
    (tmp_path / "ok.jsonl").write_text('{"text": "hi"}\n')
    assert check_data_file(str(tmp_path / "ok.jsonl")) == "json"


# ---------------------------------------------------------------------------------------------- loading


def _lines(n):
    out = []
    for i in range(n):
        out.append(f"line {i} of the corpus")
        if i % 3 == 0:
            out.append("")  # blank lines, as in WikiText
            out.append("   ")
    return out


def test_text_blank_lines_and_validation_split(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("\n".join(_lines(100)) + "\n")
    raw, col = load_raw_datasets(train_file=str(f), validation_split_percentage=10, cache_dir=str(tmp_path / "c"))
    assert col == "text" and set(raw) == {"train", "validation"}
    rows = list(raw["train"]["text"]) + list(raw["validation"]["text"])
    assert all(t.strip() for t in rows), "blank rows must be dropped"
    assert len(rows) == 100
    # the validation split is the head of the file (contiguous, deterministic)
    assert raw["validation"]["text"][0].startswith("line 0")
    assert raw["train"]["text"][-1].startswith("line 99")
    raw2, _ = load_raw_datasets(train_file=str(f), validation_split_percentage=10, drop_blank=False, cache_dir=str(tmp_path / "c"))
    assert len(raw2["train"]) + len(raw2["validation"]) > 100  # the text builder keeps blank rows


def test_json_and_jsonl(tmp_path):
    rows = [{"text": f"document {i}", "id": i} for i in range(40)] + [{"text": "", "id": 99}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "v.json").write_text(json.dumps(rows[:5]))
    raw, col = load_raw_datasets(train_file=str(tmp_path / "t.jsonl"), validation_file=str(tmp_path / "v.json"), cache_dir=str(tmp_path / "c"))
    assert col == "text" and len(raw["train"]) == 40 and len(raw["validation"]) == 5
    with pytest.raises(ValueError, match="not found"):
        load_raw_datasets(train_file=str(tmp_path / "t.jsonl"), text_column="body", cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="same format"):
        (tmp_path / "v.txt").write_text("x\n")
        load_raw_datasets(train_file=str(tmp_path / "t.jsonl"), validation_file=str(tmp_path / "v.txt"))
    with pytest.raises(ValueError, match="either"):
        load_raw_datasets(train_file=str(tmp_path / "t.jsonl"), dataset_name="wikitext")


def test_group_texts():
    out = group_texts({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "attention_mask": [[1] * 3, [1] * 2, [1] * 4]}, 4)
    assert out["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]  # remainder (9) dropped
    assert out["labels"] == out["input_ids"] and out["labels"] is not out["input_ids"]
    assert out["attention_mask"] == [[1] * 4] * 2


# ---------------------------------------------------------------------------------------------- tokenizer


@needs_tinystories
def test_bpe_on_tinystories_roundtrip_and_save(tmp_path):
    from transformers import AutoTokenizer

    raw, col = load_raw_datasets(train_file=str(TINYSTORIES), validation_split_percentage=5, cache_dir=str(tmp_path / "c"))
    sub = raw["train"].select(range(3000))
    tok = train_bpe_tokenizer(batch_iterator(sub, col), vocab_size=600, model_max_length=256)
    assert 300 < len(tok) <= 600
    assert tok.eos_token == "<|endoftext|>" and tok.convert_tokens_to_ids("<|endoftext|>") == 0
    text = raw["validation"][3]["text"] + "<|endoftext|>\nÜnïcödé ✓ 42"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: lossless on anything, no unknown tokens
    assert ids.count(0) == text.count("<|endoftext|>") >= 1  # the special token stays one token
    tok.save_pretrained(tmp_path / "tok")
    again = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert again(text)["input_ids"] == ids and len(again) == len(tok)
    tok2 = train_bpe_tokenizer(batch_iterator(sub, col), vocab_size=600)
    assert tok2.get_vocab() == tok.get_vocab(), "BPE training must be deterministic"
    # tokenize + pack the real text
    packed = pack_datasets(tokenize_datasets(raw, tok, col), 64)
    assert set(packed["train"].column_names) == {"input_ids", "attention_mask", "labels"}
    assert all(len(x) == 64 for x in list(packed["validation"]["input_ids"]))


def test_bpe_errors():
    with pytest.raises(ValueError, match="too small"):
        train_bpe_tokenizer(["abc"], vocab_size=200)
    with pytest.raises(ValueError, match="empty"):
        train_bpe_tokenizer([], vocab_size=400)


def test_pack_too_little_data(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("a b c\n" * 3)
    raw, col = load_raw_datasets(train_file=str(f), validation_split_percentage=0, cache_dir=str(tmp_path / "c"))
    tok = train_bpe_tokenizer(["a b c d e f g h"] * 10, vocab_size=300, min_frequency=1)
    with pytest.raises(ValueError, match="fewer than one block"):
        pack_datasets(tokenize_datasets(raw, tok, col), 512)


@needs_wikitext
def test_wikitext_blank_lines(tmp_path):
    raw, col = load_raw_datasets(train_file=str(WIKI_VALID), validation_split_percentage=5, cache_dir=str(tmp_path / "c"))
    n = len(raw["train"]) + len(raw["validation"])
    with open(WIKI_VALID, encoding="utf-8") as f:
        nonblank = sum(1 for line in f if line.strip())
    assert n == nonblank and n < 3760
