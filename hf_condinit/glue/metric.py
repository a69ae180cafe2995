"""The GLUE metric, loaded offline from the ``evaluate`` module shipped in this package.

``GLUE_METRIC_PATH`` is the path of the GLUE ``evaluate`` module (``glue_metric.py`` beside this file);
``evaluate.load`` accepts it directly. ``load_glue_metric(task)`` maps a task name (``"rte"``, ``"sst-2"``, ``"STS-B"``, ``"mnli-mm"``, ...) to the
metric configuration and loads it offline.
"""

from __future__ import annotations

import os

__all__ = ["GLUE_METRIC_PATH", "glue_metric_config_name", "load_glue_metric"]

GLUE_METRIC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "glue_metric.py")

_ALIASES = {
    "sst-2": "sst2",
    "sts-b": "stsb",
    "mnli-m": "mnli_matched",
    "mnli-mm": "mnli_mismatched",
    "mnli_m": "mnli_matched",
    "mnli_mm": "mnli_mismatched",
    "ax": "mnli",
}
_CONFIGS = (
    "sst2", "mnli", "mnli_mismatched", "mnli_matched", "cola", "stsb", "mrpc", "qqp", "qnli", "rte", "wnli", "hans",
    "classification", "regression",
)


def glue_metric_config_name(task: str) -> str:
    """Normalise a GLUE task name to the metric configuration name; ``ValueError`` for an unknown task."""
    key = task.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _CONFIGS:
        raise ValueError(f"Unknown GLUE task {task!r} for the GLUE metric; expected one of {list(_CONFIGS)}.")
    return key


def load_glue_metric(task: str, **kwargs):
    """``evaluate.load`` of the shipped GLUE metric for ``task``, with no hub access.

    Args:
        task (`str`): GLUE task name (case-insensitive; ``sst-2`` / ``sts-b`` / ``mnli-mm`` spellings accepted), or
            ``classification`` / ``regression`` for one's own files (:mod:`.custom`).
        **kwargs: passed to ``evaluate.load`` (e.g. ``experiment_id``, ``cache_dir``).
    """
    import evaluate

    return evaluate.load(GLUE_METRIC_PATH, glue_metric_config_name(task), **kwargs)
