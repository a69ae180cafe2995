"""Under DeepSpeed ZeRO-3 (one CPU process over gloo) the scheme writes the same weights as without ZeRO.

Only the tensors the scheme writes are compared: HF's own default init under ZeRO-3 (`initialize_weights_zero3`,
per module on rank 0) consumes the global RNG in a different order than the plain build, so embeddings and MLPs
differ between the two builds with or without hf_condinit; the scheme's per-layer generators do not depend on it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from hf_condinit.layouts import get_layout
from utils import mini_config


def scheme_written(model, method):
    """Names of the parameters the scheme writes: conditioned: q/k/v weights and biases; mimetic: q/k/v/o weights."""
    layout = get_layout(model)
    by_id = {id(p): n for n, p in model.named_parameters()}
    roles = ("q", "k", "v", "o") if method == "mimetic" else ("q", "k", "v")
    names = set()
    for _, block in layout.attention_modules(model):
        for role, proj in layout.projections(block).items():
            if role in roles:
                tensors = (proj.weight, proj.bias) if method == "conditioned" else (proj.weight,)
                names |= {by_id[id(t)] for t in tensors if t is not None}
    return names

HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize("model_type, method", [("gpt2", "conditioned"), ("bert", "mimetic"), ("llama", "conditioned")])
def test_zero3_matches_plain_build(tmp_path, model_type, method):
    condinit = {"method": method, "seed": 3}
    out = tmp_path / "weights.pt"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, str(HERE / "zero3_build.py"), model_type, json.dumps(condinit), str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero3 = torch.load(out)
    torch.manual_seed(0)
    plain = AutoModel.from_config(mini_config(model_type), condinit=condinit)
    assert set(zero3) == {n for n, _ in plain.named_parameters()}
    written = scheme_written(plain, method)
    assert written
    for name, p in plain.named_parameters():
        assert zero3[name].shape == p.shape, name
        if name in written:
            assert torch.equal(zero3[name], p.detach()), name
