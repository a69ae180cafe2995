"""affine_scaled's α_ma is one model on every rank: its batch statistic is all-reduced (sums and
counts) over the data-parallel group, so after N steps every parameter and buffer is identical across ranks and equal
to a single-process run over the same global batches.

Two CPU processes over gloo: torchrun + DDP, and the deepspeed launcher running ZeRO-1, 2 and 3 one after the other
(`tests/affine_sync_worker.py`). The sequences are right-padded to different lengths, so the two ranks see different
numbers of real tokens (a mean of means would be wrong). ~20 s (torchrun) and ~35 s (deepspeed) on 2 shared cores.
"""

import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from utils import REPO

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import affine_sync_worker as worker  # noqa: E402

pytestmark = pytest.mark.slow
WORKER = os.path.join(REPO, "tests", "affine_sync_worker.py")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _launch(cmd, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env = dict(env, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


@pytest.fixture(scope="module")
def single():
    """The single-process run over the whole global batches, and the α_ma a rank would hold from its half alone."""
    return worker.run_single(), [worker.run_single(rank, 2) for rank in (0, 1)]


def _check(tmp_path, tag, single):
    reference, halves = single
    ranks = [torch.load(tmp_path / f"{tag}-rank{r}.pt") for r in (0, 1)]
    for key in reference:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"{tag}: {key} differs across ranks"
        torch.testing.assert_close(ranks[0][key], reference[key], rtol=0, atol=1e-6, msg=f"{tag}: {key}")
    alpha_ma = [k for k in reference if k.endswith("alpha_ma")]
    assert alpha_ma
    # the test can fail: a rank's own half of the batches gives another α_ma
    for half in halves:
        assert max((half[k] - reference[k]).abs().max().item() for k in alpha_ma) > 1e-3


def test_ddp_torchrun_two_processes(tmp_path, single):
    _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", _free_port(),
             WORKER, "--mode", "ddp"], tmp_path)
    _check(tmp_path, "ddp", single)
    # the same run with α_ma's statistic reduced over each rank alone (process_group = a 1-rank group): the ranks
    # end with different α_ma (DDP broadcasts rank 0's buffers before each forward, not after the last update)
    local = [torch.load(tmp_path / f"ddp-local-rank{r}.pt") for r in (0, 1)]
    keys = [k for k in local[0] if k.endswith("alpha_ma")]
    assert max((local[0][k] - local[1][k]).abs().max().item() for k in keys) > 1e-4


def test_deepspeed_launcher_zero_1_2_3_two_processes(tmp_path, single):
    exe = shutil.which("deepspeed")
    if exe is None:
        pytest.skip("deepspeed launcher not on PATH")
    _launch([exe, "--num_gpus", "2", "--master_port", _free_port(), WORKER, "--mode", "deepspeed"], tmp_path)
    for stage in (1, 2, 3):
        _check(tmp_path, f"zero{stage}", single)


def test_reduce_is_a_no_op_without_distributed():
    from hf_condinit.attention.affine_scaled import reduce_over_replicas

    total, count = torch.tensor([1.0, 2.0]), torch.tensor(3.0)
    out_total, out_count = reduce_over_replicas(total, count)
    assert out_total is total and out_count is count
