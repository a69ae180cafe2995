"""GLUE metric as an offline ``evaluate`` module (no hub access needed).

Load it by path, never by name::

    import evaluate
    from hf_condinit.glue import GLUE_METRIC_PATH
    metric = evaluate.load(GLUE_METRIC_PATH, "mrpc")      # or hf_condinit.glue.load_glue_metric("mrpc")
    metric.compute(predictions=[1, 0, 1], references=[1, 1, 1])

Metrics per configuration (Wang et al. 2018, and the metric table of docs/methods.md §7):
    cola:                       matthews_correlation  (sklearn.metrics.matthews_corrcoef)
    stsb:                       pearson, spearmanr    (scipy.stats.pearsonr / spearmanr)
    mrpc, qqp:                  accuracy, f1          (f1 of the positive class, sklearn.metrics.f1_score)
    sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, hans:  accuracy
    classification (one's own files, run_glue.py without --task_name): accuracy, f1 (of class 1 with labels 0 / 1,
                                macro over the classes with more)
    regression (one's own files with float labels): pearson, spearmanr
The values are fractions in [0, 1] (correlations in [-1, 1]), as in the hub's ``glue`` metric.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  note={In the Proceedings of ICLR.},
  year={2019}
}
"""

_DESCRIPTION = """\
GLUE, the General Language Understanding Evaluation benchmark: the metric of each task (offline copy shipped with
hf_condinit).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted labels (int class ids; float scores for stsb).
    references: gold labels, same type and length as predictions.
Returns: depending on the configuration,
    "accuracy" (mrpc, qqp, sst2, mnli*, qnli, rte, wnli, hans), "f1" (mrpc, qqp),
    "pearson" and "spearmanr" (stsb), "matthews_correlation" (cola).
Examples:
    >>> glue_metric = evaluate.load(path_to_this_module, "mrpc")
    >>> glue_metric.compute(predictions=[0, 1], references=[0, 1])
    {'accuracy': 1.0, 'f1': 1.0}
"""

CONFIG_NAMES = (
    "sst2",
    "mnli",
    "mnli_mismatched",
    "mnli_matched",
    "cola",
    "stsb",
    "mrpc",
    "qqp",
    "qnli",
    "rte",
    "wnli",
    "hans",
    "classification",
    "regression",
)


def simple_accuracy(preds, labels) -> float:
    return float((np.asarray(preds) == np.asarray(labels)).mean())


def acc_and_f1(preds, labels) -> dict:
    return {"accuracy": simple_accuracy(preds, labels), "f1": float(f1_score(y_true=labels, y_pred=preds))}


def acc_and_class_f1(preds, labels) -> dict:
    """Accuracy and F1: of class 1 when every label and prediction is 0 or 1, else the macro mean over the classes."""
    binary = max(np.max(preds, initial=0), np.max(labels, initial=0)) <= 1
    f1 = f1_score(y_true=labels, y_pred=preds, average="binary" if binary else "macro")
    return {"accuracy": simple_accuracy(preds, labels), "f1": float(f1)}


def pearson_and_spearman(preds, labels) -> dict:
    return {"pearson": float(pearsonr(preds, labels)[0]), "spearmanr": float(spearmanr(preds, labels)[0])}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIG_NAMES:
            raise KeyError(
                f"Unknown GLUE metric configuration {self.config_name!r}; expected one of {list(CONFIG_NAMES)}."
            )
        dtype = "float32" if self.config_name in ("stsb", "regression") else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            codebase_urls=[],
            reference_urls=[],
            format="numpy",
        )

    def _compute(self, predictions, references):
        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name in ("stsb", "regression"):
            return pearson_and_spearman(predictions, references)
        if self.config_name in ("mrpc", "qqp"):
            return acc_and_f1(predictions, references)
        if self.config_name == "classification":
            return acc_and_class_f1(predictions, references)
        return {"accuracy": simple_accuracy(predictions, references)}
