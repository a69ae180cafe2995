"""How the script was started: the launcher, the world size and the device, read from the environment the launchers
set (nothing is initialised here), and the one line every script prints about it at start.

Launchers are told apart by the variables only they set: ``accelerate launch`` sets ``ACCELERATE_*`` (its
multi-process launcher runs torchrun underneath, so it is checked first), DeepSpeed's ``launch.py`` sets
``LOCAL_SIZE``, torchrun ``TORCHELASTIC_RUN_ID``; ``srun`` without a launcher only ``SLURM_*``; otherwise the script
was started by ``python``. ``run_clm.py --deepspeed`` without a launcher sets ``WORLD_SIZE=1`` itself: still ``python``.

The line names the sharding engine: the DeepSpeed ZeRO stage (``--deepspeed``), or FSDP with its version, sharding
and offload (``--fsdp`` / ``--fsdp_config`` of the Trainer, or ``accelerate launch`` with an FSDP config).
accelerate (1.15, 1.16) applies FSDP only on accelerators: on CPU (``--use_cpu``) the Trainer silently trains with
DDP instead, which the line says, unless :func:`enable_cpu_fsdp` was called (FSDP2 over gloo: the CPU tests and
benchmarks).
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


def enable_cpu_fsdp() -> None:
    """Let accelerate apply FSDP to CPU processes (gloo), as it does on accelerators; idempotent.

    accelerate's ``AcceleratorState`` (1.15, 1.16) turns a ``fsdp_plugin`` into ``DistributedType.FSDP`` only for
    accelerator types (``MULTI_GPU``, ``MULTI_XPU``, ...); with ``MULTI_CPU`` it drops the plugin and the Trainer
    wraps the model in DDP. After this call a CPU group with a plugin becomes ``FSDP`` as well (torch's ``fully_shard`` supports CPU
    meshes over gloo). Call it before the ``Trainer`` (its ``Accelerator``) is built."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if cpu_fsdp_enabled():
        return
    original = AcceleratorState.__init__

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # every later AcceleratorState() copies PartialState's shared state over its own: set both
            PartialState._shared_state["distributed_type"] = self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)

    __init__.cpu_fsdp = True
    AcceleratorState.__init__ = __init__


def cpu_fsdp_enabled() -> bool:
    """Whether :func:`enable_cpu_fsdp` was called in this process."""
    from accelerate.state import AcceleratorState

    return getattr(AcceleratorState.__init__, "cpu_fsdp", False)


def fsdp_settings(training_args, env: Mapping[str, str] | None = None) -> dict | None:
    """The FSDP plugin's settings the run will use: the Trainer's ``--fsdp`` / ``--fsdp_config``
    (``training_args.fsdp_plugin_args``), or else the ``FSDP_*`` variables of ``accelerate launch`` with an FSDP
    config (``fsdp_version``, ``cpu_offload``, ``reshard_after_forward``); ``None`` without FSDP."""
    env = os.environ if env is None else env
    plugin = getattr(training_args, "fsdp_plugin_args", None)
    if plugin is None and str(env.get("ACCELERATE_USE_FSDP", "")).lower() in ("true", "1"):
        version = env.get("FSDP_VERSION", "1")
        plugin = {"fsdp_version": version, "cpu_offload": env.get("FSDP_OFFLOAD_PARAMS", "false"),
                  "reshard_after_forward": env.get("FSDP_RESHARD_AFTER_FORWARD" if version == "2"
                                                   else "FSDP_SHARDING_STRATEGY")}
    return plugin


def fsdp_version(training_args, env: Mapping[str, str] | None = None) -> int | None:
    """1 or 2 (:func:`fsdp_settings`' ``fsdp_version``, 1 when unset, as accelerate defaults); ``None`` without
    FSDP."""
    plugin = fsdp_settings(training_args, env)
    return None if plugin is None else int(plugin.get("fsdp_version", 1) or 1)


def fsdp_summary(training_args, env: Mapping[str, str] | None = None) -> str | None:
    """``"FSDP2 full_shard"`` (``shard_grad_op`` when parameters stay gathered after the forward, ``+ cpu offload``),
    ``"FSDP1 <strategy>"``, from :func:`fsdp_settings`; ``None`` without FSDP."""
    plugin = fsdp_settings(training_args, env)
    if plugin is None:
        return None
    version = fsdp_version(training_args, env)
    reshard = plugin.get("reshard_after_forward")
    if version == 2:
        full = reshard is None or str(reshard).lower() in ("true", "1", "full_shard")
        strategy = "full_shard" if full else "shard_grad_op"
    else:
        strategy = str(reshard or "full_shard").lower()
    offload = str(plugin.get("cpu_offload", False)).lower() in ("true", "1")
    return f"FSDP{version} {strategy}" + (" + cpu offload" if offload else "")


def launch_summary(training_args, env: Mapping[str, str] | None = None) -> str:
    """``"launched by torchrun: world size 2, device cpu, DeepSpeed ZeRO-2"``: the launcher, the number of processes
    (``WORLD_SIZE``, 1 without one), this process's device type as the Trainer will choose it (CPU with
    ``--use_cpu`` or without an accelerator) and the sharding engine: the DeepSpeed ZeRO stage when ``--deepspeed``
    is given, FSDP's version and strategy (:func:`fsdp_summary`) when FSDP is, with ``(runs as DDP on cpu)`` where
    accelerate will not apply it (CPU, and :func:`enable_cpu_fsdp` not called)."""
    from .machine import accelerator_name

    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1") or 1)
    device = "cpu" if getattr(training_args, "use_cpu", False) else (accelerator_name() or "cpu")
    parts = [f"world size {world_size}", f"device {device}"]
    if getattr(training_args, "deepspeed", None):
        config = getattr(training_args, "hf_deepspeed_config", None)
        stage = config.get_value("zero_optimization.stage", 0) if config is not None else "?"
        parts.append(f"DeepSpeed ZeRO-{stage}")
    fsdp = fsdp_summary(training_args, env)
    if fsdp is not None:
        parts.append(fsdp if device != "cpu" or cpu_fsdp_enabled() else f"{fsdp} (runs as DDP on cpu)")
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
