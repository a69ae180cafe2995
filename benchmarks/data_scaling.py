#!/usr/bin/env python
"""How the text data path scales: load + tokenize + pack time and peak memory of ``run_clm.py``'s data
path (``hf_condinit.data``), cached (``datasets`` map, ``--preprocessing_num_workers`` 1, 2, ...) and streamed
(``--streaming``: every training block read once), against the ``tokenizers`` batch-encode throughput on the same
rows (the limit: no ``datasets``, no packing).

    # the committed record: the shared corpora as they are (2 to 47 MiB), one worker
    python benchmarks/data_scaling.py --out benchmarks/results/data_scaling

    # the issue's scale: one corpus repeated to ~200M tokens, cached at 1 and 2 workers, streamed, the limit
    python benchmarks/data_scaling.py --corpora enwiki-2920-articles --scale_tokens 200000000 --workers 1 2 \\
        --work /scratch/data_scaling --out benchmarks/results/data_scaling/200m

Each corpus is the concatenation of its shared files, repeated whole (``--scale_tokens N``: until it holds about N
tokens, estimated from its first MiB) and written to ``--work`` (a temporary folder by default, deleted at the end;
never the repository). At 200M tokens that is ~0.8 GB of text, and the cached path writes ~4 GB of ``datasets``
cache beside it. One byte-level BPE (vocab 8192, trained on the TinyStories sample) tokenizes every corpus, with EOS
after every row and blocks of 1024 tokens, as ``run_clm.py --train_file F --append_eos --block_size 1024
--tokenizer_name BPE`` prepares them. Every measurement runs in a fresh process (``--one``) with ``--threads``
threads for ``tokenizers`` (``RAYON_NUM_THREADS``; default 1, so that tokens/s is per core and per worker), so its
peak resident memory (``VmHWM``) is its own; a cached run with workers also records the largest worker's peak.
Writes ``record.json`` and ``record.md`` (the command, the machine, one row per corpus, path and worker count).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
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
LIMIT_ROWS = 1000  # rows per encode_batch call of the limit (the packing group of the other paths)


def shared_files(name: str) -> list[str]:
    """The shared files of corpus ``name``, in order (a folder's files sorted)."""
    files = []
    for part in CORPORA[name]:
        full = os.path.join(SHARED, part)
        files += sorted(os.path.join(full, f) for f in os.listdir(full)) if os.path.isdir(full) else [full]
    return files


def bytes_per_token(name: str, tokenizer_dir: str) -> float:
    """Bytes of text per token (EOS after every non-blank row included) on the first MiB of corpus ``name``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(shared_files(name)[0], encoding="utf-8", errors="ignore") as f:
        rows = [row for row in f.read(1 << 20).splitlines(keepends=True) if row.strip()]
    tokens = sum(len(e.ids) + 1 for e in tokenizer.backend_tokenizer.encode_batch(rows))
    return sum(len(row.encode()) for row in rows) / tokens


def corpus_file(name: str, folder: str, repeats: int = 1) -> str:
    """The corpus ``name`` as one text file in ``folder``: its shared files concatenated, ``repeats`` times."""
    path = os.path.join(folder, f"{name}-x{repeats}.txt")
    if not os.path.exists(path):
        with open(path, "wb") as out:
            for _ in range(repeats):
                for file in shared_files(name):
                    with open(file, "rb") as handle:
                        shutil.copyfileobj(handle, out)
    return path


def limit_rows(path: str):
    """The non-blank rows of ``path`` (line breaks kept), ``LIMIT_ROWS`` at a time, read as they are encoded."""
    batch = []
    with open(path, encoding="utf-8") as f:
        for row in f:
            if row.strip():
                batch.append(row)
                if len(batch) == LIMIT_ROWS:
                    yield batch
                    batch = []
    if batch:
        yield batch


def measure(mode: str, path: str, tokenizer_dir: str, cache_dir: str, workers: int) -> dict:
    """One measurement in this process: seconds, tokens, blocks and peak RSS of ``mode`` on ``path`` (``workers``:
    the cached path's ``--preprocessing_num_workers``)."""
    from _procmem import reset_peak_rss, status_kib
    from transformers import AutoTokenizer

    from hf_condinit.data import load_raw_datasets, pack_datasets, tokenize_datasets

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    reset_peak_rss()
    before = status_kib("VmRSS")
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # helpers of the imports, if any
    start = time.perf_counter()
    tokens = blocks = 0
    if mode == "tokenizers-limit":
        for rows in limit_rows(path):
            tokens += sum(len(e.ids) + 1 for e in tokenizer.backend_tokenizer.encode_batch(rows))
        blocks = tokens // BLOCK
    else:
        streaming = mode == "streaming"
        num_proc = workers if workers > 1 and not streaming else None
        raw, column = load_raw_datasets(train_file=path, validation_split_percentage=0, cache_dir=cache_dir,
                                        streaming=streaming)
        tokenized = tokenize_datasets(raw, tokenizer, column, append_eos=True, num_proc=num_proc)
        packed = pack_datasets(tokenized, BLOCK, num_proc=num_proc)["train"]
        blocks = sum(1 for _ in packed) if streaming else len(packed)
        tokens = blocks * BLOCK
    seconds = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux: the largest child's peak
    children = children if children > children_before else 0  # no worker process (or none above the helpers)
    return {"seconds": round(seconds, 2), "tokens": tokens, "blocks": blocks,
            "tokens_per_s": round(tokens / seconds), "peak_rss_mib": round((status_kib("VmHWM") - before) / 1024, 1),
            "worker_peak_rss_mib": round(children / 1024, 1) if children else None}


def runs(modes, workers) -> list[tuple[str, int]]:
    """``(path, workers)`` of every measurement: the cached path once per worker count, the others once."""
    return [(mode, n) for mode in modes for n in (workers if mode == "cached" else [1])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "data_scaling"))
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--scale_tokens", type=float, default=0,
                        help="repeat each corpus whole until it holds about this many tokens (0: as it is)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="--preprocessing_num_workers of the cached path, one measurement each")
    parser.add_argument("--threads", type=int, default=1, help="tokenizers' threads (RAYON_NUM_THREADS) per process")
    parser.add_argument("--work", default=None, help="folder for the corpora and caches (default: a temporary one, "
                                                     "deleted at the end; a given one is kept)")
    parser.add_argument("--one", nargs=5, metavar=("MODE", "FILE", "TOKENIZER", "CACHE", "WORKERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.one:
        print(json.dumps(measure(*args.one[:4], int(args.one[4]))))
        return
    if min(args.workers) < 1 or args.threads < 1:
        parser.error("--workers and --threads must be >= 1")
    from hf_condinit.data import batch_iterator, train_bpe_tokenizer

    work = args.work or tempfile.mkdtemp(prefix="data_scaling-")
    os.makedirs(work, exist_ok=True)
    tokenizer_dir = os.path.join(work, "bpe")
    with open(os.path.join(SHARED, CORPORA["tinystories-2MiB"][0]), encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    train_bpe_tokenizer(batch_iterator(lines), vocab_size=8192).save_pretrained(tokenizer_dir)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="true")
    rows = []
    try:
        for name in args.corpora:
            repeats = 1
            if args.scale_tokens:
                size = sum(os.path.getsize(f) for f in shared_files(name))
                repeats = max(1, math.ceil(args.scale_tokens * bytes_per_token(name, tokenizer_dir) / size))
            path = corpus_file(name, work, repeats)
            for mode, workers in runs(args.modes, args.workers):
                cache = os.path.join(work, f"cache-{name}-{mode}-{workers}")  # a cold datasets cache per measurement
                one = [sys.executable, __file__, "--one", mode, path, tokenizer_dir, cache, str(workers)]
                out = subprocess.run(one, check=True, capture_output=True, text=True, env=env).stdout
                shutil.rmtree(cache, ignore_errors=True)
                row = {"corpus": name, "repeats": repeats, "mib": round(os.path.getsize(path) / 2**20, 1),
                       "path": mode, "workers": workers, **json.loads(out.strip().splitlines()[-1])}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    write_record(args.out, argv, args.threads, rows)


def write_record(out: str, argv, threads: int, rows: list[dict]) -> None:
    """``record.json`` and ``record.md`` in ``out``."""
    command = "python benchmarks/data_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "load_average_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump({"command": command, "date": time.strftime("%Y-%m-%d"), "machine": machine,
                   "tokenizers_threads": threads, "rows": rows}, f, indent=1)
    lines = ["# Data path scaling\n",
             f"`{command}` ({time.strftime('%Y-%m-%d')}, {machine['cpus']} CPUs, {machine['platform']}, "
             f"load {machine['load_average_start']}); block size {BLOCK}, BPE vocab 8192, EOS after every row, "
             f"{threads} tokenizers thread(s) per process.\n",
             "| corpus | repeats | MiB | path | workers | s | tokens | tokens/s | peak RSS MiB | largest worker MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['corpus']} | {r['repeats']} | {r['mib']} | {r['path']} | {r['workers']} | {r['seconds']} | "
              f"{r['tokens']:,} | {r['tokens_per_s']:,} | {r['peak_rss_mib']} | {r['worker_peak_rss_mib'] or '-'} |"
              for r in rows]
    with open(os.path.join(out, "record.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
