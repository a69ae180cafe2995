"""Load saved models in plain transformers (``import hf_condinit`` raises here) and save their state dicts.

Usage: python tests/fsdp_plain_load.py OUT_FILE MODEL_DIR...   (run by tests/scripts/test_fsdp.py)

Each ``MODEL_DIR`` is loaded with ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``: a variant
checkpoint runs the ``condinit_modeling.py`` written beside its weights. ``OUT_FILE`` gets ``{dir: state_dict}``.
"""

import importlib.abc
import sys


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "hf_condinit":
            raise ImportError("hf_condinit is blocked in this process")


sys.meta_path.insert(0, _Blocker())

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

if __name__ == "__main__":
    out, *dirs = sys.argv[1:]
    states = {}
    for d in dirs:
        model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
        states[d] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(states, out)
