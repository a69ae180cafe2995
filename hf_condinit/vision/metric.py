"""The accuracy metric of ``run_image_classification.py``, loaded offline from the ``evaluate`` module shipped in
this package (``accuracy_metric.py`` beside this file; ``evaluate.load`` accepts the path directly)."""

from __future__ import annotations

import os

__all__ = ["ACCURACY_METRIC_PATH", "load_accuracy_metric"]

ACCURACY_METRIC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accuracy_metric.py")


def load_accuracy_metric(**kwargs):
    """``evaluate.load`` of the shipped accuracy module, with no hub access (``kwargs`` go to ``evaluate.load``)."""
    import evaluate

    return evaluate.load(ACCURACY_METRIC_PATH, **kwargs)
