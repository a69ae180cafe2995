"""GLUE task table and readers for local GLUE files (TSV as distributed, CSV, JSON).

The table gives, per task, the two text columns (HF ``nyu-mll/glue`` names, as ``task_to_keys`` in HF's
``run_glue.py``), the label list in the hub's ``ClassLabel`` order (None for the STS-B regression), the evaluation
splits (MNLI: matched + mismatched) and the metric keys.

Local files are normalised to the hub's columns: the text columns above plus ``label`` (int class index, or float
score for STS-B). The readers know the distributed GLUE layouts:

- CoLA ``train.tsv`` / ``dev.tsv`` have **no header** (source, label, original mark, sentence); ``test.tsv`` has
  ``index sentence``;
- MRPC uses ``Quality`` / ``#1 String`` / ``#2 String`` (with a UTF-8 BOM);
- MNLI uses ``sentence1`` / ``sentence2`` / ``gold_label``; QQP ``question1`` / ``question2`` / ``is_duplicate``
  (also the header-less 6-column QQP layout); STS-B ``score`` (float 0–5);
- JSON as ``{"0": {"text_a": .., "text_b": .., "label": ..}, ...}`` (the GLUE samples in ``shared/data``), a list of
  records, ``{"data": [...]}`` or JSON lines; columns ``text_a`` / ``text_b`` are accepted for the two text columns.

Labels may be written as the label name (``"entailment"``) or as the class index (``"1"``). Every error names the
file and line (``path:line: ...``).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass, field

__all__ = [
    "GlueTask",
    "GLUE_TASKS",
    "SUITE_TASKS",
    "task_to_keys",
    "get_task",
    "GlueFormatError",
    "read_glue_file",
    "read_glue_tsv",
    "read_glue_csv",
    "read_glue_json",
    "glue_label_to_id",
    "glue_task_score",
    "glue_average",
    "format_glue_table",
]

logger = logging.getLogger(__name__)


class GlueFormatError(ValueError):
    """A local GLUE file does not match the task's expected layout; the message starts with ``path:line:``."""


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    Attributes:
        name: canonical name (``"rte"``, ``"sst2"``, ``"stsb"``, ...), the hub config of ``nyu-mll/glue``.
        keys: (first text column, second text column or None).
        label_list: class names in the hub's order; None for regression (STS-B).
        eval_splits: hub validation split names (MNLI: matched and mismatched).
        metric_keys: keys returned by the GLUE metric for this task.
        main_metric: the metric(s) averaged into the task's GLUE score (mean of those listed).
        header_aliases: canonical column -> accepted header names in TSV/CSV/JSON files.
        headerless: canonical column -> column index for header-less TSV layouts, with the expected field count.
        display: name in tables (``"SST-2"``).
    """

    name: str
    keys: tuple[str, str | None]
    label_list: tuple[str, ...] | None
    eval_splits: tuple[str, ...] = ("validation",)
    metric_keys: tuple[str, ...] = ("accuracy",)
    main_metric: tuple[str, ...] = ("accuracy",)
    header_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    headerless: tuple[int, dict[str, int]] | None = None
    display: str = ""

    @property
    def is_regression(self) -> bool:
        return self.label_list is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_list is None else len(self.label_list)


def _aliases(first: str, second: str | None, label: tuple[str, ...], extra: dict | None = None) -> dict:
    aliases = {first: (first, "text_a"), "label": label}
    if second is not None:
        aliases[second] = (second, "text_b")
    for key, names in (extra or {}).items():
        aliases[key] = tuple(dict.fromkeys(aliases.get(key, ()) + tuple(names)))
    return aliases


GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(
        "cola", ("sentence", None), ("unacceptable", "acceptable"),
        metric_keys=("matthews_correlation",), main_metric=("matthews_correlation",),
        header_aliases=_aliases("sentence", None, ("label",)),
        headerless=(4, {"label": 1, "sentence": 3}), display="CoLA",
    ),
    "sst2": GlueTask(
        "sst2", ("sentence", None), ("negative", "positive"),
        header_aliases=_aliases("sentence", None, ("label",)), display="SST-2",
    ),
    "mrpc": GlueTask(
        "mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
        metric_keys=("accuracy", "f1"), main_metric=("f1", "accuracy"),
        header_aliases=_aliases("sentence1", "sentence2", ("label", "Quality"),
                                {"sentence1": ("#1 String",), "sentence2": ("#2 String",)}),
        display="MRPC",
    ),
    "qqp": GlueTask(
        "qqp", ("question1", "question2"), ("not_duplicate", "duplicate"),
        metric_keys=("accuracy", "f1"), main_metric=("f1", "accuracy"),
        header_aliases=_aliases("question1", "question2", ("label", "is_duplicate")),
        headerless=(6, {"question1": 3, "question2": 4, "label": 5}), display="QQP",
    ),
    "stsb": GlueTask(
        "stsb", ("sentence1", "sentence2"), None,
        metric_keys=("pearson", "spearmanr"), main_metric=("pearson", "spearmanr"),
        header_aliases=_aliases("sentence1", "sentence2", ("label", "score")), display="STS-B",
    ),
    "mnli": GlueTask(
        "mnli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        eval_splits=("validation_matched", "validation_mismatched"),
        header_aliases=_aliases("premise", "hypothesis", ("label", "gold_label"),
                                {"premise": ("sentence1",), "hypothesis": ("sentence2",)}),
        display="MNLI",
    ),
    "qnli": GlueTask(
        "qnli", ("question", "sentence"), ("entailment", "not_entailment"),
        header_aliases=_aliases("question", "sentence", ("label",)), display="QNLI",
    ),
    "rte": GlueTask(
        "rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"),
        header_aliases=_aliases("sentence1", "sentence2", ("label",)), display="RTE",
    ),
    "wnli": GlueTask(
        "wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"),
        header_aliases=_aliases("sentence1", "sentence2", ("label",)), display="WNLI",
    ),
}

#: The 8 tasks of the papers' GLUE table (no WNLI), in the usual column order.
SUITE_TASKS = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")

#: HF ``run_glue.py``'s table: task -> (first text column, second text column or None).
task_to_keys = {name: task.keys for name, task in GLUE_TASKS.items()}

_TASK_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli"}


def get_task(name: str) -> GlueTask:
    """The `GlueTask` for ``name`` (case-insensitive; ``SST-2`` / ``STS-B`` spellings accepted).

    Raises:
        ValueError: for an unknown task, listing the known ones.
    """
    key = str(name).strip().lower()
    key = _TASK_ALIASES.get(key, key)
    if key not in GLUE_TASKS:
        raise ValueError(f"Unknown GLUE task {name!r}; expected one of: {', '.join(GLUE_TASKS)}.")
    return GLUE_TASKS[key]


def glue_label_to_id(task: GlueTask, raw, where: str):
    """Convert one raw label (name, index as str/int, or float score for STS-B) to the hub's label value."""
    if task.is_regression:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise GlueFormatError(f"{where}: label {raw!r} is not a number (task {task.name} is a regression).")
        if value != value:  # NaN
            raise GlueFormatError(f"{where}: label is NaN.")
        return value
    if isinstance(raw, bool):
        raw = int(raw)
    text = str(raw).strip()
    if text in task.label_list:
        return task.label_list.index(text)
    try:
        index = int(text)
    except ValueError:
        index = None
    if index is not None and 0 <= index < len(task.label_list):
        return index
    raise GlueFormatError(
        f"{where}: label {raw!r} is not a label of task {task.name}; expected one of {list(task.label_list)} "
        f"or an index 0..{len(task.label_list) - 1}."
    )


