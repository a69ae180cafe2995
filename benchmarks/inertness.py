"""Inert unless asked, over every model type: ``import hf_condinit`` must not change a model that did not ask for it.

``python benchmarks/inertness.py [--types a b ...] [--timeout 120] [--out FILE.jsonl]``: for every model type of the
installed transformers (or the ones given), `hf_condinit.inertness.check_inert` builds its miniature (the shrunk
default config of the coverage table) with the plugin's hooks installed and uninstalled, same seed, and compares the
outcome, the state dicts bit for bit, the files ``save_pretrained`` writes and a reload in both modes. It prints one
line per type and the counts (types tried, built, identical, differences: must be 0); with ``--out`` it writes one
JSON line per type there (nothing is written otherwise).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import _per_type as P  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = P.parser(__doc__, "every model type of the installed transformers").parse_args(argv)
    if P.out_is_folder(args.out):
        return 2

    import transformers

    import hf_condinit  # noqa: F401
    from hf_condinit.inertness import Inertness, all_model_types, check_inert

    known = all_model_types()
    unknown = sorted(set(args.types or ()) - set(known))
    if unknown:
        print(f"error: not model types of transformers {transformers.__version__}: {' '.join(unknown)}",
              file=sys.stderr)
        return 2
    rows, seconds = P.probe_each(
        args.types or known, check_inert, lambda model_type, err: Inertness(model_type, "timeout", detail=str(err)),
        lambda row: f"{row.model_type:36s} {row.status:16s} {row.detail[:100]}", args.timeout)
    by = Counter(r.status for r in rows)
    built = sum(by[s] for s in ("identical", "different", "nondeterministic"))
    exact = sum(r.round_trip is True for r in rows)
    print(f"\n{len(rows)} types tried (transformers {transformers.__version__}); built from a shrunk default config "
          f"(in at least one mode): {built}; identical with and without the hooks: {by['identical']}; "
          f"differences: {by['different']}"
          f"{' (' + ' '.join(r.model_type for r in rows if r.status == 'different') + ')' if by['different'] else ''}"
          f"; nondeterministic plain builds: {by['nondeterministic']}; timeouts: {by['timeout']}; "
          f"too large to build here: {by['too large']}; "
          f"save/reload exact in both modes: {exact}  ({seconds:.0f} s)")
    P.write_jsonl(args.out, [dataclasses.asdict(row) for row in rows])
    return 1 if by["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
