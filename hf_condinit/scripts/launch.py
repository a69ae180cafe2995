"""How the script was started: the launcher, the world size and the device, read from the environment the launchers
set (nothing is initialised here), and the one line every script prints about it at start.

Launchers are told apart by the variables only they set: ``accelerate launch`` sets ``ACCELERATE_*`` (its
multi-process launcher runs torchrun underneath, so it is checked first), DeepSpeed's ``launch.py`` sets
``LOCAL_SIZE``, torchrun ``TORCHELASTIC_RUN_ID``; ``srun`` without a launcher only ``SLURM_*``; otherwise the script
was started by ``python``. ``run_clm.py --deepspeed`` without a launcher sets ``WORLD_SIZE=1`` itself: still ``python``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping


def launcher_name(env: Mapping[str, str] | None = None) -> str:
    """``"accelerate"``, ``"deepspeed"``, ``"torchrun"``, ``"srun"``, ``"mpirun"`` or ``"python"`` (see the module
    docstring for how each is recognised)."""
    env = os.environ if env is None else env
    if "ACCELERATE_MIXED_PRECISION" in env or "ACCELERATE_USE_CPU" in env:
        return "accelerate"
    if "LOCAL_SIZE" in env and "RANK" in env:
        return "deepspeed"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return "mpirun"
    if "SLURM_PROCID" in env:
        return "srun"
    return "python"


def _parent_num_processes() -> int | None:
    """``N`` of ``--num_processes N`` on the parent process's command line (``accelerate launch``), if readable."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, arg in enumerate(argv):
        match = re.fullmatch(r"--num[_-]processes(?:=(\d+))?", arg)
        if match:
            value = match.group(1) or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else None
    return None


def single_process_warning(env: Mapping[str, str] | None = None, asked: int | None = None) -> str | None:
    """One line when a launch asked for several processes but this one runs alone, else ``None``:

    - ``accelerate launch --cpu`` (or a ``MULTI_CPU`` config without ``mpirun``) with ``--num_processes N > 1``:
      accelerate starts one plain process; it sets ``MASTER_ADDR`` for the N it was asked for, but no
      ``WORLD_SIZE``. ``asked``: N when known (default: read from the parent's command line).
    - ``srun`` with ``SLURM_NTASKS > 1`` and no launcher inside: N independent single-process runs."""
    env = os.environ if env is None else env
    launcher = launcher_name(env)
    if "WORLD_SIZE" in env:
        return None
    if launcher == "accelerate" and "MASTER_ADDR" in env:
        asked = asked if asked is not None else _parent_num_processes()
        many = f"{asked} processes" if asked else "several processes"
        return (f"accelerate launch was asked for {many} but started this one alone (world size 1): with --cpu or a "
                f"MULTI_CPU config it runs a single process. For N processes on CPU use `accelerate launch --multi_gpu "
                f"--num_processes N <script> ... --use_cpu` or `torchrun --nproc_per_node N <script> ... --use_cpu`.")
    if launcher == "srun" and int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return (f"srun started {env['SLURM_NTASKS']} tasks but no launcher joined them (world size 1 each): run one "
                f"task per node and start torchrun or accelerate in it (docs/pretraining.md, SLURM).")
    return None


def launch_summary(training_args, env: Mapping[str, str] | None = None) -> str:
    """``"launched by torchrun: world size 2, device cpu, DeepSpeed ZeRO-2"``: the launcher, the number of processes
    (``WORLD_SIZE``, 1 without one), this process's device type as the Trainer will choose it (CPU with
    ``--use_cpu`` or without an accelerator) and the DeepSpeed ZeRO stage when ``--deepspeed`` is given."""
    from .machine import accelerator_name

    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1") or 1)
    device = "cpu" if getattr(training_args, "use_cpu", False) else (accelerator_name() or "cpu")
    parts = [f"world size {world_size}", f"device {device}"]
    if getattr(training_args, "deepspeed", None):
        config = getattr(training_args, "hf_deepspeed_config", None)
        stage = config.get_value("zero_optimization.stage", 0) if config is not None else "?"
        parts.append(f"DeepSpeed ZeRO-{stage}")
    return f"launched by {launcher_name(env)}: " + ", ".join(parts)


def report_launch(training_args, prog: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """Print, once per run (global rank 0), the :func:`launch_summary` line on stdout (with the logs) and, when a
    multi-process launch ended up with one process, :func:`single_process_warning`'s line on stderr, each as
    ``<prog>: ...``. stderr otherwise stays for errors: a user error is still the only line there."""
    env = os.environ if env is None else env
    if env.get("RANK", "0") != "0":
        return
    prog = prog or os.path.basename(sys.argv[0])
    print(f"{prog}: {launch_summary(training_args, env)}", flush=True)
    warning = single_process_warning(env)
    if warning:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