def _resolve_columns(task: GlueTask, header: list[str], path: str, require_label: bool) -> dict[str, int]:
    """Map canonical columns to positions in ``header``; error (naming line 1) when one is missing."""
    cleaned = [h.strip().lstrip("\ufeff") for h in header]
    wanted = [k for k in task.keys if k is not None] + ["label"]
    columns = {}
    for key in wanted:
        for alias in task.header_aliases.get(key, (key,)):
            if alias in cleaned:
                columns[key] = cleaned.index(alias)
                break
        else:
            if key == "label" and not require_label:
                continue
            what = "label column" if key == "label" else f"text column {key!r}"
            raise GlueFormatError(
                f"{path}:1: missing {what} for task {task.name}: expected one of "
                f"{list(task.header_aliases.get(key, (key,)))}; the header is {cleaned}."
            )
    return columns


def _make_record(task, fields, columns, where):
    record = {}
    for key in task.keys:
        if key is not None:
            record[key] = fields[columns[key]]
    if "label" in columns:
        record["label"] = glue_label_to_id(task, fields[columns["label"]], where)
    return record


def _bad(where: str, message: str, bad_lines: str) -> None:
    if bad_lines == "error":
        raise GlueFormatError(f"{where}: {message}")
    logger.warning("skipping %s: %s", where, message)


