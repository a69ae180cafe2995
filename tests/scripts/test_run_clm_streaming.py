"""``--streaming`` for ``run_clm.py`` / ``run_mlm.py``: the same blocks in the same order as the cached
path, a streamed run that resumes exactly, and the one-line errors. Tiny text made in the test, no hub."""

import json
import os
import random
import tracemalloc

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from hf_condinit.data import load_raw_datasets, pack_datasets, tokenize_datasets, train_bpe_tokenizer  # noqa: E402
from hf_condinit.data.tokenizer import batch_iterator  # noqa: E402
from hf_condinit.scripts_common import UsageError  # noqa: E402

from utils import load_script  # noqa: E402

run_clm = load_script("run_clm.py")
run_mlm = load_script("run_mlm.py")

WORDS = "the cat sat on a mat and then ran far away to see one big red dog".split()


@pytest.fixture
def text_file(tmp_path):
    """420 rows of random words, every seventh blank or whitespace-only (dropped after the validation split)."""
    rng = random.Random(0)
    rows = []
    for i in range(420):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 15)))
        rows.append("   " if i % 7 == 3 else "" if i % 7 == 5 else words)
    path = tmp_path / "text.txt"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _blocks(path, tmp_path, streaming, tokenizer=None, **load):
    raw, column = load_raw_datasets(train_file=path, cache_dir=str(tmp_path / "cache"), streaming=streaming, **load)
    if tokenizer is None:
        tokenizer = train_bpe_tokenizer(batch_iterator(raw["train"], column), vocab_size=300)
    tokenized = tokenize_datasets(raw, tokenizer, column, append_eos=True)
    packed = pack_datasets(tokenized, 16, map_batch_size=50)  # several packing groups in 420 rows
    return tokenizer, {split: [dict(block) for block in packed[split]] for split in packed}


def test_streamed_blocks_are_the_cached_blocks_in_order(text_file, tmp_path):
    """Same rows (the same contiguous validation split, blank rows dropped after it), same tokenizer, same packing
    groups: the streamed splits yield exactly the cached splits' blocks, in index order."""
    tok_cached, cached = _blocks(text_file, tmp_path, streaming=False, validation_split_percentage=10)
    tok_streamed, streamed = _blocks(text_file, tmp_path, streaming=True, validation_split_percentage=10)
    assert tok_streamed.get_vocab() == tok_cached.get_vocab()  # the BPE trained on the stream is the same
    assert len(cached["train"]) > 20 and len(cached["validation"]) > 1
    for split in ("train", "validation"):
        assert streamed[split] == cached[split], split
    assert all(b["labels"] == b["input_ids"] and len(b["input_ids"]) == 16 for b in streamed["train"])
    # with a validation file: the whole training file streams
    _, with_file = _blocks(text_file, tmp_path, streaming=True, tokenizer=tok_cached, validation_file=text_file)
    _, cached_file = _blocks(text_file, tmp_path, streaming=False, tokenizer=tok_cached, validation_file=text_file)
    assert with_file["train"] == cached_file["train"] == cached_file["validation"]


def _streaming_peak(path, tmp_path) -> tuple[int, int]:
    """``(rows, peak bytes)``: the Python allocations' peak (tracemalloc) while the streamed rows of ``path`` are read
    to their end (the set-up, which reads the first rows, before the measurement)."""
    raw, _ = load_raw_datasets(train_file=path, validation_split_percentage=0, cache_dir=str(tmp_path / "cache"),
                               streaming=True)
    tracemalloc.start()
    try:
        rows = sum(1 for _ in raw["train"])
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    """A corpus and the same corpus 16 times over (by repetition): reading their streamed rows peaks at the same
    memory: the reader holds one chunk of the file at a time (``STREAM_CHUNK_BYTES``, 64 KiB here). With
    ``datasets``' own 10 MiB chunk a file below that size is held whole, and the peak grows with the file.
    (Tokenization and packing hold one group of ``map_batch_size`` rows at a time, whatever the corpus size.)"""
    chunk = 64 << 10
    monkeypatch.setattr("hf_condinit.data.text.STREAM_CHUNK_BYTES", chunk)
    rng = random.Random(1)
    rows = "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) + "\n" for _ in range(3000))
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text(rows)
    large.write_text(rows * 16)
    (rows_small, peak_small), (rows_large, peak_large) = (_streaming_peak(str(p), tmp_path) for p in (small, large))
    added = large.stat().st_size - small.stat().st_size
    assert (rows_small, rows_large) == (3000, 16 * 3000) and small.stat().st_size > 4 * chunk
    assert peak_large - peak_small < added / 8, (peak_small, peak_large, added)  # the 10 MiB chunk: > added


