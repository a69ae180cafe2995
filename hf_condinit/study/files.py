"""Atomic JSON writes (:func:`write_json`) for files that concurrent workers read: the study's plan and cell
states (:mod:`hf_condinit.study.cells`). The workers' claims on cells are :mod:`hf_condinit.locks`."""

from __future__ import annotations

import json
import os

__all__ = ["write_json"]


def write_json(path: str, obj) -> None:
    """Write ``obj`` to ``path`` as indented JSON in one step (a temporary file beside it, then ``os.replace``):
    a reader never sees half a file, and a file that exists is complete. Numbers of other types (NumPy or torch
    scalars) are written as floats; the folder is created."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=float)
    os.replace(tmp, path)