def _check_bad_lines(bad_lines: str) -> None:
    if bad_lines not in ("error", "skip"):
        raise ValueError(f"bad_lines must be 'error' or 'skip', got {bad_lines!r}.")


def read_glue_tsv(path: str, task: str | GlueTask, *, require_label: bool = True, bad_lines: str = "error") -> list:
    """Read a GLUE TSV file as distributed (tab-separated, no quoting) into a list of records.

    Args:
        path: the ``.tsv`` file.
        task: task name or `GlueTask`.
        require_label: when False a file without a label column (GLUE ``test.tsv``) is accepted.
        bad_lines: ``"error"`` (default) raises `GlueFormatError` on a row with the wrong number of fields or a bad
            label; ``"skip"`` logs a warning and skips it.
    """
    task = get_task(task) if isinstance(task, str) else task
    _check_bad_lines(bad_lines)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not any(line.strip() for line in lines):
        raise GlueFormatError(f"{path}:1: the file is empty.")
    first = [f.strip() for f in lines[0].rstrip("\r").split("\t")]
    known = {alias for names in task.header_aliases.values() for alias in names} | {"index", "id", "idx"}
    if task.headerless is not None and not known.intersection(first):
        # a header-less layout (CoLA train/dev, QQP without header): positions are fixed
        n_fields, columns = task.headerless
        columns, start = dict(columns), 0
    else:
        columns = _resolve_columns(task, first, path, require_label)
        n_fields, start = len(first), 1
    rows = ((f"{path}:{lineno}", line.rstrip("\r").split("\t")) for lineno, line in enumerate(lines[start:], start + 1))
    return _records_from_rows(task, rows, n_fields, columns, "tab", bad_lines)


def read_glue_csv(path: str, task: str | GlueTask, *, require_label: bool = True, bad_lines: str = "error") -> list:
    """Read a CSV file with a header row (canonical or GLUE column names) into a list of records."""
    task = get_task(task) if isinstance(task, str) else task
    _check_bad_lines(bad_lines)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise GlueFormatError(f"{path}:1: the file is empty.") from None
        columns = _resolve_columns(task, header, path, require_label)

        def rows():  # a quoted field may span lines: a row's location is the line it starts on
            previous_end = reader.line_num
            for fields in reader:
                yield f"{path}:{previous_end + 1}", fields
                previous_end = reader.line_num

        return _records_from_rows(task, rows(), len(header), columns, "comma", bad_lines)


def _records_from_rows(task: GlueTask, rows, n_fields: int, columns, separator: str, bad_lines: str) -> list:
    """Records from ``(location, fields)`` pairs: blank rows are skipped; a row with the wrong number of fields or a
    value that does not parse goes to :func:`_bad` (raise, warn or skip, per ``bad_lines``) with its location."""
    records = []
    for where, fields in rows:
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != n_fields:
            _bad(where, f"expected {n_fields} {separator}-separated fields, found {len(fields)}.", bad_lines)
            continue
        try:
            records.append(_make_record(task, fields, columns, where))
        except GlueFormatError as err:
            _bad(where, str(err).split(": ", 1)[1], bad_lines)
    return records