def _clm_args(text_file, tmp_path, out, steps=4):
    return [
        "--output_dir", str(tmp_path / out), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true",
        "--cache_dir", str(tmp_path / "cache"), "--seed", "5", "--model_config", "gpt2-tiny",
        "--config_overrides", "n_layer=1,n_embd=32,n_head=2", "--train_file", text_file, "--streaming",
        "--block_size", "16", "--tokenizer_vocab_size", "300", "--max_steps", str(steps),
        "--per_device_train_batch_size", "4", "--max_eval_samples", "8", "--logging_steps", "1",
        "--learning_rate", "3e-3", "--save_strategy", "steps", "--save_steps", "2",
    ]  # fmt: skip


def test_streamed_run_resumes_on_the_same_next_block(text_file, tmp_path):
    """Uninterrupted 4 steps vs resumed from the step-2 checkpoint: the resumed run skips the 2 steps' blocks and
    ends with the same weights and the same per-step losses."""
    run_clm.main(_clm_args(text_file, tmp_path, "full"))
    ckpt = tmp_path / "full" / "checkpoint-2"
    run_clm.main(_clm_args(text_file, tmp_path, "resumed") + ["--resume_from_checkpoint", str(ckpt)])
    full, resumed = (load_file(tmp_path / run / "model.safetensors") for run in ("full", "resumed"))
    at2 = load_file(ckpt / "model.safetensors")
    assert any(not torch.equal(full[k], at2[k]) for k in full), "steps 3-4 changed nothing"
    assert [k for k in full if not torch.equal(full[k], resumed[k])] == []
    logs = {}
    for run in ("full", "resumed"):
        state = json.loads((tmp_path / run / "trainer_state.json").read_text())
        logs[run] = [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]
    assert [s for s, _ in logs["resumed"]] == [1, 2, 3, 4] and logs["resumed"] == logs["full"]
    results = json.loads((tmp_path / "full" / "all_results.json").read_text())
    assert results["train_samples"] == 16 and results["eval_samples"] == 8 and "perplexity" in results


def test_streamed_mlm_trains_and_evaluates(text_file, tmp_path):
    run_mlm.main([
        "--output_dir", str(tmp_path / "mlm"), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true",
        "--cache_dir", str(tmp_path / "cache"), "--train_file", text_file, "--streaming", "--max_steps", "2",
        "--config_overrides", "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64",
        "--tokenizer_vocab_size", "200", "--max_seq_length", "16", "--per_device_train_batch_size", "4",
        "--max_eval_samples", "8",
    ])  # fmt: skip
    results = json.loads((tmp_path / "mlm" / "all_results.json").read_text())
    assert results["eval_samples"] == 8 and results["train_samples"] == 8 and "eval_accuracy" in results


def test_streaming_errors_are_one_line(text_file, tmp_path, monkeypatch):
    monkeypatch.setattr(run_clm.AutoModelForCausalLM, "from_config", lambda *a, **k: pytest.fail("model built"))
    short = tmp_path / "short.txt"
    short.write_text("the cat\n" * 40)
    base = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "--report_to", "none", "--cache_dir",
            str(tmp_path / "cache"), "--model_config", "gpt2-tiny", "--tokenizer_vocab_size", "300"]
    cases = [
        (["--train_file", text_file, "--streaming"], "--streaming needs --max_steps N"),
        (["--streaming", "--max_steps", "3"], "--streaming reads --train_file or --dataset_name"),
        (["--train_file", str(short), "--streaming", "--max_steps", "3", "--block_size", "256"],
         "the validation part of --train_file .* gives no block of 256 tokens while streaming"),
    ]
    for argv, message in cases:
        with pytest.raises(UsageError, match=message):
            run_clm.main(base + argv)
        assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="--streaming needs --max_steps N"):
        run_mlm.main(base[:7] + ["--train_file", text_file, "--streaming"])
