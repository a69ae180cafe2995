"""Inert unless asked, over every model type: ``import hf_condinit`` must not change a model that did not ask for it.

``python benchmarks/inertness.py [--types a b ...] [--timeout 120] [--out FILE.jsonl]``: for every model type of the
installed transformers (or the ones given), `hf_condinit.inertness.check_inert` builds its miniature (the shrunk
default config of the coverage table) with the plugin's hooks installed and uninstalled, same seed, and compares the
outcome, the state dicts bit for bit, the files ``save_pretrained`` writes and a reload in both modes. It prints one
line per type and the counts (types tried, built, identical, differences: must be 0); with ``--out`` it writes one
JSON line per type there (nothing is written otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", nargs="+", help="model types (default: every model type of the installed transformers)")
    p.add_argument("--timeout", type=float, default=120, help="CPU seconds per type (0: no limit)")
    p.add_argument("--out", help="write one JSON line per type to this file (default: write nothing)")
    args = p.parse_args(argv)
    if args.out and os.path.isdir(args.out):
        print(f"error: --out {args.out} is a folder; give a file name", file=sys.stderr)
        return 2

    import transformers

    import hf_condinit  # noqa: F401
    from hf_condinit.inertness import CpuTimeout, Inertness, all_model_types, check_inert, cpu_time_limit

    known = all_model_types()
    unknown = sorted(set(args.types or ()) - set(known))
    if unknown:
        print(f"error: not model types of transformers {transformers.__version__}: {' '.join(unknown)}",
              file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    rows, start = [], time.perf_counter()
    for model_type in args.types or known:
        try:
            with cpu_time_limit(args.timeout):
                row = check_inert(model_type)
        except CpuTimeout as err:
            row = Inertness(model_type, "timeout", detail=str(err))
        rows.append(row)
        print(f"{model_type:36s} {row.status:16s} {row.detail[:100]}", flush=True)
    by = Counter(r.status for r in rows)
    built = sum(by[s] for s in ("identical", "different", "nondeterministic"))
    exact = sum(r.round_trip is True for r in rows)
    print(f"\n{len(rows)} types tried (transformers {transformers.__version__}); built from a shrunk default config "
          f"(in at least one mode): {built}; identical with and without the hooks: {by['identical']}; "
          f"differences: {by['different']}"
          f"{' (' + ' '.join(r.model_type for r in rows if r.status == 'different') + ')' if by['different'] else ''}"
          f"; nondeterministic plain builds: {by['nondeterministic']}; timeouts: {by['timeout']}; "
          f"too large to build here: {by['too large']}; "
          f"save/reload exact in both modes: {exact}  ({time.perf_counter() - start:.0f} s)")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")
        print(f"wrote {args.out}")
    return 1 if by["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
