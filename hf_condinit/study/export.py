"""A study folder's record without its weights: ``python -m hf_condinit.study --out STUDY --export DEST``.

``DEST`` gets ``study.json``, the ``failed/`` records and, from every cell folder under ``arms/``, only the files
directly in it whose names end in :data:`RECORD_SUFFIXES` (the run's results, ``trainer_state.json`` with its
eval curve, ``config.json`` with the recipe, the model card ``README.md``, ``condition_number.jsonl``, the run's
plots); no ``checkpoint-*`` folder, no weights (``*.safetensors``, ``*.bin``, ``*.pt``), no hidden file (the run's
lock), no claim or log. Then the report is written in ``DEST``.

A cell of the copy is finished exactly when it was in ``STUDY`` (:func:`hf_condinit.study.cells.cell_state` reads
``train_results.json`` and the metric's results file, both copied), and failed when it was (its record is copied),
so ``--report`` on the copy writes the same report (the heading names the folder: give ``DEST`` the same last name
for the same bytes), and rerunning the study's command on a complete copy runs no cell. An unfinished cell's
folder is copied as far as it has these files; its checkpoints are not, so running it from the copy starts it over.
"""

from __future__ import annotations

import os
import shutil

from .plan import PLAN_FILE

__all__ = ["RECORD_SUFFIXES", "export_record"]

#: The files of a cell folder that are its record (name endings).
RECORD_SUFFIXES = (".json", ".jsonl", ".md", ".png")


def export_record(out: str, dest: str) -> list[str]:
    """Copy the record of the study in ``out`` to ``dest`` (module docstring); returns the copied paths relative to
    ``dest``, sorted. ``ValueError`` when ``dest`` exists and is not empty, or is ``out`` or inside it."""
    src, dst = os.path.realpath(out), os.path.realpath(dest)
    if dst == src or dst.startswith(src + os.sep):
        raise ValueError(f"--export {dest}: give a folder outside the study {out}")
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise ValueError(f"--export {dest} exists and is not an empty folder; give a new folder (nothing is "
                         "overwritten)")
    wanted = [PLAN_FILE]
    failed = os.path.join(out, "failed")
    if os.path.isdir(failed):
        wanted += [os.path.join("failed", n) for n in sorted(os.listdir(failed)) if n.endswith(".json")]
    arms = os.path.join(out, "arms")
    for arm in sorted(os.listdir(arms)) if os.path.isdir(arms) else []:
        for cell in sorted(os.listdir(os.path.join(arms, arm))) if os.path.isdir(os.path.join(arms, arm)) else []:
            folder = os.path.join(arms, arm, cell)
            if os.path.isdir(folder):
                wanted += [os.path.join("arms", arm, cell, n) for n in sorted(os.listdir(folder))
                           if n.endswith(RECORD_SUFFIXES) and not n.startswith(".")
                           and os.path.isfile(os.path.join(folder, n))]
    for rel in wanted:
        os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
        shutil.copy2(os.path.join(out, rel), os.path.join(dest, rel))
    return sorted(wanted)
