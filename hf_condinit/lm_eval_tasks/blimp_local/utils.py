"""Data loader of the ``blimp_local`` tasks: one paradigm's JSONL file from a local folder, as lm-eval's ``test``
split. The folder comes from lm-eval's metadata (``--metadata '{"blimp_dir": DIR}'``) or the environment variable
``HF_CONDINIT_BLIMP_DIR``."""

import os

import datasets

from hf_condinit.evaluation.minimal_pairs import load_minimal_pairs

ENV_VAR = "HF_CONDINIT_BLIMP_DIR"


def load_paradigm(paradigm: str, blimp_dir: str | None = None, **_ignored):
    """``{"test": Dataset}`` of ``<blimp_dir>/<paradigm>.jsonl`` with columns ``sentence_good``, ``sentence_bad``,
    ``field`` (``_ignored``: the other metadata lm-eval passes, e.g. the model arguments)."""
    blimp_dir = blimp_dir or os.environ.get(ENV_VAR)
    if not blimp_dir:
        raise ValueError(f"blimp_local: say where the BLiMP JSONL files are: --metadata '{{\"blimp_dir\": DIR}}' "
                         f"or {ENV_VAR}=DIR")
    items = load_minimal_pairs(blimp_dir, paradigms=[paradigm]).items
    rows = [{"sentence_good": it.choices[0], "sentence_bad": it.choices[1], "field": it.group} for it in items]
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}
