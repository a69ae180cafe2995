"""GLUE in one place: the task table, readers for local GLUE files, scores and tables, and the offline metric.

- :mod:`.tasks`: :class:`GlueTask`, :data:`GLUE_TASKS`, the local-file readers (TSV / CSV / JSON), the GLUE score
  of a task and the suite table;
- :mod:`.local_files`: :func:`suite_task_files`, where the ``--glue_suite`` tasks' local files are;
- :mod:`.custom`: one's own csv / json classification or regression files (``run_glue.py`` without ``--task_name``);
- :mod:`.metric`: :func:`load_glue_metric` and :data:`GLUE_METRIC_PATH`, the shipped ``evaluate`` module
  (``glue_metric.py``, loaded by path, no hub).
"""

from .custom import custom_task, load_custom_files
from .local_files import suite_task_files
from .metric import GLUE_METRIC_PATH, glue_metric_config_name, load_glue_metric
from .tasks import (
    GLUE_TASKS,
    SUITE_TASKS,
    GlueFormatError,
    GlueTask,
    format_glue_table,
    get_task,
    glue_average,
    glue_label_to_id,
    glue_task_score,
    read_glue_csv,
    read_glue_file,
    read_glue_json,
    read_glue_tsv,
    task_to_keys,
)

__all__ = [
    "GLUE_METRIC_PATH",
    "custom_task",
    "load_custom_files",
    "GLUE_TASKS",
    "SUITE_TASKS",
    "GlueFormatError",
    "GlueTask",
    "format_glue_table",
    "get_task",
    "glue_average",
    "glue_label_to_id",
    "glue_metric_config_name",
    "glue_task_score",
    "load_glue_metric",
    "read_glue_csv",
    "read_glue_file",
    "read_glue_json",
    "read_glue_tsv",
    "suite_task_files",
    "task_to_keys",
]
