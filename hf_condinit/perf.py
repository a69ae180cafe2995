"""Performance accounting shared by the throughput callback and ``benchmarks/gpu_check.py`` (one home).

- `PEAK_BF16_TFLOPS` / `peak_bf16_flops`: the dense bf16 peak of the accelerator, from a small table matched on the
  device name (``None`` = unknown: MFU is then not reported rather than guessed);
- `matmul_parameters`, `training_flops`, `model_flops_shape`: the training FLOPs of a batch, PaLM / nanoGPT /
  torchtitan convention: ``6·N`` per token for the parameter matmuls (forward 2·N, backward 4·N) plus
  ``12·L·D·T`` per token for the attention scores and the weighted sum (QKᵀ and A·V: 2·2·T·D per token and
  layer forward, ×3 with backward). N counts the parameters that take part in a matmul: every parameter except the
  embedding lookups, plus the output embedding (the LM head) when it is tied to the input embedding. The
  attention term counts the full T×T square even for causal models (the convention of those three codebases, so
  MFU numbers are comparable with theirs; flash kernels skip the masked half, so a causal model's real attention
  FLOPs are about half of it);
- `mfu`: achieved FLOP/s over the peak;
- `accelerator_memory` / `reset_accelerator_peak`: the allocator's peak counters of a CUDA (or other
  ``torch.accelerator``) device; ``None`` on CPU.
"""

from __future__ import annotations

import torch

__all__ = [
    "PEAK_BF16_TFLOPS",
    "peak_bf16_flops",
    "matmul_parameters",
    "model_flops_shape",
    "training_flops",
    "mfu",
    "accelerator_memory",
    "reset_accelerator_peak",
]

# Dense (no sparsity) bf16 tensor-core peak in TFLOP/s, matched as a substring of the device name, first match wins.
# Only the SXM parts are listed for H100: "H100 PCIe" / "H100 NVL" have lower clocks and stay unknown. "H200 NVL"
# (PCIe card, 600 W) is 835 dense (NVIDIA: 1,671 with sparsity) and must come before "H200" (SXM, 989).
PEAK_BF16_TFLOPS: tuple[tuple[str, float | None], ...] = (
    ("H100 PCIe", None),
    ("H100 NVL", None),
    ("H100", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("A100", 312.0),
)


def peak_bf16_flops(device: torch.device | str | None = None) -> float | None:
    """Dense bf16 peak FLOP/s of ``device`` (default: the current CUDA device), or ``None`` when unknown or CPU."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return peak_bf16_flops_for_name(name)


def peak_bf16_flops_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s for a device name (e.g. ``"NVIDIA H200"``), ``None`` if the table does not know it."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return None if tflops is None else tflops * 1e12
    return None


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in a matmul: all but embedding lookups, plus a tied output embedding (LM head).

    Works on meta-device and DeepSpeed ZeRO-3 models (reads ``ds_numel`` when present).
    """
    def numel(p):
        return int(getattr(p, "ds_numel", 0) or p.numel())

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    total = sum(numel(p) for p in model.parameters() if id(p) not in embeddings)
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None and getattr(out, "weight", None) is not None and id(out.weight) in embeddings:
        total += numel(out.weight)  # tied LM head: the lookup is free, the output matmul is not
    return total


def model_flops_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(N, L, D)`` of `training_flops` for a Hugging Face model: matmul parameters, layers, attention width."""
    config = model.config
    layers = int(config.num_hidden_layers)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    width = int(heads * head_dim) if heads and head_dim else int(config.hidden_size)
    return matmul_parameters(model), layers, width


def training_flops(n_params: int, n_layers: int, width: int, batch: int, seq_len: int) -> float:
    """FLOPs of one training forward + backward of a (batch, seq_len) input: ``6·N·B·T + 12·L·D·B·T²``."""
    tokens = batch * seq_len
    return 6.0 * n_params * tokens + 12.0 * n_layers * width * tokens * seq_len


def mfu(flops: float, seconds: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation (0–1): ``flops / seconds / peak_flops``; ``None`` when the peak is unknown."""
    if not peak_flops or seconds <= 0:
        return None
    return flops / seconds / peak_flops


def accelerator_memory(device: torch.device | str | None) -> dict[str, int] | None:
    """Peak allocated / reserved bytes of the allocator of ``device`` since the last reset; ``None`` on CPU."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type == "cpu" or device.type == "meta":
        return None
    if device.type == "cuda":
        return {"peak_allocated": int(torch.cuda.max_memory_allocated(device)),
                "peak_reserved": int(torch.cuda.max_memory_reserved(device))}
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "max_memory_allocated"):  # xpu, mps, ... through torch.accelerator
        return {"peak_allocated": int(acc.max_memory_allocated(device)),
                "peak_reserved": int(acc.max_memory_reserved(device))}
    return None


def reset_accelerator_peak(device: torch.device | str | None) -> None:
    """Start a new peak-memory window on ``device`` (no-op on CPU)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type in ("cpu", "meta"):
        return
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif hasattr(getattr(torch, "accelerator", None), "reset_peak_memory_stats"):
        torch.accelerator.reset_peak_memory_stats(device)
