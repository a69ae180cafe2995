"""Part a: the environment — device, versions, the dense bf16 peak, the SDPA backends that run, a measured matmul."""

from __future__ import annotations

import os
import statistics
import time

from .common import row_on_error, sync, torch_setup

MATMUL_WARMUP = 10  # at least this many, and at least MATMUL_WARMUP_S seconds: an idle H200 clocks at 345 MHz
MATMUL_WARMUP_S = 1.0
MATMUL_REPS = 100


def part_a(ctx: dict, record) -> None:
    torch = torch_setup(ctx)
    device = torch.device(ctx["device"])
    with row_on_error(record, device, kind="env"):
        _environment(torch, device, record)
    _sdpa_backends(torch, device, ctx["smoke"], record)
    with row_on_error(record, device, kind="matmul"):
        _matmul(torch, device, ctx["smoke"], record)


def _version(dist: str):
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _environment(torch, device, record) -> None:
    import platform

    import transformers

    from hf_condinit.perf import peak_bf16_flops

    env = dict(device=str(device), python=platform.python_version(), torch=torch.__version__,
               transformers=transformers.__version__, accelerate=_version("accelerate"),
               deepspeed=_version("deepspeed"), cuda=torch.version.cuda,
               flash_attn_package=_version("flash-attn") or _version("flash_attn"), kernels_package=_version("kernels"))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   visible_devices=torch.cuda.device_count())
    else:
        env.update(device_name=platform.processor() or platform.machine(), cpu_count=os.cpu_count())
    peak = peak_bf16_flops(device)
    env["peak_bf16_tflops"] = peak / 1e12 if peak else None
    env["peak_source"] = ("hf_condinit.perf.PEAK_BF16_TFLOPS (dense bf16)" if peak else
                          "unknown: no MFU (device not in hf_condinit.perf.PEAK_BF16_TFLOPS)")
    record(kind="env", **env)


def _sdpa_backends(torch, device, smoke: bool, record) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    seq = 64 if smoke else 1024
    for head_dim in (64, 72):  # 72 = 64 + the attention sink's padding on GPUs
        q = torch.randn(1, 4, seq, head_dim, device=device, dtype=dt)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
                sync(torch, device)
                ok, why = True, ""
            except Exception as e:  # noqa: BLE001 - "not available" is the answer
                ok, why = False, str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            record(kind="sdpa_backend", backend=backend.name, head_dim=head_dim, dtype=str(dt), runs=ok, why=why)


def _matmul(torch, device, smoke: bool, record) -> None:
    """bf16 (CPU: fp32) n×n matmul: ≥ 10 warm-ups over ≥ 1 s, then 100 timed repetitions (CUDA events on a GPU)."""
    from hf_condinit.perf import peak_bf16_flops

    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = 128 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    warmups, t0 = 0, time.perf_counter()
    while warmups < MATMUL_WARMUP or (not smoke and time.perf_counter() - t0 < MATMUL_WARMUP_S):
        a @ b
        warmups += 1
        if warmups % 10 == 0:
            sync(torch, device)
    sync(torch, device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(MATMUL_REPS)]
        for start, end in events:
            start.record()
            a @ b
            end.record()
        sync(torch, device)
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
        clock = "CUDA events, per repetition"
    else:
        times = []
        for _ in range(MATMUL_REPS):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        clock = "wall clock, per repetition"
    seconds = statistics.median(times)
    peak = peak_bf16_flops(device)
    record(kind="matmul", n=n, dtype=str(dt), warmups=warmups, reps=len(times), clock=clock,
           median_s=seconds, min_s=min(times), total_timed_s=sum(times), tflops=2 * n**3 / seconds / 1e12,
           fraction_of_peak=(2 * n**3 / seconds / peak) if peak else None)
