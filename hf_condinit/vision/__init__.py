"""Vision in one place: image-classification data (loading, the CIFAR-style augmentation, collation) and the offline
accuracy metric used by ``run_image_classification.py`` and ``benchmarks/compare.py --task vision``.

- :mod:`.data`: :func:`load_image_datasets`, :func:`image_and_label_columns`, :class:`ImageTransform`,
  :func:`random_crop_flip`, :func:`collate_fn`;
- :mod:`.metric`: :func:`load_accuracy_metric` and :data:`ACCURACY_METRIC_PATH`, the shipped ``evaluate`` module
  (``accuracy_metric.py``, loaded by path, no hub).
"""

from .data import ImageTransform, check_image_source, collate_fn, image_and_label_columns, load_image_datasets
from .data import random_crop_flip
from .metric import ACCURACY_METRIC_PATH, load_accuracy_metric

__all__ = [
    "ACCURACY_METRIC_PATH",
    "ImageTransform",
    "check_image_source",
    "collate_fn",
    "image_and_label_columns",
    "load_accuracy_metric",
    "load_image_datasets",
    "random_crop_flip",
]
