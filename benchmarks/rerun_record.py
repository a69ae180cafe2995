"""Re-run the cells of committed run records through the current harness and say whether each ends where its record
does, bit for bit: the digest of the training batches, the final held-out loss, each ``--eval-file`` loss, the eval
curve and the training curve (and BLiMP accuracy with ``--blimp``). Same spec, seed, data and device as the record.

    python benchmarks/rerun_record.py benchmarks/results/scale/runs/2x64_tpp1_lr0.003/default/seed0.json
    python benchmarks/rerun_record.py RECORD ... --work /tmp/rerun --threads 1

Exit status 0 when every record is reproduced, 1 when one differs (the differing fields are printed)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import _lm_run as LM  # noqa: E402

COMPARED = ("train_batches_sha256", "final_eval_loss", "eval_curve", "train_curve", "steps")


def rerun(rec: dict, work: str, blimp: bool) -> dict:
    """The record of ``rec``'s spec trained again under ``work`` (data cached there)."""
    d = rec["data"]
    data = C.prepare_data(d["paths"], vocab_size=d["vocab_size"], block_size=d["block_size"],
                          val_fraction=d["val_fraction"], max_bytes=d["max_bytes"],
                          cache_dir=os.path.join(work, "cache"))
    eval_sets = {n: C.prepare_eval_file(i["path"], data)[0] for n, i in rec.get("eval_file_info", {}).items()}
    spec = LM.TrainSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in rec["spec"].items()})
    if spec.key() != rec["key"]:
        raise SystemExit(f"rerun_record.py: error: the record's spec does not give its key {rec['key']}")
    blimp_dir = (rec.get("blimp") or {}).get("blimp_dir") if blimp else None
    return LM.train_run(spec, data, LM.trainer_folder(os.path.join(work, "trainer"), spec), eval_sets, blimp_dir)


def differences(rec: dict, new: dict, blimp: bool) -> list[str]:
    keys = COMPARED + (("blimp_accuracy",) if blimp else ())
    value = lambda r, k: (r.get("blimp") or {}).get(k) if k == "blimp_accuracy" else r.get(k)  # noqa: E731
    out = [k for k in keys if value(rec, k) != value(new, k)]
    return out + [f"eval_files/{n}" for n, e in rec.get("eval_files", {}).items()
                  if new["eval_files"].get(n, {}).get("loss") != e["loss"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", nargs="+", help="committed run records (runs/<setting>/<arm>/seed<k>.json)")
    p.add_argument("--work", default=None, help="folder for the data cache and the Trainer folders (default: a "
                                                "temporary one)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the records were made)")
    p.add_argument("--blimp", action="store_true", help="also score BLiMP and compare its accuracy")
    args = p.parse_args(argv)
    recs = []
    for path in args.records:
        try:
            with open(path) as f:
                recs.append((path, json.load(f)))
        except (OSError, ValueError) as e:
            p.error(f"{path}: not a readable run record ({e})")
        if not {"spec", "key", "data", "train_batches_sha256"} <= recs[-1][1].keys():
            p.error(f"{path}: not the record of an LM run of the harness (no spec, key, data and batch digest)")
    C.set_threads(args.threads)
    C.quiet_transformers()
    work = args.work or tempfile.mkdtemp(prefix="rerun_record_")
    failed = 0
    for path, rec in recs:
        C.set_device("cuda" if rec.get("device", "cpu").startswith("cuda") else "cpu")
        diff = differences(rec, rerun(rec, work, args.blimp), args.blimp)
        failed += bool(diff)
        print(f"{path}: " + (f"differs in {', '.join(diff)}" if diff else
                             f"identical (batches {rec['train_batches_sha256'][:12]}, final eval loss "
                             f"{rec['final_eval_loss']!r})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
