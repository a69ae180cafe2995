"""Where the ``--glue_suite`` tasks' local files are: a ``--suite_files`` JSON, or the GLUE distribution's folders
under ``--glue_data_dir`` (``CoLA/train.tsv``, ``MNLI/dev_matched.tsv``, ...)."""

from __future__ import annotations

import json
import os

from .tasks import GLUE_TASKS

#: Directory names of the GLUE distribution, and the file names looked for in --glue_data_dir.
TASK_DIRS = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
}
FILE_CANDIDATES = {
    "train": ("train.tsv", "train.csv", "train.json", "train.jsonl"),
    "validation": ("dev.tsv", "dev_matched.tsv", "dev.csv", "dev.json", "dev.jsonl"),
    "validation_mismatched": ("dev_mismatched.tsv",),
}


def suite_task_files(task: str, suite_files: str | None, glue_data_dir: str | None) -> dict[str, str]:
    """Local files of one ``--glue_suite`` task, as ``{split: path}`` (splits ``train``, ``validation``,
    ``validation_mismatched``, ``test``): the task's entry of the ``--suite_files`` JSON (paths relative to that
    file), else the GLUE distribution's layout under ``--glue_data_dir`` (:data:`TASK_DIRS`, the first file found
    of each split's candidates), else ``{}`` (the hub's copy). Raises ``ValueError`` for an unknown task or key in
    the JSON."""
    if suite_files:
        with open(suite_files) as handle:
            mapping = json.load(handle)
        unknown = set(mapping) - set(GLUE_TASKS)
        if unknown:
            raise ValueError(f"{suite_files}: unknown tasks {sorted(unknown)}.")
        if task in mapping:
            entry = mapping[task]
            bad = set(entry) - {"train", "validation", "validation_mismatched", "test"}
            if bad:
                raise ValueError(f"{suite_files}: task {task}: unknown keys {sorted(bad)}.")
            base = os.path.dirname(os.path.abspath(suite_files))
            return {k: v if os.path.isabs(v) else os.path.join(base, v) for k, v in entry.items()}
    if glue_data_dir:
        task_dir = os.path.join(glue_data_dir, TASK_DIRS[task])
        found = {}
        for split, names in FILE_CANDIDATES.items():
            if split == "validation_mismatched" and task != "mnli":
                continue
            for name in names:
                path = os.path.join(task_dir, name)
                if os.path.isfile(path):
                    found[split] = path
                    break
        return found
    return {}
