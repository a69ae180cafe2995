"""Top-1 accuracy as an offline ``evaluate`` module (no hub access needed).

Load it by path, never by name::

    import evaluate
    from hf_condinit.vision import ACCURACY_METRIC_PATH
    metric = evaluate.load(ACCURACY_METRIC_PATH)          # or hf_condinit.vision.load_accuracy_metric()
    metric.compute(predictions=[1, 0, 1], references=[1, 1, 1])   # {'accuracy': 0.666...}

Same result as the hub's ``accuracy`` metric without weights: the fraction of predictions equal to the reference.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """\
Accuracy: the fraction of predicted class ids equal to the reference class ids (offline copy shipped with
hf_condinit, used by run_image_classification.py).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (int).
    references: gold class ids (int), same length as predictions.
Returns:
    "accuracy": a fraction in [0, 1].
Examples:
    >>> accuracy = evaluate.load(path_to_this_module)
    >>> accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'accuracy': 0.6666666666666666}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
            reference_urls=[],
            format="numpy",
        )

    def _compute(self, predictions, references):
        return {"accuracy": float((np.asarray(predictions) == np.asarray(references)).mean())}
