"""What the machine offers: :func:`has_accelerator`, :func:`machine_summary` and the defaults that depend on it."""

from __future__ import annotations

import os
import sys
from typing import Any


def accelerator_name() -> str | None:
    """The GPU-like device type torch sees on this machine (``"cuda"`` (CUDA/ROCm), ``"xpu"``, ``"mps"``, ``"npu"``),
    or ``None`` on a CPU-only machine."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    for name in ("xpu", "mps", "npu"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return name
    return None


def machine_summary() -> str:
    """The machine a throughput was measured on, in words: the accelerator's name (``"cuda NVIDIA H200"``), or the
    CPU model and core count (``"cpu Intel(R) Xeon(R) ..., 2 cores"``)."""
    import platform

    import torch

    accelerator = accelerator_name()
    if accelerator == "cuda":
        return f"cuda {torch.cuda.get_device_name()}"
    if accelerator:
        return accelerator
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu {model}, {os.cpu_count()} cores"


def has_accelerator() -> bool:
    """Whether torch sees a GPU-like device (CUDA/ROCm, XPU, MPS, NPU) on this machine."""
    return accelerator_name() is not None


def machine_defaults(given: set[str], deepspeed_file) -> dict[str, Any]:
    """Defaults that depend on this machine: no accelerator → no pinned memory (torch warns otherwise) and, with
    ``--deepspeed``, the CPU path (``--use_cpu``) instead of DeepSpeed failing on a batch-size mismatch."""
    out: dict[str, Any] = {}
    accelerator = has_accelerator()
    if not accelerator or "use_cpu" in given:
        out["dataloader_pin_memory"] = False
    if deepspeed_file and not accelerator and "use_cpu" not in given:
        out["use_cpu"] = True
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed then skips its accelerator probing and warning
        if os.environ.get("RANK", "0") == "0":  # once per run, not once per process
            print("No GPU found: running DeepSpeed on the CPU over gloo (as with --use_cpu).", file=sys.stderr)
    return out
