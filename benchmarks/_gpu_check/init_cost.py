"""Part e: init cost — building the 472M and 1.72B configs on the device: the default, conditioned and mimetic init.

fp32, ``with torch.device(...)``: seconds, ratio to the default build, peak allocator memory. Before the timed builds,
one throwaway build per init (472M; mimetic on one 472M-shaped layer) pays the one-time costs (CUDA kernels' lazy
loading, cuBLAS / cuSOLVER handles), so the first timed build is not cold; its seconds are recorded as ``warmup`` rows.
Every conditioned / mimetic build runs in both generator modes (``CondInitConfig.generator``, row field
``generator``), ``"device"`` first: the draws on the device's generator, or on the CPU's (the default: the same draws
whatever the device); both factorise on the device (`hf_condinit.init.functional.factor_device`). Order: default and
conditioned at 472M and 1.72B, the draws, then mimetic at 472M (the whole model) and at 1.72B on its first
``MIMETIC_172B_LAYERS`` layers beside a default build of the same cut model (ratio of the two; seconds extrapolated to
48 layers, labelled as such). Each conditioned / mimetic build's block 0 is checked (`_check_block0`) against draws
redone from a generator seeded as the build's, on the same device: conditioned against the CPU's per-head SVD of those
draws (max abs difference, ‖WᵀW − I‖), mimetic by the Eckart–Young criterion on heads 0–1 and the VO product (float64
reference SVD); ``check_passed`` says whether they are within 1e-5 / 1e-4. ``draw`` rows: the draws alone of one
block (conditioned: 2·H Gaussian D × d blocks; mimetic: H + 1 D × D targets), × layers, on the CPU's generator (the
part of the cost the device cannot take in the default mode) and on the device's. Each build is its own row.
"""

from __future__ import annotations

import time

from .common import free_memory, gpt2_json, row_on_error, shape_of, sync, torch_setup, warm_up

METHODS = ("default", "conditioned", "mimetic")
#: The generator modes each conditioned / mimetic build runs in, in this order (``CondInitConfig.generator``).
GENERATORS = ("device", "cpu")
MIMETIC_172B_LAYERS = 4


