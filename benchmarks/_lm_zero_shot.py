"""The zero-shot evaluations recorded with every LM run of the harness: BLiMP minimal pairs
(:func:`evaluate_blimp`, through ``hf_condinit.evaluation``) and the held-out cloze (:func:`evaluate_cloze`, on the
documents the run held out), and their late addition to finished records whose model is still saved
(:func:`add_missing_blimp`, :func:`add_missing_cloze`)."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Optional

from _common import BLIMP_DIR, LMData, write_json


def blimp_dir_for(args, tag: str = "compare") -> Optional[str]:
    """The BLiMP folder that compare.py's LM runs are scored on (``--blimp-dir``, default :data:`BLIMP_DIR`), or
    None: ``--no-blimp``, ``--quick`` without ``--blimp-dir``, or no ``*.jsonl`` there (then with a note on
    stderr: the runs are recorded without BLiMP accuracy)."""
    if args.no_blimp or (args.quick and args.blimp_dir is None):
        return None
    path = args.blimp_dir or BLIMP_DIR
    if os.path.isdir(path) and any(f.endswith(".jsonl") for f in os.listdir(path)):
        return path
    print(f"[{tag}] note: no BLiMP data at {path} (--blimp-dir): runs are recorded without BLiMP accuracy",
          file=sys.stderr)
    return None


def evaluate_blimp(model, tokenizer, blimp_dir: str) -> dict:
    """BLiMP accuracy of ``model`` (``hf_condinit.zero_shot.evaluate_blimp``: a pair is right when the grammatical
    sentence has the higher total log-probability; every sentence prefixed with EOS, the same for every arm):
    ``blimp_accuracy`` (0-1), ``blimp_field_accuracy``, ``blimp_paradigm_accuracy``, ``blimp_n_pairs``,
    ``blimp_prefix``, plus ``blimp_seconds`` (wall time) and ``blimp_dir``."""
    from hf_condinit.zero_shot import evaluate_blimp as score

    t = time.perf_counter()
    was = model.training
    model.eval()
    try:
        out = score(model, tokenizer, blimp_dir, batch_size=64, prefix="eos", device=None, show_progress=False)
    finally:
        model.train(was)
    return dict(out, blimp_seconds=time.perf_counter() - t, blimp_dir=os.path.abspath(blimp_dir))


def blimp_saved_run(run_dir: str, tokenizer, blimp_dir: str) -> dict:
    """:func:`evaluate_blimp` for the model saved in a finished run's Trainer folder (the run is not retrained)."""
    import hf_condinit  # noqa: F401  (variants)
    from transformers import AutoModelForCausalLM

    return evaluate_blimp(AutoModelForCausalLM.from_pretrained(run_dir), tokenizer, blimp_dir)


def add_missing_blimp(paths: list, tokenizer, blimp_dir: Optional[str], tag: str = "compare",
                      data: Optional["LMData"] = None) -> None:
    """Finished runs ``paths`` = [(record path, Trainer folder)] whose record has no BLiMP accuracy: score the saved
    model when its folder is there and update the record (the run is not retrained); the others stay without it
    (the reports show "–"), counted in one line on stderr. Given ``data`` (the runs' data set), the same for the
    zero-shot cloze (:func:`add_missing_cloze`)."""
    if not blimp_dir:
        return
    if data is not None:
        add_missing_cloze(paths, data, tag)
    unsaved = 0
    for path, run_dir in paths:
        with open(path) as f:
            rec = json.load(f)
        if rec.get("blimp"):
            continue
        if not os.path.exists(os.path.join(run_dir, "config.json")):
            unsaved += 1
            continue
        print(f"[{tag}] {path}: BLiMP on the saved model", file=sys.stderr)
        rec["blimp"] = blimp_saved_run(run_dir, tokenizer, blimp_dir)
        write_json(path, rec)
    if unsaved:
        print(f"[{tag}] {unsaved} finished runs have no BLiMP accuracy and no saved model here: reported as '–'",
              file=sys.stderr)


def blimp_accuracy(rec: dict) -> Optional[float]:
    """A record's overall BLiMP accuracy (0-1), None for records made without it."""
    return (rec.get("blimp") or {}).get("blimp_accuracy")


# the zero-shot cloze recorded next to BLiMP (hf_condinit.evaluation.cloze: k = 4 words, chance 0.25)
CLOZE = dict(n_items=1000, n_choices=4, seed=0, min_context_words=8, max_context_tokens=128)


@functools.lru_cache(maxsize=2)
def _heldout_documents(paths: tuple, max_bytes: Optional[int], val_fraction: float) -> tuple:
    from hf_condinit.data.documents import documents_dataset, read_documents

    return tuple(documents_dataset(read_documents(list(paths), max_bytes), val_fraction)["validation"]["text"])


def heldout_documents(info: dict) -> list:
    """The held-out documents of a data set (``LMData.info``): the first ``val_fraction`` of the documents of its
    files (:func:`prepare_data`), the split its eval loss is measured on; no run trains on them."""
    docs = _heldout_documents(tuple(info["paths"]), info["max_bytes"], info["val_fraction"])
    if len(docs) != info["val_documents"]:
        raise ValueError(f"the data files changed: {len(docs)} held-out documents, {info['val_documents']} recorded")
    return list(docs)


def evaluate_cloze(model, data: LMData) -> dict:
    """The zero-shot cloze (``hf_condinit.evaluation.cloze.evaluate_cloze`` with :data:`CLOZE`) of ``model`` on the
    held-out documents of ``data`` (:func:`heldout_documents`): ``cloze_accuracy`` (0-1), ``cloze_ci95``,
    ``cloze_chance``, ``cloze_at_chance``, ..., plus ``cloze_seconds`` and ``cloze_split``."""
    from hf_condinit.evaluation.cloze import evaluate_cloze as score

    t = time.perf_counter()
    out = score(model, data.tokenizer, heldout_documents(data.info), **CLOZE)
    return dict(out, cloze_seconds=time.perf_counter() - t,
                cloze_split=f"held-out: first {data.info['val_fraction']:g} of the documents of {data.info['path']}")


def add_missing_cloze(paths: list, data: LMData, tag: str = "compare") -> None:
    """Finished runs ``paths`` = [(record path, Trainer folder)] whose record has no cloze: score the saved model
    (:func:`evaluate_cloze`) when its folder is there and update the record; the others are counted on stderr (the
    committed records keep no weights)."""
    import hf_condinit  # noqa: F401  (variants)
    from transformers import AutoModelForCausalLM

    unsaved = 0
    for path, run_dir in paths:
        with open(path) as f:
            rec = json.load(f)
        if rec.get("cloze") or rec.get("diverged"):
            continue
        if not os.path.exists(os.path.join(run_dir, "config.json")):
            unsaved += 1
            continue
        print(f"[{tag}] {path}: cloze on the saved model", file=sys.stderr)
        rec["cloze"] = evaluate_cloze(AutoModelForCausalLM.from_pretrained(run_dir), data)
        write_json(path, rec)
    if unsaved:
        print(f"[{tag}] {unsaved} finished runs have no cloze and no saved model here", file=sys.stderr)
