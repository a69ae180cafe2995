"""One's own classification or regression data for ``run_glue.py`` without ``--task_name`` (HF's custom path).

As HF's ``run_glue.py`` reads them: csv or json (json lines) files, or a hub dataset, with a ``label`` column and
one or two text columns (``sentence1`` and ``sentence2`` when both exist, else the first two other columns, else
the only one). A float ``label`` column makes a regression (one output, Pearson / Spearman); any other one a
classification over the distinct training labels, sorted (accuracy and F1: of class 1 with two classes, macro
over the classes otherwise). Every split is returned with the labels as class ids (a ``ClassLabel`` column) and a
:class:`~.tasks.GlueTask` named ``classification`` or ``regression`` describing it, so ``run_glue.py`` runs it as it
runs a GLUE task; the metric is the shipped ``evaluate`` module's configuration of that name (:mod:`.metric`).
"""

from __future__ import annotations

import os

from .tasks import GlueTask

__all__ = ["CUSTOM_EXTENSIONS", "load_custom_files", "custom_task"]

CUSTOM_EXTENSIONS = {"csv": "csv", "json": "json", "jsonl": "json"}


def _builder(path: str, flag: str) -> str:
    if not os.path.isfile(path):
        raise ValueError(f"--{flag} {path!r} does not exist.")
    ext = path.rsplit(".", 1)[-1].lower()
    if ext not in CUSTOM_EXTENSIONS:
        raise ValueError(f"--{flag} {path!r}: without --task_name the files are csv or json (.csv, .json, .jsonl), "
                         f"as in HF's run_glue.py; pass --task_name for GLUE's .tsv files.")
    return CUSTOM_EXTENSIONS[ext]


def load_custom_files(files: dict[str, str], cache_dir: str | None = None):
    """``(raw, task)`` for local files ``{split: path}`` (``train``, ``validation``, ``test``; the same format for
    all): :func:`custom_task` on what ``datasets``' csv / json reader gives. ``ValueError`` naming the flag for a
    missing file, another extension or two formats."""
    from datasets import load_dataset

    builders = {split: _builder(path, f"{split}_file") for split, path in files.items()}
    if len(set(builders.values())) > 1:
        raise ValueError(f"the data files mix formats ({', '.join(f'{k}: {v}' for k, v in builders.items())}); "
                         f"use csv for all or json for all.")
    raw = load_dataset(next(iter(builders.values())), data_files=files, cache_dir=cache_dir)
    return custom_task(raw, where={split: f"--{split}_file {path!r}" for split, path in files.items()})


def custom_task(raw, where: dict[str, str] | None = None):
    """``(raw, task)``: ``raw`` (a ``DatasetDict`` with ``train`` and any of ``validation`` / ``test``) with its
    labels made class ids (classification) or float32 (regression), and the :class:`GlueTask` describing it.

    ``where``: split → how to name it in an error. Raises ``ValueError`` for a split without a ``label`` column (the
    test split may lack one), no text column, or a validation label the training data does not have."""
    from datasets import ClassLabel, Value

    where = where or {}
    if "train" not in raw:
        raise ValueError("without --task_name the labels are read from the training data: pass --train_file.")
    train = raw["train"]
    if "label" not in train.column_names:
        raise ValueError(f"{where.get('train', 'the training data')} has no 'label' column (columns: "
                         f"{train.column_names}); HF's run_glue.py reads the labels from a column named label.")
    texts = [c for c in train.column_names if c not in ("label", "idx")]
    if not texts:
        raise ValueError(f"{where.get('train', 'the training data')} has no text column besides 'label'.")
    keys = ("sentence1", "sentence2") if {"sentence1", "sentence2"} <= set(texts) else (texts + [None])[:2]
    feature = train.features["label"]
    regression = getattr(feature, "dtype", None) in ("float16", "float32", "float64")
    if regression:
        label_list, label_feature = None, Value("float32")
    else:
        names = feature.names if isinstance(feature, ClassLabel) else sorted(train.unique("label"))
        label_list, label_feature = tuple(str(n) for n in names), ClassLabel(names=[str(n) for n in names])
    for split in list(raw):
        if "label" not in raw[split].column_names:
            if split != "test":
                raise ValueError(f"{where.get(split, f'the {split} split')} has no 'label' column.")
            continue
        if not regression and not isinstance(raw[split].features["label"], ClassLabel):
            unseen = sorted({str(v) for v in raw[split].unique("label")} - set(label_list))
            if unseen:
                raise ValueError(f"{where.get(split, f'the {split} split')} has labels the training data does not: "
                                 f"{unseen[:5]}; the classes are {list(label_list)}.")
            index = {name: i for i, name in enumerate(label_list)}
            raw[split] = raw[split].map(lambda b: {"label": [index[str(v)] for v in b["label"]]}, batched=True)
        raw[split] = raw[split].cast_column("label", label_feature)
    name = "regression" if regression else "classification"
    metric_keys = ("pearson", "spearmanr") if regression else ("accuracy", "f1")
    task = GlueTask(name, keys, label_list, metric_keys=metric_keys, main_metric=metric_keys, display=name)
    return raw, task
