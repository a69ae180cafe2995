"""FSDP2 across the torch and accelerate versions the package supports, set up by :func:`set_up_fsdp` before any
model work (every script calls it from :func:`hf_condinit.scripts.parsing.parse_and_set_up`).

- torch < 2.6 has no FSDP2 (``torch.distributed.fsdp.fully_shard`` is public from 2.6; accelerate 1.15's
  ``FullyShardedDataParallelPlugin`` raises ``FSDP2 requires PyTorch >= 2.6.0`` only when the Trainer is built, after
  the model; accelerate 1.16 requires torch >= 2.6): a run asking for FSDP2 is refused at start with one line
  (:func:`check_fsdp2_support`, a :class:`~hf_condinit.errors.UsageError`: exit code 2); so is a run on accelerate <
  1.6, which has no FSDP2.
- accelerate < 1.16 loads the rank-0 weights of ``cpu_ram_efficient_loading`` (``fsdp2_load_full_state_dict``)
  as if every state-dict entry were a sharded parameter (a DTensor): a persistent buffer, which ``fully_shard``
  leaves a plain tensor (affine_scaled's ``alpha_ma``, the spectral holder's ``C``), fails on every rank with
  ``AttributeError: 'Tensor' object has no attribute 'device_mesh'`` (accelerate issue #3898). accelerate 1.16.0
  broadcasts such entries unsharded; :func:`patch_accelerate_buffer_loading` puts that version of the function
  (:func:`load_full_state_dict`) into accelerate 1.15 and older.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..versions import too_old
from ..errors import UsageError
from .launch import fsdp_version

#: The first torch release with FSDP2 (``torch.distributed.fsdp.fully_shard``; accelerate's FSDP2_PYTORCH_VERSION).
FSDP2_TORCH = (2, 6)
#: The first accelerate release with FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2)``,
#: ``fsdp2_prepare_model``: accelerate 1.6.0).
FSDP2_ACCELERATE = (1, 6)
#: The first accelerate release whose ``fsdp2_load_full_state_dict`` loads unsharded buffers.
BUFFER_LOADING_ACCELERATE = (1, 16)


def _below(version: str, needed: tuple[int, int]) -> bool:
    """`hf_condinit.versions.too_old` for a (major, minor) floor: release numbers only (``2.6.0a0+git`` and
    ``2.6.0+cu124`` are 2.6: clusters run such builds)."""
    return too_old(version, ".".join(map(str, needed)))


def fsdp2_missing() -> str | None:
    """Why this torch / accelerate has no FSDP2 (one sentence naming the version needed), or None when it has."""
    import accelerate

    for name, found, needed, what in (
        ("torch", torch.__version__, FSDP2_TORCH, "which added torch.distributed.fsdp.fully_shard"),
        ("accelerate", accelerate.__version__, FSDP2_ACCELERATE, "which added FSDP2 to its FSDP plugin"),
    ):
        if _below(found, needed):
            v = ".".join(map(str, needed))
            return f"FSDP2 (fsdp_version 2) needs {name} >= {v}, {what}; this is {name} {found}: install {name} >= {v}."
    return None


def fsdp2_supported() -> bool:
    """Whether this torch and accelerate have FSDP2 (torch >= 2.6, accelerate >= 1.6)."""
    return fsdp2_missing() is None


def check_fsdp2_support() -> None:
    """Raise a one-line :class:`UsageError` when this torch or accelerate has no FSDP2."""
    missing = fsdp2_missing()
    if missing:
        raise UsageError(missing)


def load_full_state_dict(accelerator, model: torch.nn.Module, full_sd: dict, cpu_offload: bool = False):
    """accelerate 1.16.0's ``fsdp2_load_full_state_dict`` (same signature; adapted from accelerate, Apache-2.0): rank 0's full state dict ``full_sd``
    broadcast entry by entry into the sharded ``model`` (on the meta device), each entry a sharded parameter (a
    DTensor: distributed over its mesh, moved to the CPU with ``cpu_offload``) or an unsharded buffer (kept whole on
    ``accelerator.device``), cast to the dtype of the model's entry. Returns ``model``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    sharded_sd = {}
    for name, target in model.state_dict().items():
        is_sharded = isinstance(target, DTensor)
        device = target.device_mesh.device_type if is_sharded else accelerator.device
        if accelerator.is_main_process:
            if name not in full_sd:
                raise KeyError(f"{name!r} is in the sharded model's state dict but not in the full state dict.")
            full = full_sd[name].detach().to(device)
            full = (full.to_local() if isinstance(full, DTensor) else full).contiguous()
        else:
            full = torch.empty(target.size(), device=device, dtype=target.dtype)
        dist.broadcast(full, src=0, group=dist.group.WORLD)
        tensor = distribute_tensor(full, target.device_mesh, target.placements) if is_sharded else full
        if full.dtype.is_floating_point and full.dtype != torch.float8_e4m3fn:
            tensor = tensor.to(dtype=target.dtype)
        if target.is_contiguous():
            tensor = tensor.contiguous()
        sharded_sd[name] = tensor.to("cpu") if cpu_offload and is_sharded else tensor
    model.load_state_dict(sharded_sd, assign=True)
    return model


def patch_accelerate_buffer_loading() -> None:
    """On accelerate < 1.16, make ``fsdp2_prepare_model`` load ``cpu_ram_efficient_loading`` weights with
    :func:`load_full_state_dict` (it looks ``fsdp2_load_full_state_dict`` up in its module at each call);
    idempotent, nothing on accelerate >= 1.16."""
    import accelerate
    from accelerate.utils import fsdp_utils

    if _below(accelerate.__version__, BUFFER_LOADING_ACCELERATE):
        fsdp_utils.fsdp2_load_full_state_dict = load_full_state_dict


def set_up_fsdp(training_args, env: Mapping[str, str] | None = None) -> None:
    """For a run with FSDP2 (``--fsdp_config`` or ``accelerate launch``'s FSDP variables): refuse it on torch < 2.6 or
    accelerate < 1.6 (:func:`check_fsdp2_support`) and patch accelerate < 1.16 (:func:`patch_accelerate_buffer_loading`). Nothing
    without FSDP2."""
    if fsdp_version(training_args, env) != 2:
        return
    check_fsdp2_support()
    patch_accelerate_buffer_loading()
