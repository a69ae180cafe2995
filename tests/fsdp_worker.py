"""Worker of tests/scripts/test_fsdp.py: ``run_clm.py`` / ``run_mlm.py`` jobs run one after the other in one process
group, each dumping every rank's full (gathered) state dict when training begins and when it ends.

Usage:
    torchrun --nproc_per_node 2 tests/fsdp_worker.py JOBS.json   # the FSDP2 jobs (2 CPU processes, gloo)
    python tests/fsdp_worker.py JOBS.json                        # the single-process references

``JOBS.json``: a list of ``{"tag": str, "script": "run_clm.py" | "run_mlm.py", "argv": [...], "dump": prefix,
"fault": bool}``. Each job writes ``<dump>-init-rank<r>.pt`` (at ``on_train_begin`` of a fresh run: after FSDP has
wrapped, sharded and, with ``cpu_ram_efficient_loading``, broadcast the model) and ``<dump>-final-rank<r>.pt`` (at
``on_train_end``): ``{name: tensor}`` of the whole model, parameters and persistent buffers (α_ma included).

FSDP on CPU: accelerate (1.15, 1.16) applies FSDP only on accelerators;
:func:`hf_condinit.scripts.launch.enable_cpu_fsdp` lets it shard CPU processes over gloo (torch ``fully_shard``), without which ``--fsdp`` would silently train as DDP.

``"signal": [rank, step]`` sends SIGTERM to that rank alone while it runs that step; a job stopped so writes ``<dump>-preempted-rank<r>.json`` (``{"step"}``).
``"plant": "checkpoint-<n>"`` first makes a damaged checkpoint of that name in the job's ``--output_dir`` (a copy of
its newest checkpoint without ``trainer_state.json`` and manifest: a save killed half way), which the run must skip.

``"fault": true`` plants the bug the rank check must catch: ``reduce_over_replicas`` of the module of ``AffineScaledHolder`` (the
all-reduce of affine_scaled's α statistic over the data-parallel group) becomes the identity, so each rank updates
α_ma from its own half of the batch alone.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from utils import load_script  # noqa: E402

from hf_condinit.attention import AffineScaledHolder  # noqa: E402
from hf_condinit.callbacks import TrainingPreempted  # noqa: E402
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


class SignalAt(TrainerCallback):
    """Send SIGTERM to this process when it begins step ``step`` (1-based), on rank ``rank`` only."""

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step and int(os.environ.get("RANK", "0")) == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)


def plant_damaged(output_dir: str, name: str) -> None:
    """Rank 0 copies the newest checkpoint of ``output_dir`` to ``name`` without its trainer state and manifest;
    every rank waits for it."""
    import torch.distributed as dist

    if int(os.environ.get("RANK", "0")) == 0:
        newest = max(glob.glob(os.path.join(output_dir, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
        shutil.copytree(newest, os.path.join(output_dir, name),
                        ignore=shutil.ignore_patterns("trainer_state.json", "checkpoint_manifest.json"))
    if dist.is_initialized():
        dist.barrier()


def run_job(job: dict) -> None:
    module = load_script(job["script"])
    holders = sys.modules[AffineScaledHolder.__module__]  # where the holder's forward looks the reduction up
    original_train, original_reduce = module.train_and_save, holders.reduce_over_replicas

    def train_and_save(trainer, *args, **kwargs):
        trainer.add_callback(DumpState(job["dump"]))
        if job.get("signal"):
            trainer.add_callback(SignalAt(*job["signal"]))
        return original_train(trainer, *args, **kwargs)

    module.train_and_save = train_and_save
    if job.get("fault"):
        holders.reduce_over_replicas = lambda total, count, group=None: (total, count)
    if job.get("plant"):
        plant_damaged(job["argv"][job["argv"].index("--output_dir") + 1], job["plant"])
    try:
        module.main(job["argv"])
    except TrainingPreempted as stop:
        with open(f"{job['dump']}-preempted-rank{os.environ.get('RANK', '0')}.json", "w") as f:
            json.dump({"step": stop.step}, f)
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
