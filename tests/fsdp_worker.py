"""Worker of tests/test_fsdp.py: ``run_clm.py`` / ``run_mlm.py`` jobs run one after the other in one process group,
each dumping every rank's full (gathered) state dict when training begins and when it ends.

Usage:
    torchrun --nproc_per_node 2 tests/fsdp_worker.py JOBS.json   # the FSDP2 jobs (2 CPU processes, gloo)
    python tests/fsdp_worker.py JOBS.json                        # the single-process references

``JOBS.json``: a list of ``{"tag": str, "script": "run_clm.py" | "run_mlm.py", "argv": [...], "dump": prefix,
"fault": bool}``. Each job writes ``<dump>-init-rank<r>.pt`` (at ``on_train_begin`` of a fresh run: after FSDP has
wrapped, sharded and, with ``cpu_ram_efficient_loading``, broadcast the model) and ``<dump>-final-rank<r>.pt`` (at
``on_train_end``): ``{name: tensor}`` of the whole model, parameters and persistent buffers (α_ma included).

FSDP on CPU: accelerate (1.15, 1.16) applies FSDP only on accelerators;
:func:`hf_condinit.scripts.launch.enable_cpu_fsdp` lets it shard CPU processes over gloo (torch ``fully_shard``), without which ``--fsdp`` would silently train as DDP.

``"fault": true`` plants the bug the rank check must catch: ``reduce_over_replicas`` of the module of ``AffineScaledHolder`` (the
all-reduce of affine_scaled's α statistic over the data-parallel group) becomes the identity, so each rank updates
α_ma from its own half of the batch alone.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from utils import load_script  # noqa: E402

from hf_condinit.attention import AffineScaledHolder  # noqa: E402
from hf_condinit.scripts.launch import enable_cpu_fsdp  # noqa: E402


def full_state(model) -> dict[str, torch.Tensor]:
    """The whole model's state dict on this rank: sharded FSDP2 parameters (DTensors) are all-gathered (a collective:
    every rank calls it), plain tensors are copied."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    else:
        state = model.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items()}


class DumpState(TrainerCallback):
    """Save :func:`full_state` of every rank at the start (fresh runs only) and at the end of training."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.rank = int(os.environ.get("RANK", "0"))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            torch.save(full_state(model), f"{self.prefix}-init-rank{self.rank}.pt")

    def on_train_end(self, args, state, control, model=None, **kwargs):
        torch.save(full_state(model), f"{self.prefix}-final-rank{self.rank}.pt")


def run_job(job: dict) -> None:
    module = load_script(job["script"])
    holders = sys.modules[AffineScaledHolder.__module__]  # where the holder's forward looks the reduction up
    original_train, original_reduce = module.train_and_save, holders.reduce_over_replicas

    def train_and_save(trainer, *args, **kwargs):
        trainer.add_callback(DumpState(job["dump"]))
        return original_train(trainer, *args, **kwargs)

    module.train_and_save = train_and_save
    if job.get("fault"):
        holders.reduce_over_replicas = lambda total, count, group=None: (total, count)
    try:
        module.main(job["argv"])
    finally:
        module.train_and_save, holders.reduce_over_replicas = original_train, original_reduce


def main(jobs_file: str) -> None:
    enable_cpu_fsdp()
    for job in json.load(open(jobs_file)):
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"fsdp_worker: job {job['tag']}", flush=True)
        run_job(job)


if __name__ == "__main__":
    main(sys.argv[1])
