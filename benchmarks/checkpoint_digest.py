"""What the checkpoint content digests add to a save: the time spent taking them, against the whole save.

A ``CondInitTrainer`` holds the model (``configs/gpt2-472m.json`` by default: 471.9M non-embedding parameters, GPT-2's
50257-token vocabulary) and AdamW state for every parameter (one optimizer step on zero gradients), and saves a full
checkpoint ``--saves`` times (``CondInitTrainer._save_checkpoint``: weights, optimizer, scheduler, RNG and trainer
state, staged, fsynced, manifest last, renamed into place). Every call of
:func:`hf_condinit.checkpoints.file_digest` during a save is timed; the record gives, per save, the save's
wall time, the digests' share of it and the bytes hashed, and the ratio "digests / save": an upper bound of the time
the digests add to the save (they run while the files' fsyncs wait on the disk, so the save without them is shorter by
at most that time). The estimate of the time they do add: the manifest step's wall time
(:func:`~hf_condinit.checkpoints.write_manifest`: fsyncs, digests, manifest) less the time its fsyncs took,
which is that step without digests. Also timed: the resume's verification
(``check_checkpoint(verify_content=True)``) against the header-only check.

    python benchmarks/checkpoint_digest.py    # writes benchmarks/results/checkpoint_digest/record.{json,md}
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "checkpoint_digest"


def build_trainer(config: str, vocab: int, out: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments

    from hf_condinit.scripts_common import CondInitTrainer

    cfg = AutoConfig.from_pretrained(ROOT / "configs" / f"{config}.json", vocab_size=vocab)
    model = AutoModelForCausalLM.from_config(cfg)
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", save_strategy="steps",
                             max_steps=10, disable_tqdm=True)
    trainer = CondInitTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()  # AdamW state (two moments) for every parameter, as after a training step
    model.zero_grad(set_to_none=True)
    return trainer, sum(p.numel() for p in model.parameters())


def run(args) -> dict:
    from hf_condinit import checkpoints

    prov = provenance()
    work = Path(tempfile.mkdtemp(prefix="digest-", dir=args.work))
    trainer, n_params = build_trainer(args.config, args.vocab, work)
    spent, synced, manifest = [], [], []
    originals = {name: getattr(checkpoints, name) for name in ("file_digest", "fsync_path", "write_manifest")}

    inside = []  # non-empty while write_manifest runs: only its fsyncs are counted

    def timed(name, into):
        def call(*a, **k):
            begun = time.perf_counter()
            if name == "write_manifest":
                inside.append(True)
            try:
                return originals[name](*a, **k)
            finally:
                if name == "write_manifest":
                    inside.clear()
                if inside or name != "fsync_path":
                    into.append(time.perf_counter() - begun)
        return call

    checkpoints.file_digest = timed("file_digest", spent)
    checkpoints.fsync_path = timed("fsync_path", synced)
    checkpoints.write_manifest = timed("write_manifest", manifest)
    saves = []
    try:
        for i in range(1, args.saves + 1):
            trainer.state.global_step = i
            spent.clear(), synced.clear(), manifest.clear()
            begun = time.perf_counter()
            trainer._save_checkpoint(trainer.model, None)
            seconds = time.perf_counter() - begun
            folder = work / f"checkpoint-{i}"
            size = checkpoints.checkpoint_size(str(folder))
            digest_seconds = sum(spent)
            added = max(sum(manifest) - sum(synced), 0.0)
            saves.append({"save_seconds": round(seconds, 3), "digest_seconds": round(digest_seconds, 3),
                          "manifest_step_seconds": round(sum(manifest), 3), "fsync_seconds": round(sum(synced), 3),
                          "added_seconds": round(added, 3), "added_share_of_save": round(added / seconds, 4),
                          "digest_share_of_save": round(digest_seconds / seconds, 4), "bytes": size,
                          "digest_gb_per_s": round(size / digest_seconds / 1e9, 2)})
            print(f"save {i}: {seconds:.2f} s, digests {digest_seconds:.2f} s ({100 * digest_seconds / seconds:.2f} %), "
                  f"added {added:.2f} s ({100 * added / seconds:.2f} %), "
                  f"{size / 2**30:.2f} GiB", flush=True)
            begun = time.perf_counter()
            assert checkpoints.check_checkpoint(str(folder)) is None
            header_seconds = time.perf_counter() - begun
            begun = time.perf_counter()
            assert checkpoints.check_checkpoint(str(folder), verify_content=True) is None
            saves[-1].update({"check_headers_seconds": round(header_seconds, 3),
                              "check_verified_seconds": round(time.perf_counter() - begun, 3)})
            shutil.rmtree(folder)
    finally:
        for name, function in originals.items():
            setattr(checkpoints, name, function)
        shutil.rmtree(work, ignore_errors=True)
    total_save = sum(s["save_seconds"] for s in saves)
    total_digest = sum(s["digest_seconds"] for s in saves)
    total_added = sum(s["added_seconds"] for s in saves)
    cmd = f"python benchmarks/checkpoint_digest.py --config {args.config} --vocab {args.vocab} --saves {args.saves}"
    return {**prov, "command": cmd, "machine": machine_info(), "config": args.config, "parameters": n_params,
            "saves": saves, "digest_share_of_save": round(total_digest / total_save, 4),
            "added_share_of_save": round(total_added / total_save, 4)}


def markdown(record: dict) -> str:
    s = record["saves"]
    lines = [f"# Checkpoint digests: {100 * record['added_share_of_save']:.2f} % added to the save time, at most "
             f"{100 * record['digest_share_of_save']:.2f} % ({record['config']}, {record['parameters'] / 1e6:.0f}M "
             f"parameters with AdamW state)", "",
             f"`{record['command']}` (commit {(record.get('commit') or '?')[:7]}, torch {record['versions']['torch']}, "
             f"CPU, load average {record['machine'].get('loadavg_1m', 0):.1f} on {record['machine'].get('cpu_count')} "
             f"cores).", "",
             "| save | checkpoint GiB | save s | digests s | digests / save (upper bound) | manifest step s | its fsyncs s "
             "| added s | added / save | digest GB/s | resume check: headers s | content verified s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(s, 1):
        lines.append(f"| {i} | {r['bytes'] / 2**30:.2f} | {r['save_seconds']:.2f} | {r['digest_seconds']:.2f} | "
                     f"{100 * r['digest_share_of_save']:.2f} % | {r['manifest_step_seconds']:.2f} | {r['fsync_seconds']:.2f} | "
                     f"{r['added_seconds']:.2f} | {100 * r['added_share_of_save']:.2f} % | {r['digest_gb_per_s']} | "
                     f"{r['check_headers_seconds']:.3f} "
                     f"| {r['check_verified_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="gpt2-472m", help="a configs/<name>.json")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--work", default=None, help="where the checkpoints go (a temporary folder by default)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    record = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record, indent=1))
    (out / "record.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
