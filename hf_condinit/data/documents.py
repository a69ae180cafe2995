"""Text corpora as whole documents: several files or directories, read in a fixed order, one row per document.

Used by the benchmark harness (``benchmarks/compare.py``), whose held-out split and document-level EOS need document
boundaries, not the line rows of the ``datasets`` ``text`` builder (:func:`hf_condinit.data.load_raw_datasets`).

- :func:`expand_text_paths`: files as given; a directory becomes its text files (``TEXT_EXTENSIONS``) sorted by
  relative path, recursively. Every file is checked with :func:`hf_condinit.data.check_data_file`.
- :func:`split_documents`: ``<|endoftext|>`` separators when present (TinyStories, the enwiki extract); otherwise
  WikiText articles (a new article starts at a top-level `` = Title = `` line); otherwise non-blank lines.
- :func:`read_documents`: the documents of every file, file after file. A file is split on its own, so no document
  straddles two files; corpora cut into parts at document boundaries (``wiki.train.part{1,2,3}of3.raw``) give the
  same documents as the uncut file.
- :func:`documents_dataset`: a ``DatasetDict`` with one document per row: ``validation`` = the first
  ``validation_fraction`` of the documents (contiguous, seed-free), ``train`` = the rest.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from .text import TEXT_EXTENSIONS, check_data_file

__all__ = ["expand_text_paths", "split_documents", "read_documents", "documents_dataset"]


def expand_text_paths(paths: Sequence[str], arg_name: str = "data") -> list[str]:
    """Files in the order given; a directory expands to its text files sorted by relative path (recursively).

    Raises ``ValueError`` naming ``--{arg_name}`` for a missing path, a directory without text files, or a file
    that :func:`check_data_file` rejects (empty, whitespace-only, unsupported extension, ``.json``)."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(
                os.path.relpath(os.path.join(root, name), path)
                for root, _, names in os.walk(path)
                for name in names
                if name.rsplit(".", 1)[-1].lower() in TEXT_EXTENSIONS and "." in name
            )
            if not found:
                raise ValueError(f"--{arg_name} {path!r}: the directory holds no text files "
                                 f"({', '.join('.' + e for e in TEXT_EXTENSIONS)}).")
            files += [os.path.join(path, rel) for rel in found]
        else:
            if check_data_file(path, arg_name) != "text":
                raise ValueError(f"--{arg_name} {path!r}: pass plain text files "
                                 f"({', '.join('.' + e for e in TEXT_EXTENSIONS)}) or directories of them.")
            files.append(path)
    return files


def split_documents(text: str) -> list[str]:
    """Documents of one text: split at ``<|endoftext|>`` when present; otherwise at WikiText top-level titles
    (`` = Title = `` lines, not `` = = Section = = ``); when that gives fewer than 4 documents, every non-blank line
    is one. Documents are stripped; empty ones dropped."""
    if "<|endoftext|>" in text:
        docs = text.split("<|endoftext|>")
    else:
        docs, cur = [], []
        for line in text.split("\n"):
            s = line.strip()
            is_title = s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")
            if is_title and cur:
                docs.append("\n".join(cur))
                cur = []
            cur.append(line)
        docs.append("\n".join(cur))
        if len(docs) < 4:
            docs = text.split("\n")
    return [d.strip() for d in docs if d.strip()]


def read_documents(paths: Sequence[str], max_bytes: Optional[int] = None, arg_name: str = "data") -> list[str]:
    """Documents of ``paths`` (files or directories, :func:`expand_text_paths`), file after file.

    ``max_bytes`` reads only the first ``max_bytes`` bytes of the concatenation (the last document read may be
    cut); ``None`` reads everything."""
    docs: list[str] = []
    budget = max_bytes
    for path in expand_text_paths(paths, arg_name):
        if budget is not None and budget <= 0:
            break
        with open(path, "rb") as f:
            raw = f.read() if budget is None else f.read(budget)
        if budget is not None:
            budget -= len(raw)
        docs += split_documents(raw.decode("utf-8", errors="ignore"))
    return docs


def documents_dataset(documents: Sequence[str], validation_fraction: float = 0.05, text_column: str = "text"):
    """``DatasetDict(train=..., validation=...)``, one document per row; ``validation`` holds the first
    ``round(len(documents) * validation_fraction)`` documents (at least 1), ``train`` the rest.

    Raises ``ValueError`` when no document is left for training."""
    from datasets import Dataset, DatasetDict

    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    n_val = max(1, int(round(len(documents) * validation_fraction)))
    if len(documents) - n_val < 1:
        raise ValueError(f"too few documents ({len(documents)}) for a validation split and a training split")
    return DatasetDict(
        train=Dataset.from_dict({text_column: list(documents[n_val:])}),
        validation=Dataset.from_dict({text_column: list(documents[:n_val])}),
    )
