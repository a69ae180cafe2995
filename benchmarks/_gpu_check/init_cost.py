"""Part e: init cost — building the 472M and 1.72B configs on the device with default vs conditioned init.

fp32, ``with torch.device(...)``: seconds, ratio to default, peak allocator memory. Before the timed builds, one
throwaway build per init of the 472M config pays the one-time costs (CUDA kernels' lazy loading, cuBLAS / cuSOLVER
handles, the first QR), so the first timed build is not cold; its seconds are recorded as ``warmup`` rows. Mimetic
init draws and factorises its per-head D×D targets on CPU by design (the same weights whatever the device): one
factorisation is timed a few times and extrapolated to the model (labelled as such). Each build is its own row.
"""

from __future__ import annotations

import time

from .common import free_memory, gpt2_json, row_on_error, shape_of, sync, torch_setup, warm_up

METHODS = ("default", "conditioned")


def _build(torch, config, method: str, device):
    from transformers import AutoModelForCausalLM

    kwargs = {"condinit": {"method": method, "seed": 0}} if method != "default" else {}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **kwargs)
    sync(torch, device)
    return model, time.perf_counter() - t0


def part_e(ctx: dict, record) -> None:
    from transformers import AutoConfig

    from hf_condinit.perf import accelerator_memory, reset_accelerator_peak

    torch = torch_setup(ctx)
    smoke, device = ctx["smoke"], torch.device(ctx["device"])
    warm_up(torch, device)
    first = AutoConfig.for_model(**gpt2_json("472m", smoke))
    for method in METHODS:
        with row_on_error(record, device, kind="warmup", size="472m", method=method):
            model, seconds = _build(torch, first, method, device)
            del model
            record(kind="warmup", size="472m", method=method, seconds=seconds)
        free_memory(device)
    for size in ("472m", "1.72b"):
        config = AutoConfig.for_model(**gpt2_json(size, smoke))
        default_s = None
        for method in METHODS:
            with row_on_error(record, device, kind="build", size=size, method=method, shape=shape_of(config)):
                free_memory(device)
                reset_accelerator_peak(device)
                model, seconds = _build(torch, config, method, device)
                memory = accelerator_memory(device)
                if method == "default":
                    default_s = seconds
                record(kind="build", size=size, shape=shape_of(config), method=method, seconds=seconds, dtype="fp32",
                       n_params=sum(p.numel() for p in model.parameters()),
                       peak_allocated_gib=memory["peak_allocated"] / 2**30 if memory else None,
                       vs_default=seconds / default_s if default_s else None)
                del model
            free_memory(device)
        with row_on_error(record, device, kind="mimetic", size=size):
            record(**_mimetic(torch, config, size, smoke, default_s))


def _mimetic(torch, config, size: str, smoke: bool, default_s: float | None) -> dict:
    """One D×D target + SVD per query head and one per layer for V/O, on CPU (see the module docstring)."""
    from hf_condinit.config import CondInitConfig
    from hf_condinit.init.functional import mimetic_factors, mimetic_target

    cfg = CondInitConfig(method="mimetic", seed=0)
    gen = torch.Generator().manual_seed(0)
    budget = 0.0 if smoke else 8.0
    times, t_start = [], time.perf_counter()
    while not times or (time.perf_counter() - t_start < budget and len(times) < 20):
        t0 = time.perf_counter()
        mimetic_factors(mimetic_target(config.n_embd, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen))
        times.append(time.perf_counter() - t0)
    per = sorted(times)[len(times) // 2]
    total = per * (config.n_head + 1) * config.n_layer
    return dict(kind="mimetic", size=size, factorisations_timed=len(times), seconds_per_factorisation=per,
                hidden=config.n_embd, extrapolated_total_s=total,
                extrapolated_vs_default=total / default_s if default_s else None,
                note=f"extrapolated: {config.n_head + 1} factorisations per layer × {config.n_layer} layers")
