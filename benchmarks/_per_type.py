"""The command-line frame of the per-model-type probes (`inertness.py`, `shrunk_configs.py`): the flags, the ``--out``
check, one probe per type under a CPU-time limit with one printed line each, and the JSON-lines record."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable


def parser(description: str, types_help: str) -> argparse.ArgumentParser:
    """``--types`` (``types_help`` says the default), ``--timeout`` (CPU seconds per type) and ``--out``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", nargs="+", help=f"model types (default: {types_help})")
    p.add_argument("--timeout", type=float, default=120, help="CPU seconds per type (0: no limit)")
    p.add_argument("--out", help="write one JSON line per type to this file (default: write nothing)")
    return p


def out_is_folder(out: str | None) -> bool:
    """True (after one error line) when ``--out`` names a folder."""
    if out and os.path.isdir(out):
        print(f"error: --out {out} is a folder; give a file name", file=sys.stderr)
        return True
    return False


def probe_each(types: list[str], probe: Callable[[str], Any], timed_out: Callable[[str, Exception], Any],
               line: Callable[[Any], str], timeout: float) -> tuple[list, float]:
    """``probe(type)`` for every type under ``timeout`` CPU seconds (``timed_out(type, err)`` stands in when it runs
    out), printing ``line(row)`` as each finishes; returns (rows, wall seconds). transformers' logging is quietened."""
    import transformers

    from hf_condinit.inertness import CpuTimeout, cpu_time_limit

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    rows, start = [], time.perf_counter()
    for model_type in types:
        try:
            with cpu_time_limit(timeout):
                row = probe(model_type)
        except CpuTimeout as err:
            row = timed_out(model_type, err)
        rows.append(row)
        print(line(row), flush=True)
    return rows, time.perf_counter() - start


def write_jsonl(out: str | None, rows: list[dict]) -> None:
    """One JSON line per row into ``out`` (nothing without it)."""
    if out:
        with open(out, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {out}")
