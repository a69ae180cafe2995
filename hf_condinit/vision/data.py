"""Image-classification data for ``run_image_classification.py`` and ``benchmarks/compare.py --task vision``.

- :func:`load_image_datasets`: a ``DatasetDict`` from the hub (``--dataset_name``) or from local files: a ``datasets``
  parquet file, or an imagefolder directory (``<dir>/<class name>/<image>``, read by the ``imagefolder`` builder).
- :func:`image_and_label_columns`: the image column (a ``datasets.Image`` feature) and the label column (a
  ``ClassLabel``), by name or found from the features.
- :class:`ImageTransform`: the batch transform given to ``Dataset.set_transform``, as in HF's
  ``run_image_classification.py``: RGB → uint8 (B, C, H, W) → resized to the model's size → for training, random crop
  with zero padding and random horizontal flip (the usual CIFAR augmentation) → scaled to [0, 1] and normalised with
  the image processor's mean / std.
- :func:`collate_fn`: stacks ``pixel_values`` (B, C, H, W) float32 and ``labels`` (B,) int64.

Why not torchvision: its PyPI wheels are built against CUDA torch and fail to load with the CPU build of torch
(``operator torchvision::nms does not exist``, which also breaks ``import transformers``), so the two augmentations
are written here in torch, with torchvision's semantics: ``RandomCrop(size, padding=p)`` (zero fill, offsets uniform
in [0, 2p] per image and axis) and ``RandomHorizontalFlip(0.5)``.

Reproducibility: the augmentation draws from the transform's own ``torch.Generator`` (seeded with ``seed``), never
from the global RNG, so runs with the same seed and the same batch order (the Trainer's sampler is seeded by
``--seed``) see the same augmented batches whatever the model does with the global RNG. With
``dataloader_num_workers > 0`` each worker gets a copy of the generator (still deterministic, but workers repeat
each other's draws): keep the default 0 workers when that matters.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "load_image_datasets",
    "check_image_source",
    "image_and_label_columns",
    "random_crop_flip",
    "ImageTransform",
    "collate_fn",
]

PARQUET_SUFFIXES = (".parquet",)


def check_image_source(path: str, flag: str) -> None:
    """``ValueError`` (one line, naming ``flag``) unless ``path`` is a readable parquet file (its footer is read) or
    an existing directory."""
    if os.path.isdir(path):
        return
    if not os.path.exists(path):
        raise ValueError(f"{flag} {path!r} does not exist; pass a .parquet file or an imagefolder directory")
    if not path.endswith(PARQUET_SUFFIXES):
        raise ValueError(f"{flag} {path!r} is not a .parquet file or a directory (imagefolder: <dir>/<label>/<image>)")
    import pyarrow.parquet as pq

    try:
        pq.read_schema(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{flag} {path!r} is not a readable parquet file ({str(err).splitlines()[0]})") from None


def _load_local(path: str, cache_dir: str | None):
    import datasets

    if os.path.isdir(path):
        return datasets.load_dataset("imagefolder", data_dir=path, split="train", cache_dir=cache_dir)
    return datasets.load_dataset("parquet", data_files={"train": path}, split="train", cache_dir=cache_dir)


def load_image_datasets(dataset_name: str | None = None, dataset_config_name: str | None = None,
                        train_file: str | None = None, validation_file: str | None = None,
                        cache_dir: str | None = None, token: str | None = None):
    """A ``datasets.DatasetDict`` with ``train`` and/or ``validation`` (hub splits as published when
    ``dataset_name`` is given; otherwise one split per local file given)."""
    import datasets

    if dataset_name is not None:
        return datasets.load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir, token=token)
    splits = {}
    for split, path in (("train", train_file), ("validation", validation_file)):
        if path is not None:
            splits[split] = _load_local(path, cache_dir)
    return datasets.DatasetDict(splits)


def image_and_label_columns(features, image_column: str | None = None, label_column: str | None = None) -> tuple[str, str]:
    """The image and label column names of ``features``: the given names when present, else the only
    ``datasets.Image`` column and the only ``ClassLabel`` column (``label`` / ``labels`` as fallbacks).

    Raises ``ValueError`` naming the columns found when a column is missing or ambiguous."""
    import datasets

    def pick(given, kind, fallbacks):
        if given is not None:
            if given not in features:
                raise ValueError(f"--{kind}_column_name {given!r} is not a column; columns: {list(features)}")
            return given
        typ = datasets.Image if kind == "image" else datasets.ClassLabel
        found = [name for name, f in features.items() if isinstance(f, typ)]
        if len(found) == 1:
            return found[0]
        found = [name for name in fallbacks if name in features]
        if len(found) == 1:
            return found[0]
        raise ValueError(f"cannot tell the {kind} column among {list(features)}; pass --{kind}_column_name")

    return pick(image_column, "image", ("image", "img")), pick(label_column, "label", ("label", "labels"))


def random_crop_flip(images: torch.Tensor, padding: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """torchvision's ``RandomCrop(size, padding=padding)`` + ``RandomHorizontalFlip(0.5)`` on a batch.

    Args:
        images: (B, C, H, W), any dtype; the crop keeps H × W.
        padding: zero padding on every side before the crop (0: no crop).
        flip: whether to flip each image left-right with probability 1/2.
        generator: source of the offsets (uniform in [0, 2·padding] per image and axis) and of the flips.

    Returns:
        (B, C, H, W), same dtype.
    """
    B, _, H, W = images.shape
    out = images
    if padding > 0:
        padded = F.pad(images, (padding, padding, padding, padding))
        offsets = torch.randint(0, 2 * padding + 1, (B, 2), generator=generator)
        out = torch.stack([padded[b, :, y:y + H, x:x + W] for b, (y, x) in enumerate(offsets.tolist())])
    if flip:
        mask = torch.rand(B, generator=generator) < 0.5
        out = torch.where(mask[:, None, None, None], out.flip(-1), out)
    return out


class ImageTransform:
    """Batch transform for ``Dataset.set_transform``: images → normalised ``pixel_values``, labels → ``labels``.

    Args:
        image_column, label_column: column names (:func:`image_and_label_columns`).
        size: (height, width) of the model input; images of another size are resized (bilinear, antialiased).
        mean, std: per-channel normalisation of pixel values scaled to [0, 1] (the image processor's).
        train: apply :func:`random_crop_flip` (``padding``, ``flip``) with this transform's generator.
        seed: seed of that generator.
    """

    def __init__(self, image_column: str, label_column: str, size: Sequence[int], mean: Sequence[float],
                 std: Sequence[float], *, train: bool, padding: int = 4, flip: bool = True, seed: int = 0):
        self.image_column, self.label_column = image_column, label_column
        self.size = (int(size[0]), int(size[1]))
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.train, self.padding, self.flip = train, padding, flip
        self.generator = torch.Generator().manual_seed(seed)

    def pixels(self, images) -> torch.Tensor:
        """PIL images (any mode and size) → (B, 3, H, W) float32 in [0, 1] at the model's size (no augmentation)."""
        out = []
        for im in images:
            t = torch.from_numpy(np.array(im.convert("RGB"), dtype=np.uint8)).permute(2, 0, 1).float()
            if tuple(t.shape[-2:]) != self.size:
                t = F.interpolate(t[None], size=self.size, mode="bilinear", antialias=True, align_corners=False)[0]
            out.append(t)
        return torch.stack(out) / 255.0

    def __call__(self, examples: dict) -> dict:
        x = self.pixels(examples[self.image_column])
        if self.train:
            x = random_crop_flip(x, self.padding, self.flip, self.generator)
        x = (x - self.mean) / self.std
        out = {"pixel_values": list(x)}
        if self.label_column in examples:
            out["labels"] = examples[self.label_column]
        return out


def collate_fn(examples: list[dict]) -> dict:
    """Stack a list of ``{"pixel_values": (C, H, W), "labels": int}`` into a model batch."""
    batch = {"pixel_values": torch.stack([e["pixel_values"] for e in examples])}
    if "labels" in examples[0]:
        batch["labels"] = torch.tensor([int(e["labels"]) for e in examples], dtype=torch.long)
    return batch
