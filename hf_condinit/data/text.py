"""Text data for the example scripts: load, validate, tokenize and pack.

Shared by ``run_clm.py`` and ``run_mlm.py``. Mirrors the Hugging Face example scripts, with the checks they lack:

- local ``txt``-like files (``.txt``, ``.text``, ``.raw``, ``.tokens``) through the ``datasets`` ``text`` builder,
  ``.json`` / ``.jsonl`` through the ``json`` builder; anything else, a missing, empty or non-UTF-8 file raises a
  ``ValueError`` naming the file before any work is done, and so does a file ``datasets`` cannot parse (the
  reader's own message, one line); a validation split that would be empty names the file and the fix;
- blank lines: the ``text`` builder keeps them as empty rows (WikiText has one between every paragraph);
  rows whose text is only whitespace are dropped (``drop_blank=True``), after the validation split is taken, so
  the split boundary does not depend on that choice;
- a validation split when none is given: the first ``round(n · p / 100)`` of the ``n`` training rows, ``p`` the
  ``validation_split_percentage`` (a whole or fractional percentage; for a whole one the rows of HF's ``train[:p%]``),
  the rest for training (:func:`split_validation`); deterministic, seed-free, and the same for every init arm;
- packing: concatenate the tokenized rows and cut into ``block_size`` chunks, dropping the remainder;
  ``labels = input_ids`` for causal LM (:func:`group_texts`).
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import logging
import os
from collections.abc import Callable

from .streaming import PACK_GROUP_ROWS, check_first_blocks, count_rows

logger = logging.getLogger(__name__)

TEXT_EXTENSIONS = ("txt", "text", "raw", "tokens")
JSON_EXTENSIONS = ("json", "jsonl")
#: Bytes of a local file that ``datasets``' text / json reader holds at once while streaming (its default, 10 MiB,
#: makes the peak memory grow with the corpus up to files of that size: the chunk, its lines as Python strings and
#: their Arrow table).
STREAM_CHUNK_BYTES = 1 << 20

__all__ = [
    "TEXT_EXTENSIONS",
    "JSON_EXTENSIONS",
    "check_data_file",
    "load_raw_datasets",
    "split_sources",
    "split_validation",
    "drop_blank_rows",
    "tokenize_datasets",
    "group_texts",
    "pack_datasets",
]


def check_data_file(path: str, arg_name: str = "train_file") -> str:
    """Validate a local data file; return the ``datasets`` builder name (``"text"`` or ``"json"``).

    Raises ``ValueError`` (with the flag name and the path) when the file is missing, is a directory, is empty
    or whitespace-only, is not UTF-8 text, or has an extension that is not supported. Reads the file once.
    """
    if not os.path.exists(path):
        raise ValueError(f"--{arg_name} {path!r} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"--{arg_name} {path!r} is a directory; pass a .txt/.raw/.tokens/.json/.jsonl file.")
    ext = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if ext in TEXT_EXTENSIONS:
        builder = "text"
    elif ext in JSON_EXTENSIONS:
        builder = "json"
    else:
        raise ValueError(
            f"--{arg_name} {path!r}: unsupported extension {ext!r}; use one of "
            f"{', '.join(TEXT_EXTENSIONS + JSON_EXTENSIONS)}."
        )
    if os.path.getsize(path) == 0:
        raise ValueError(f"--{arg_name} {path!r} is empty.")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, blank = 0, True
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"--{arg_name} {path!r} is not UTF-8 text (bad byte at offset {offset + err.start}); "
                    f"convert it to UTF-8 or pass another file."
                ) from None
            blank = blank and not chunk.strip()
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"--{arg_name} {path!r} is not UTF-8 text (truncated at the end).") from None
    if blank:
        raise ValueError(f"--{arg_name} {path!r} contains only whitespace.")
    return builder


def drop_blank_rows(ds, text_column: str = "text"):
    """Drop rows whose ``text_column`` is empty or whitespace-only (works on Dataset and DatasetDict)."""
    return ds.filter(lambda batch: [bool(t and t.strip()) for t in batch[text_column]], batched=True)


def column_names(ds) -> list[str]:
    """The columns of a ``Dataset`` or ``IterableDataset`` (a streamed one whose features are unknown: its first
    row's keys)."""
    if ds.column_names is not None:
        return list(ds.column_names)
    return list(next(iter(ds)).keys())


def _resolve_text_column(ds, text_column: str | None) -> str:
    cols = column_names(next(iter(ds.values())))
    if text_column is not None:
        if text_column not in cols:
            raise ValueError(f"text column {text_column!r} not found; the data has columns {cols}.")
        return text_column
    if "text" in cols:
        return "text"
    if len(cols) == 1:
        return cols[0]
    raise ValueError(f"cannot tell which column holds the text among {cols}; pass --text_column.")


def load_raw_datasets(
    *,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    validation_split_percentage: float = 5,
    text_column: str | None = None,
    keep_linebreaks: bool = True,
    drop_blank: bool = True,
    cache_dir: str | None = None,
    token: str | bool | None = None,
    streaming: bool = False,
):
    """Load a ``DatasetDict`` with a ``train`` split and, when possible, a ``validation`` split.

    Exactly one source: ``dataset_name`` (hub, with optional ``dataset_config_name``; needs network unless
    cached) or ``train_file`` (local; ``validation_file`` optional). Without a validation set, the first
    ``validation_split_percentage`` % of the training rows become one (:func:`split_validation`: counted in rows,
    a fraction such as 12.5 included; 0 disables evaluation data).

    ``streaming``: an ``IterableDatasetDict`` with the same rows in the same order (:mod:`.streaming`): the split
    of a local file counts its rows in one pass (no tokenization) and takes the same contiguous first rows; a hub
    dataset without a validation split needs its row count in the dataset's metadata. Blank rows are dropped
    lazily; the emptiness checks happen when the first block is packed (:func:`.streaming.check_first_blocks`). A
    local file is read ``STREAM_CHUNK_BYTES`` at a time, so the memory does not grow with its size (a ``.json``
    file holding one JSON array is still parsed whole by ``datasets``; use ``.jsonl`` for large data).

    Returns ``(raw_datasets, text_column)``; the text column is renamed to nothing, just resolved.
    """
    from datasets import load_dataset

    if dataset_name is None and train_file is None:
        raise ValueError("need --dataset_name or --train_file")
    if dataset_name is not None and train_file is not None:
        raise ValueError("pass either --dataset_name or --train_file, not both")
    if validation_file is not None and train_file is None:
        raise ValueError("--validation_file needs --train_file")
    if not 0 <= validation_split_percentage < 100:
        raise ValueError(f"--validation_split_percentage must be in [0, 100), got {validation_split_percentage}")

    common = dict(cache_dir=cache_dir)
    if dataset_name is not None:
        common.update(token=token, streaming=streaming)
        raw = load_dataset(dataset_name, dataset_config_name, **common)
        if "train" not in raw:
            raise ValueError(f"dataset {dataset_name!r} has no 'train' split (splits: {list(raw)})")
        if "validation" not in raw and validation_split_percentage > 0:
            pct = validation_split_percentage
            if streaming:
                n_rows = raw["train"].info.splits["train"].num_examples if raw["train"].info.splits else None
                if not n_rows:
                    raise ValueError(f"dataset {dataset_name!r} has no validation split and no row count to take "
                                     f"{pct:g} % of its rows from while streaming; pass "
                                     f"--validation_split_percentage 0 (no evaluation) or stream it without --streaming")
            else:
                n_rows = len(raw["train"])
            raw = split_validation(raw["train"], n_rows, pct, f"--dataset_name {dataset_name!r}")
        builder = None
    else:
        builder = check_data_file(train_file, "train_file")
        data_files = {"train": train_file}
        if validation_file is not None:
            vbuilder = check_data_file(validation_file, "validation_file")
            if vbuilder != builder:
                raise ValueError(
                    f"--train_file is {builder} but --validation_file is {vbuilder}; use the same format for both"
                )
            data_files["validation"] = validation_file
        kwargs = dict(common, streaming=streaming)
        if streaming:
            kwargs["chunksize"] = STREAM_CHUNK_BYTES
        if builder == "text":
            kwargs["keep_linebreaks"] = keep_linebreaks
        raw = _load_local(builder, data_files, kwargs)
        if "validation" not in raw and validation_split_percentage > 0:
            n_rows = count_rows(raw["train"]) if streaming else len(raw["train"])
            raw = split_validation(raw["train"], n_rows, validation_split_percentage, f"--train_file {train_file!r}")

    column = _resolve_text_column(raw, text_column)
    if drop_blank:
        raw = drop_blank_rows(raw, column)
    if not streaming:
        if len(raw["train"]) == 0:
            raise ValueError(f"the training data ({train_file or dataset_name}) has no non-blank rows")
        if "validation" in raw and len(raw["validation"]) == 0:
            raise ValueError(
                f"the validation data ({validation_file or 'split of the training data'}) has no non-blank rows; "
                "pass a bigger --validation_split_percentage or a --validation_file"
            )
    return raw, column


def split_validation(train, n_rows: int, percentage: float, source: str = "the training data"):
    """``{"validation": the first rows of train, "train": the rest}``, contiguous and in order, as a ``DatasetDict``
    (``train`` a ``Dataset``) or an ``IterableDatasetDict`` (``train`` a stream of ``n_rows`` rows, counted before).

    The validation part is the first ``round(n_rows · percentage / 100)`` rows (Python's ``round``: a half goes to
    the even count), so a fractional ``percentage`` (12.5) splits exactly as a whole one; for a whole ``percentage``
    these are the rows of ``datasets``' ``train[:p%]`` (its default ``closest`` rounding). Raises ``ValueError``
    naming ``source`` when that is no row."""
    from datasets import DatasetDict, IterableDatasetDict

    n_val = round(n_rows * percentage / 100)
    if n_val == 0:
        raise ValueError(f"{source} has {n_rows} rows, so {percentage:g} % held out for validation is no row; pass "
                         f"--validation_file, a larger --validation_split_percentage, or more data.")
    splits = DatasetDict if hasattr(train, "num_rows") else IterableDatasetDict
    return splits(validation=train.take(n_val), train=train.skip(n_val))


def split_sources(
    train_file: str | None = None,
    validation_file: str | None = None,
    dataset_name: str | None = None,
    validation_split_percentage: float = 5,
) -> dict[str, str]:
    """How to name each split in an error message: ``{"train": "--train_file 'a.txt'", "validation": ...}``."""
    train = f"--train_file {train_file!r}" if train_file else f"--dataset_name {dataset_name!r}"
    if validation_file:
        validation = f"--validation_file {validation_file!r}"
    else:
        validation = f"the validation part of {train} (--validation_split_percentage {validation_split_percentage:g})"
    return {"train": train, "validation": validation}


def _load_local(builder: str, data_files: dict, kwargs: dict):
    """``load_dataset`` on local files; a file the reader cannot parse (malformed JSON, ...) becomes one
    ``ValueError`` naming the files and the reader's own message."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    try:
        return load_dataset(builder, data_files=data_files, **kwargs)
    except DatasetGenerationError as err:
        cause = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        files = " / ".join(repr(f) for f in data_files.values())
        raise ValueError(f"could not read {files} as {builder}: {message}; fix the file or pass another.") from None


def tokenize_datasets(
    raw,
    tokenizer,
    text_column: str = "text",
    *,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    append_eos: bool = False,
    max_length: int | None = None,
    pad_to_max_length: bool = False,
    main_process_first: Callable[[], contextlib.AbstractContextManager] | None = None,
):
    """Tokenize every split, keeping only the tokenizer's outputs (``input_ids``, ``attention_mask``, ...).

    ``append_eos`` adds ``tokenizer.eos_token_id`` after every row (use it for data with one document per row;
    for line-based text files, keep the line breaks instead, as HF's ``run_clm`` does). ``max_length``: one
    sequence per row, truncated to it (HF's ``--line_by_line``), and padded to it with ``pad_to_max_length``.
    """
    ctx = main_process_first or contextlib.nullcontext
    eos = tokenizer.eos_token_id

    kwargs = {}
    if max_length is not None:
        kwargs = dict(truncation=True, max_length=max_length, padding="max_length" if pad_to_max_length else False)

    def fn(batch):
        out = tokenizer(batch[text_column], verbose=False, **kwargs)
        if append_eos:
            if eos is None:
                raise ValueError("append_eos=True but the tokenizer has no eos_token")
            out["input_ids"] = [ids + [eos] for ids in out["input_ids"]]
            if "attention_mask" in out:
                out["attention_mask"] = [m + [1] for m in out["attention_mask"]]
        return out

    any_split = next(iter(raw.values()))
    remove = column_names(any_split)
    with ctx():
        map_kwargs = {}
        if hasattr(any_split, "num_rows"):  # map-style
            map_kwargs = dict(num_proc=num_proc, load_from_cache_file=load_from_cache_file, desc="tokenizing")
        return raw.map(fn, batched=True, remove_columns=remove, **map_kwargs)


def group_texts(examples: dict, block_size: int, *, add_labels: bool = True) -> dict:
    """Concatenate a batch of tokenized rows and cut into ``block_size`` chunks (remainder dropped)."""
    concatenated = {k: list(itertools.chain.from_iterable(examples[k])) for k in examples.keys()}  # linear time
    total = len(concatenated[next(iter(examples.keys()))])
    total = (total // block_size) * block_size
    result = {k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()}
    if add_labels:
        result["labels"] = [ids[:] for ids in result["input_ids"]]
    return result


def pack_datasets(
    tokenized,
    block_size: int,
    *,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    add_labels: bool = True,
    map_batch_size: int = PACK_GROUP_ROWS,
    main_process_first: Callable[[], contextlib.AbstractContextManager] | None = None,
    sources: dict[str, str] | None = None,
):
    """Apply :func:`group_texts` to every split and check every split holds at least one block.

    Packing works per ``map_batch_size`` rows (as in HF ``run_clm``), so each map batch drops its own remainder;
    a streamed split (``IterableDataset``) is packed over the same groups of rows, lazily, and checked up to its
    first block (:func:`.streaming.check_first_blocks`).
    ``sources``: split → how to name it in the error (e.g. ``{"train": "--train_file 'a.txt'"}``).
    """
    ctx = main_process_first or contextlib.nullcontext
    any_split = next(iter(tokenized.values()))
    kwargs = {}
    if hasattr(any_split, "num_rows"):
        kwargs = dict(num_proc=num_proc, load_from_cache_file=load_from_cache_file, desc=f"packing into {block_size}")
    with ctx():
        packed = tokenized.map(
            lambda ex: group_texts(ex, block_size, add_labels=add_labels),
            batched=True,
            batch_size=map_batch_size,
            **kwargs,
        )
    if not hasattr(any_split, "num_rows"):
        check_first_blocks(packed, block_size, sources)
        return packed
    for split in packed:
        if packed[split].num_rows == 0:
            n_tok = sum(len(x) for x in tokenized[split]["input_ids"])
            source = (sources or {}).get(split, f"the {split} split")
            if n_tok < block_size:
                detail = f"{n_tok} tokens, fewer than one block of {block_size}"
            else:
                detail = f"{n_tok} tokens, but no group of {map_batch_size} rows fills a block of {block_size}"
            raise ValueError(f"{source} has {detail}; give more text or a smaller block size (--block_size).")
    return packed
