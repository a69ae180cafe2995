#!/usr/bin/env python
"""How the text data path scales (issue 37): load + tokenize + pack time and peak memory of ``run_clm.py``'s data
path (``hf_condinit.data``) on the shared corpora, cached (``datasets`` map, one worker) and streamed
(``--streaming``: every training block read once), against the ``tokenizers`` batch-encode throughput on the same
rows (the limit: no ``datasets``, no packing).

    python benchmarks/data_scaling.py --out benchmarks/results/data_scaling

Each corpus is the concatenation of its shared files (written to a temporary folder, never to the repository);
one byte-level BPE (vocab 8192, trained on the TinyStories sample) tokenizes all of them, with EOS after every row
and blocks of 1024 tokens, as ``run_clm.py --train_file F --append_eos --block_size 1024 --tokenizer_name BPE``
prepares them. Every measurement runs in a fresh process (``--one``), so its peak resident memory (``VmHWM``) is
its own. Writes ``record.json`` and ``record.md`` (the command, the machine, one row per corpus and path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(REPO), "shared", "data")
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

CORPORA = {
    "tinystories-2MiB": ["tinystories/TinyStories-train.sample-2MiB.txt"],
    "gutenberg": ["gutenberg-nltk"],
    "wikitext2-train": [f"wikitext/wikitext-2-raw/wiki.train.part{i}of3.raw" for i in (1, 2, 3)],
    "enwiki-2920-articles": [f"enwiki-2015-extract/enwiki2015-part{i:02d}.txt" for i in range(14)],
}
MODES = ("tokenizers-limit", "cached", "streaming")
BLOCK = 1024


def corpus_file(name: str, folder: str) -> str:
    """The corpus ``name`` as one text file in ``folder`` (its shared files concatenated, sorted)."""
    path = os.path.join(folder, name + ".txt")
    if not os.path.exists(path):
        with open(path, "wb") as out:
            for part in CORPORA[name]:
                full = os.path.join(SHARED, part)
                files = sorted(os.path.join(full, f) for f in os.listdir(full)) if os.path.isdir(full) else [full]
                for f in files:
                    with open(f, "rb") as handle:
                        out.write(handle.read())
    return path


def measure(mode: str, path: str, tokenizer_dir: str, cache_dir: str) -> dict:
    """One measurement in this process: seconds, tokens, blocks and peak RSS of ``mode`` on ``path``."""
    from _procmem import reset_peak_rss, status_kib
    from transformers import AutoTokenizer

    from hf_condinit.data import load_raw_datasets, pack_datasets, tokenize_datasets

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    reset_peak_rss()
    before = status_kib("VmRSS")
    start = time.perf_counter()
    tokens = blocks = 0
    if mode == "tokenizers-limit":
        with open(path, encoding="utf-8") as f:
            rows = [line for line in f.read().splitlines(keepends=True) if line.strip()]
        for i in range(0, len(rows), 1000):
            tokens += sum(len(e.ids) + 1 for e in tokenizer.backend_tokenizer.encode_batch(rows[i : i + 1000]))
        blocks = tokens // BLOCK
    else:
        raw, column = load_raw_datasets(train_file=path, validation_split_percentage=0, cache_dir=cache_dir,
                                        streaming=mode == "streaming")
        packed = pack_datasets(tokenize_datasets(raw, tokenizer, column, append_eos=True), BLOCK)["train"]
        if mode == "streaming":
            for block in packed:
                blocks += 1
        else:
            blocks = len(packed)
        tokens = blocks * BLOCK
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 2), "tokens": tokens, "blocks": blocks,
            "tokens_per_s": round(tokens / seconds), "peak_rss_mib": round((status_kib("VmHWM") - before) / 1024, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "data_scaling"))
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    parser.add_argument("--one", nargs=4, metavar=("MODE", "FILE", "TOKENIZER", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    from hf_condinit.data import batch_iterator, train_bpe_tokenizer

    work = tempfile.mkdtemp(prefix="data_scaling-")
    tokenizer_dir = os.path.join(work, "bpe")
    with open(os.path.join(SHARED, CORPORA["tinystories-2MiB"][0]), encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    train_bpe_tokenizer(batch_iterator(lines), vocab_size=8192).save_pretrained(tokenizer_dir)
    rows = []
    for name in args.corpora:
        path = corpus_file(name, work)
        for mode in MODES:
            cache = os.path.join(work, f"cache-{name}-{mode}")  # a cold datasets cache per measurement
            out = subprocess.run([sys.executable, __file__, "--one", mode, path, tokenizer_dir, cache],
                                 check=True, capture_output=True, text=True).stdout
            row = {"corpus": name, "mib": round(os.path.getsize(path) / 2**20, 1), "path": mode,
                   **json.loads(out.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    command = "python benchmarks/data_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "load_average_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "record.json"), "w") as f:
        json.dump({"command": command, "date": time.strftime("%Y-%m-%d"), "machine": machine, "rows": rows}, f,
                  indent=1)
    lines = [f"# Data path scaling (issue 37)\n", f"`{command}` ({time.strftime('%Y-%m-%d')}, {machine['cpus']} "
             f"CPUs, {machine['platform']}); block size {BLOCK}, BPE vocab 8192, EOS after every row.\n",
             "| corpus | MiB | path | s | tokens | tokens/s | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['corpus']} | {r['mib']} | {r['path']} | {r['seconds']} | {r['tokens']:,} | {r['tokens_per_s']:,} | "
              f"{r['peak_rss_mib']} |" for r in rows]
    with open(os.path.join(args.out, "record.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