def _build(torch, config, method: str, device, generator: str | None):
    """A seed-0 build of ``config`` on ``device`` with ``method``, its generators in mode ``generator`` (None for the
    default init); (model, seconds)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"condinit": {"method": method, "seed": 0, "generator": generator}} if method != "default" else {}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **kwargs)
    sync(torch, device)
    return model, time.perf_counter() - t0


def part_e(ctx: dict, record) -> None:
    from transformers import AutoConfig

    torch = torch_setup(ctx)
    smoke, device = ctx["smoke"], torch.device(ctx["device"])
    warm_up(torch, device)
    first = AutoConfig.for_model(**gpt2_json("472m", smoke))
    for method in METHODS:
        config = AutoConfig.for_model(**dict(gpt2_json("472m", smoke), n_layer=1)) if method == "mimetic" else first
        with row_on_error(record, device, kind="warmup", size="472m", method=method):
            model, seconds = _build(torch, config, method, device, None if method == "default" else GENERATORS[0])
            del model
            record(kind="warmup", size="472m", method=method, seconds=seconds)
        free_memory(device)
    configs = {size: AutoConfig.for_model(**gpt2_json(size, smoke)) for size in ("472m", "1.72b")}
    defaults = {}
    for size, config in configs.items():
        _timed_build(torch, record, device, config, size, "default", defaults)
        for generator in GENERATORS:
            _timed_build(torch, record, device, config, size, "conditioned", defaults, generator=generator)
    for size, config in configs.items():  # before the mimetic builds, the part's longest rows
        with row_on_error(record, device, kind="draw", size=size):
            record(**_draw_floor(torch, config, size, device))
    for generator in GENERATORS:
        _timed_build(torch, record, device, configs["472m"], "472m", "mimetic", defaults, generator=generator)
    layers = min(MIMETIC_172B_LAYERS, configs["1.72b"].n_layer)
    cut = AutoConfig.for_model(**dict(gpt2_json("1.72b", smoke), n_layer=layers))
    cut_defaults = {}
    for method, generator in (("default", None), *(("mimetic", g) for g in GENERATORS)):
        _timed_build(torch, record, device, cut, "1.72b", method, cut_defaults, generator=generator,
                     of_layers=(layers, configs["1.72b"].n_layer), full_default=defaults.get("1.72b"))


def _timed_build(torch, record, device, config, size, method, defaults, generator=None, of_layers=None,
                 full_default=None) -> None:
    """One timed build row; ``defaults[size]`` holds the default build's seconds (the ratio's denominator).
    ``generator``: the mode of a conditioned / mimetic build (`GENERATORS`; None for the default init).
    ``of_layers = (built, full)``: a cut model, the seconds extrapolated to the full depth (its default build
    ``full_default`` + the init's own seconds × full / built)."""
    from hf_condinit.perf import accelerator_memory, reset_accelerator_peak

    with row_on_error(record, device, kind="build", size=size, method=method, generator=generator,
                      shape=shape_of(config)):
        free_memory(device)
        reset_accelerator_peak(device)
        model, seconds = _build(torch, config, method, device, generator)
        memory = accelerator_memory(device)
        if method == "default":
            defaults[size] = seconds
        base = defaults.get(size)
        row = dict(kind="build", size=size, shape=shape_of(config), method=method, generator=generator,
                   seconds=seconds, dtype="fp32", n_params=sum(p.numel() for p in model.parameters()),
                   peak_allocated_gib=memory["peak_allocated"] / 2**30 if memory else None,
                   vs_default=seconds / base if base else None)
        notes = [f"{generator} generator"] if generator else []
        if method != "default":
            row["check"] = _check_block0(torch, model, method, device if generator == "device" else None)
            row["check_passed"] = row["check"]["passed"]
        if of_layers and method != "default" and base and full_default:
            built, full = of_layers
            row.update(layers_built=built, layers_full=full,
                       extrapolated_s=full_default + (seconds - base) * full / built)
            notes.append(f"{built} of {full} layers; vs the default build of the same {built} layers")
        if notes:
            row["note"] = "; ".join(notes)
        record(**row)
        del model
    free_memory(device)


def _check_block0(torch, model, method: str, generator_device=None) -> dict:
    """Block 0 of a seed-0 build against an independent reference (see the module docstring); ``generator_device``:
    where the build's generators lived (None: the CPU)."""
    from hf_condinit.config import CondInitConfig
    from hf_condinit.init.functional import mimetic_target, semi_orthogonality_error
    from hf_condinit.layouts import get_layout

    layout = get_layout(model)
    block = layout.attention_modules(model)[0][1]
    g = layout.geometry(block, model.config)
    projs = layout.projections(block, g)
    # hf_condinit.api: seed · 1 000 003 + block ordinal, seed 0, block 0
    gen = torch.Generator(device=generator_device or "cpu").manual_seed(0)
    heads = {r: [w.detach().double() for w in projs[r].heads(projs[r].weight)] for r in projs}
    if method == "conditioned":
        diff = ortho = 0.0
        for w in heads["q"] + heads["k"]:
            draw = torch.randn(*w.shape, generator=gen, device=gen.device).cpu()
            u, _, vh = torch.linalg.svd(draw, full_matrices=False)
            diff = max(diff, float((w.cpu() - (u @ vh).double()).abs().max()))
            ortho = max(ortho, float(semi_orthogonality_error(w)))
        return dict(max_abs_vs_cpu=diff, semi_orthogonality=ortho, passed=diff <= 1e-5 and ortho <= 1e-5)
    cfg = CondInitConfig(method="mimetic", seed=0)
    qk = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
          for _ in range(g.n_heads)]
    vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist, gen)

    def excess(target, product, rank):
        a = target.double().to(product.device)
        if rank >= a.shape[0]:
            return float((a - product).norm() / a.norm())
        return float((a - product).norm() / torch.linalg.svdvals(a)[rank:].square().sum().sqrt() - 1)

    qk_excess = max(excess(qk[h], heads["q"][h] @ heads["k"][h].T, g.head_dim) for h in range(min(2, g.n_heads)))
    vo_product = sum(heads["v"][h] @ heads["o"][h] for h in range(g.n_heads))
    vo_excess = excess(vo, vo_product, g.n_heads * g.head_dim)
    return dict(qk_excess=qk_excess, vo_excess=vo_excess, passed=qk_excess <= 1e-4 and vo_excess <= 1e-4,
                note="heads 0-1 and VO of block 0 (MHA GPT-2: one KV head per query head)")


def _draw_floor(torch, config, size: str, device) -> dict:
    """Seconds of the draws alone for one block (the generator and calls of hf_condinit.init.functional), × the
    layers: what an init costs before any factorisation, on the CPU's generator (``conditioned_s``, ``mimetic_s``)
    and on ``device``'s (``conditioned_device_s``, ``mimetic_device_s``)."""
    from hf_condinit.init.functional import mimetic_target

    dim, heads, d = config.n_embd, config.n_head, config.n_embd // config.n_head
    row = dict(kind="draw", size=size, layers=config.n_layer, note="one block timed, × layers")
    for where, suffix in ((torch.device("cpu"), ""), (device, "_device")):
        gen = torch.Generator(device=where).manual_seed(0)
        sync(torch, where)
        t0 = time.perf_counter()
        for _ in range(2 * heads):
            torch.randn(dim, d, generator=gen, device=where)
        sync(torch, where)
        conditioned = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(heads + 1):
            mimetic_target(dim, 0.7, 0.7, 1, "uniform", gen)
        sync(torch, where)
        mimetic = time.perf_counter() - t0
        row.update({f"conditioned{suffix}_s": conditioned * config.n_layer,
                    f"mimetic{suffix}_s": mimetic * config.n_layer})
    return row