def _json_records(path: str) -> list[tuple[str, dict]]:
    """(location, record) pairs of a JSON file: JSON lines (location ``path:line``), a list or ``{"data": [...]}``
    (``path: record i``), or an object of records ``{"id": {...}}`` (``path: record 'id'``)."""
    with open(path, encoding="utf-8-sig") as handle:
        text = handle.read()
    if not text.strip():
        raise GlueFormatError(f"{path}:1: the file is empty.")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as whole_err:
        out = []
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                if not out:
                    raise GlueFormatError(
                        f"{path}:{whole_err.lineno}: not valid JSON ({whole_err.msg}), nor JSON lines."
                    ) from None
                raise GlueFormatError(f"{path}:{lineno}: invalid JSON line ({err.msg}).") from None
            out.append((f"{path}:{lineno}", obj))
        return out
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, dict):
        return [(f"{path}: record {key!r}", rec) for key, rec in data.items()]
    if isinstance(data, list):
        return [(f"{path}: record {i}", rec) for i, rec in enumerate(data)]
    raise GlueFormatError(f"{path}:1: expected a list of records or an object of records, got {type(data).__name__}.")


def read_glue_json(path: str, task: str | GlueTask, *, require_label: bool = True, bad_lines: str = "error") -> list:
    """Read JSON / JSON-lines records (canonical, GLUE or ``text_a``/``text_b`` keys) into a list of records.

    Errors name ``path:line`` for JSON lines and ``path: record <key or index>`` for a single JSON document.
    """
    task = get_task(task) if isinstance(task, str) else task
    _check_bad_lines(bad_lines)
    records = []
    columns_cache: dict[tuple, dict] = {}
    for where, rec in _json_records(path):
        if not isinstance(rec, dict):
            _bad(where, f"a record must be an object, got {type(rec).__name__}.", bad_lines)
            continue
        header = tuple(rec.keys())
        if header not in columns_cache:
            try:
                columns_cache[header] = _resolve_columns(task, list(header), path, require_label)
            except GlueFormatError as err:
                raise GlueFormatError(f"{where}: {str(err).split(': ', 1)[1]}") from None
        values = list(rec.values())
        try:
            records.append(_make_record(task, values, columns_cache[header], where))
        except GlueFormatError as err:
            _bad(where, str(err).split(": ", 1)[1], bad_lines)
    return records


def read_glue_file(path: str, task: str | GlueTask, *, require_label: bool = True, bad_lines: str = "error"):
    """Read a local GLUE file (``.tsv``, ``.csv``, ``.json`` / ``.jsonl``) into a ``datasets.Dataset`` with the
    hub's columns (the task's text columns, plus ``label`` when present).

    Raises:
        FileNotFoundError: the file does not exist.
        GlueFormatError: a malformed row, a missing column or a bad label, naming ``path:line``.
        ValueError: an unknown task or file extension.
    """
    import datasets

    task = get_task(task) if isinstance(task, str) else task
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GLUE file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".tsv":
        records = read_glue_tsv(path, task, require_label=require_label, bad_lines=bad_lines)
    elif ext == ".csv":
        records = read_glue_csv(path, task, require_label=require_label, bad_lines=bad_lines)
    elif ext in (".json", ".jsonl"):
        records = read_glue_json(path, task, require_label=require_label, bad_lines=bad_lines)
    else:
        raise ValueError(f"{path}: unsupported file extension {ext!r}; use .tsv (GLUE as distributed), .csv or .json.")
    if not records:
        raise GlueFormatError(f"{path}:1: no examples found.")
    columns = [k for k in task.keys if k is not None]
    if "label" in records[0]:
        columns.append("label")
    features = {k: datasets.Value("string") for k in task.keys if k is not None}
    if "label" in columns:
        features["label"] = (
            datasets.Value("float32") if task.is_regression else datasets.ClassLabel(names=list(task.label_list))
        )
    return datasets.Dataset.from_dict(
        {c: [r[c] for r in records] for c in columns}, features=datasets.Features(features)
    )


