"""Build a model under DeepSpeed ZeRO-3 in one process (gloo on CPU) and save its gathered weights.

Usage: python tests/zero3_build.py MODEL_TYPE CONDINIT_JSON OUT_FILE   (run by tests/test_zero3.py)
"""

import json
import os
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(key, value)
if "MASTER_PORT" not in os.environ:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled  # noqa: E402

import hf_condinit  # noqa: E402,F401

sys.path.insert(0, os.path.dirname(__file__))
from utils import mini_config  # noqa: E402


def main(model_type: str, condinit: str, out_file: str) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    ds_config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1, "train_batch_size": 1}
    keep_alive = HfDeepSpeedConfig(ds_config)  # noqa: F841  (zero3 is enabled while this object lives)
    assert is_deepspeed_zero3_enabled()
    torch.manual_seed(0)
    model = AutoModel.from_config(mini_config(model_type), condinit=json.loads(condinit))
    params = dict(model.named_parameters())
    assert all(hasattr(p, "ds_id") for p in params.values()), "parameters were not partitioned by zero.Init"
    with deepspeed.zero.GatheredParameters(list(params.values())):
        weights = {name: p.detach().clone() for name, p in params.items()}
    torch.save(weights, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
