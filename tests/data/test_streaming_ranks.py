"""``--streaming`` under several processes (DDP, FSDP, ZeRO): each rank reads, tokenizes and packs its own
share of the training stream (``hf_condinit.data.streaming.split_by_rank``) and the ``CondInitTrainer`` loads that
share as it is, resumed runs included. Two CPU ranks over gloo (torchrun, ``tests/streaming_ranks_worker.py``)
against the one-process stream of the same file."""

import json
import os
import random
import socket
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from hf_condinit.data import load_raw_datasets, pack_datasets, tokenize_datasets, train_bpe_tokenizer  # noqa: E402
from hf_condinit.data.streaming import split_by_rank  # noqa: E402
from hf_condinit.data.tokenizer import batch_iterator  # noqa: E402

from utils import REPO  # noqa: E402

WORDS = "the cat sat on a mat and then ran far away to see one big red dog".split()
GROUP_ROWS, BATCH = 40, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_streams_its_own_share(tmp_path):
    """The two ranks' blocks are disjoint and together exactly the one-process stream's blocks (each rank's in the
    stream's order, whole packing groups alternating between the ranks); each rank's training loader yields its own
    blocks in order (neither rank 0's stream dispatched nor the share sharded again), and resumed after two batches
    it lands on the third."""
    rng = random.Random(3)
    rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) for _ in range(7 * GROUP_ROWS + 13)]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(rows) + "\n")
    tokenizer = train_bpe_tokenizer(batch_iterator(rows), vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "bpe")

    launcher_env = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher_env}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           str(REPO / "tests" / "streaming_ranks_worker.py"), str(text), str(tmp_path / "bpe"), str(tmp_path),
           str(GROUP_ROWS), str(BATCH)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    raw, column = load_raw_datasets(train_file=str(text), validation_split_percentage=0, streaming=True,
                                    cache_dir=str(tmp_path / "cache"))
    assert split_by_rank(raw, 0, 1, GROUP_ROWS) is raw  # one process: the stream as it is
    packed = pack_datasets(tokenize_datasets(raw, tokenizer, column, append_eos=True), 16, map_batch_size=GROUP_ROWS)
    single = [block["input_ids"] for block in packed["train"]]
    assert len(single) > 8 * BATCH and len({tuple(b) for b in single}) == len(single)  # blocks tell apart

    shares = [rank["blocks"] for rank in ranks]
    assert all(rank["world_size"] == 2 for rank in ranks) and all(len(share) >= 4 * BATCH for share in shares)
    assert not {tuple(b) for b in shares[0]} & {tuple(b) for b in shares[1]}
    assert sorted(shares[0] + shares[1]) == sorted(single)
    for share in shares:  # each share in the stream's order
        positions = [single.index(block) for block in share]
        assert positions == sorted(positions)
    assert shares[0][0] == single[0]  # group 0 opens rank 0's share
    for rank, share in zip(ranks, shares):
        assert rank["batches"] == [share[i * BATCH:(i + 1) * BATCH] for i in range(3)]
        assert rank["resumed"] == rank["batches"][2]