# ---------------------------------------------------------------------------------------------------------------------
# Scores and the GLUE table
# ---------------------------------------------------------------------------------------------------------------------


def glue_task_score(task: str | GlueTask, metrics: dict) -> float | None:
    """The task's GLUE score in percent from its eval metrics (keys with or without the ``eval_`` prefix).

    Choice (GLUE paper convention): a task with several metrics scores the unweighted mean of them (MRPC / QQP: F1 and
    accuracy; STS-B: Pearson and Spearman); MNLI scores the mean of matched and mismatched accuracy (matched alone
    when no mismatched set was evaluated). Returns None when a needed metric is missing.
    """
    task = get_task(task) if isinstance(task, str) else task

    def get(key):
        for k in (f"eval_{key}", key):
            if k in metrics and metrics[k] is not None:
                return float(metrics[k])
        return None

    values = [get(k) for k in task.main_metric]
    if task.name == "mnli":
        mm = get("accuracy_mm")
        if mm is not None:
            values.append(mm)
    if not values or any(v is None for v in values):
        return None
    return 100.0 * sum(values) / len(values)


def _cell(task: GlueTask, metrics: dict | None) -> str:
    if not metrics:
        return "–"

    def pct(key):
        for k in (f"eval_{key}", key):
            if metrics.get(k) is not None:
                return f"{100 * float(metrics[k]):.1f}"
        return "–"

    if task.name == "mnli":
        return f"{pct('accuracy')}/{pct('accuracy_mm')}" if any("_mm" in k for k in metrics) else pct("accuracy")
    if task.name in ("mrpc", "qqp"):
        return f"{pct('f1')}/{pct('accuracy')}"
    if task.name == "stsb":
        return f"{pct('pearson')}/{pct('spearmanr')}"
    return pct(task.main_metric[0])


def glue_average(per_task: dict[str, dict], tasks=SUITE_TASKS) -> tuple[float | None, int]:
    """(mean of the task scores over ``tasks`` that have one, number of such tasks)."""
    scores = [glue_task_score(t, per_task[t]) for t in tasks if per_task.get(t)]
    scores = [s for s in scores if s is not None]
    return (sum(scores) / len(scores) if scores else None), len(scores)


def format_glue_table(rows: list[tuple[str, dict[str, dict]]], tasks=SUITE_TASKS) -> str:
    """Markdown GLUE table in the papers' layout: one row per run, a column per task, then the average.

    Args:
        rows: ``(label, {task: eval metrics})`` per run (e.g. one per init).
        tasks: task columns (default: the 8 tasks, no WNLI).

    Cells are percentages: MNLI ``m/mm`` accuracy, MRPC / QQP ``F1/acc``, STS-B ``Pearson/Spearman``, CoLA Matthews,
    others accuracy. ``Avg`` is the mean of the task scores (:func:`glue_task_score`); when some tasks are missing it
    is marked ``(k/8)``.
    """
    task_objs = [get_task(t) for t in tasks]
    headers = []
    for t in task_objs:
        suffix = {"mnli": " (m/mm)", "mrpc": " (F1/acc)", "qqp": " (F1/acc)", "stsb": " (P/S)", "cola": " (MCC)"}
        headers.append(t.display + suffix.get(t.name, ""))
    lines = ["| Run | " + " | ".join(headers) + " | Avg |", "|---" * (len(headers) + 2) + "|"]
    for label, per_task in rows:
        cells = [_cell(t, per_task.get(t.name)) for t in task_objs]
        avg, n = glue_average(per_task, tasks)
        avg_cell = "–" if avg is None else f"{avg:.1f}" + ("" if n == len(task_objs) else f" ({n}/{len(task_objs)})")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {avg_cell} |")
    return "\n".join(lines) + "\n"
