"""Part d: training throughput through ``transformers.Trainer`` and the library's ``ThroughputCallback``.

GPT-2 472M, bf16 mixed precision, one process (no ZeRO: it partitions nothing on one GPU), fused AdamW, no gradient
checkpointing, random tokens at sequence 1024, 10 warm-up + 30 measured steps per arm. Two configurations, side by
side on the same model and batch: **today's** (plain eager Trainer, batch 16 at 472M / 8 at 1.72B) and **tuned**
(the same plus Trainer's ``torch_compile`` with accelerate's regional compilation,
``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1``: each repeated GPT-2 block compiled once, so the compile takes
seconds, not minutes). Arms in priority order (`TRAIN_ARMS`): 472M default today / tuned, 1.72B tuned, each
attention variant tuned (affine_scaled, attention_sink, preconditioned, spectral λ = 10), conditioned init tuned,
the micro-batch lever (472M tuned at batch 32, 1.72B tuned at 16), then 1.72B and 472M affine_scaled today. Every
arm after its configuration's 472M default runs when the time it is estimated to need is left in the part's cap
(`estimate_seconds`, from measured parts of that 472M default arm: build time × the parameter ratio, compilation ×
the ratio of regionally compiled graphs, s/step × the FLOP ratio of the arm's step, the rest unchanged); an arm that
does not fit is skipped with both numbers and the next one is tried. Each arm is its own row, with its estimate
beside the seconds it took (``arm_wall_s``; the 472M default arms are the references, estimated from nothing) and, for a
tuned arm, the graphs dynamo captured and its graph breaks: an error (e.g. out of memory) is that arm's row and the
next arm runs. Smoke mode compiles with the ``aot_eager`` backend (dynamo and AOTAutograd without inductor's C++
build).

Before the first tuned arm of each attention, `compiled_gradients_match` compiles a 2-layer fp32 GPT-2 of that
attention with the tuned backend on the device and compares every parameter's gradient with eager's (a
``compile_check`` row): a compiled arm whose gradients differ is not timed (its row says why). torch 2.11's compiled
autograd.Functions once gave the sink and affine_scaled zero attention gradients with eager's loss (issue 41): such
an arm's throughput would be of a model that does not train.
"""

from __future__ import annotations

import gc
import tempfile
import time

from .common import free_memory, gpt2_json, row_on_error, shape_of, sync, torch_setup, warm_up

TRAIN_ARMS = (  # (label, size, attention, init, tuned, batch or None for the size's default)
    ("472M default", "472m", "sdpa", "default", False, None),
    ("472M default tuned", "472m", "sdpa", "default", True, None),
    ("1.72B default tuned", "1.72b", "sdpa", "default", True, None),
    ("472M affine_scaled tuned", "472m", "affine_scaled", "default", True, None),
    ("472M attention_sink tuned", "472m", "attention_sink", "default", True, None),
    ("472M preconditioned tuned", "472m", "preconditioned", "default", True, None),
    ("472M spectral tuned", "472m", "spectral", "default", True, None),
    ("472M conditioned tuned", "472m", "sdpa", "conditioned", True, None),
    ("472M default tuned, batch 32", "472m", "sdpa", "default", True, 32),
    ("1.72B default tuned, batch 16", "1.72b", "sdpa", "default", True, 16),
    ("1.72B default", "1.72b", "sdpa", "default", False, None),
    ("472M affine_scaled", "472m", "affine_scaled", "default", False, None),
)
DEFAULT_BATCH = {"472m": 16, "1.72b": 8}
#: The accelerate switch Trainer's ``torch_compile`` reads for regional compilation (TorchDynamoPlugin).
REGIONAL = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"


def part_d(ctx: dict, record) -> None:
    from hf_condinit.attention._common import COMPILE_MIN_TORCH

    torch = torch_setup(ctx)
    smoke, device = ctx["smoke"], torch.device(ctx["device"])
    warmup, measured = (2, 2) if smoke else (10, 30)
    seq = 16 if smoke else 1024
    deadline = ctx["started"] + ctx["cap"]
    record(kind="settings", warmup_steps=warmup, measured_steps=measured, seq=seq, precision="bf16 autocast, fp32 "
           "master weights", optimizer="adamw_torch_fused" if device.type == "cuda" else "adamw_torch",
           gradient_checkpointing=False, runner="transformers.Trainer, one process (no ZeRO)",
           tuned=f"+ Trainer torch_compile ({'aot_eager' if smoke else 'inductor'}), {REGIONAL}=1",
           timing="hf_condinit.callbacks.ThroughputCallback (step time device-synchronised; warm-up window dropped)")
    warm_up(torch, device)
    references = {}  # tuned -> the measured 472M default arm of that configuration
    compile_checks = {}  # attention -> compile_check row
    for label, size, impl, init, tuned, batch in TRAIN_ARMS:
        batch = 2 if smoke else (batch or DEFAULT_BATCH[size])
        if tuned and torch.__version__ < COMPILE_MIN_TORCH:  # transformers' own forward does not trace there
            record(kind="train", arm=label, tuned=tuned, skipped=f"torch.compile needs torch >= "
                   f"{'.'.join(map(str, COMPILE_MIN_TORCH))} (this is torch {torch.__version__})")
            continue
        if tuned and impl not in compile_checks:
            with row_on_error(record, device, kind="compile_check", attention=impl):
                compile_checks[impl] = dict(kind="compile_check", attention=impl,
                                            **compiled_gradients_match(torch, impl, device, _backend(smoke)))
                record(**compile_checks[impl])
        if tuned and not compile_checks.get(impl, {}).get("match"):
            refused = compile_checks.get(impl, {}).get("refused")
            record(kind="train", arm=label, tuned=tuned,
                   skipped=f"compile refused on this torch: {refused}" if refused else
                   "compiled gradients differ from eager's (or the check failed): see its compile_check row")
            continue
        estimate = None
        reference = references.get(tuned)
        if reference is not None:
            with row_on_error(record, device, kind="train_estimate", arm=label):
                estimate = estimate_seconds(torch, reference, size, batch, seq, smoke, warmup + measured, tuned)
            left = deadline - time.time()
            if estimate is not None and left < estimate["seconds"]:
                record(kind="train", arm=label, tuned=tuned, estimate=estimate,
                       skipped=f"not enough time left in the part's cap ({left:.0f}s left, ~{estimate['seconds']:.0f}s "
                               f"estimated: {estimate['how']})")
                continue
        with row_on_error(record, device, kind="train", arm=label, tuned=tuned):
            row = train_arm(torch, label, size, impl, init, batch, seq, warmup, measured, device, smoke,
                            ctx.get("peak_flops"), tuned=tuned)
            record(**row, estimate=estimate)
            if (size, impl, init, batch) == ("472m", "sdpa", "default", 2 if smoke else DEFAULT_BATCH["472m"]):
                references.setdefault(tuned, row)
        free_memory(device)


def _compile_env(tuned: bool, smoke: bool) -> dict:
    """TrainingArguments' compile fields for an arm; sets or clears the regional switch (and the dynamo variables
    an earlier tuned arm's TrainingArguments left in the environment, which accelerate would otherwise read)."""
    import os

    for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE", REGIONAL):
        os.environ.pop(var, None)
    if not tuned:
        return {}
    os.environ[REGIONAL] = "1"
    return {"torch_compile": True, "torch_compile_backend": _backend(smoke)}


def _backend(smoke: bool) -> str:
    """The tuned configuration's torch.compile backend."""
    return "aot_eager" if smoke else "inductor"


def compiled_gradients_match(torch, impl: str, device, backend, rtol: float = 1e-4) -> dict:
    """Whether ``torch.compile(model, backend=backend)`` of a 2-layer fp32 GPT-2 with attention ``impl``
    (``"spectral"``: SDPA with spectral conditioning λ = 10), holders set to non-trivial values, gives every parameter
    eager's gradient of one training step on ``device`` (relative L2 error ≤ ``rtol``, per parameter). Returns
    ``match``, the worst parameter and its error, and the parameters with a zero compiled gradient but not an eager
    one. ``backend``: a name or a dynamo backend callable. Where the library refuses to compile that attention on the
    running torch (``hf_condinit.attention._common.compile_refusal``: torch 2.11 and affine_scaled / spectral), no
    compile is tried: ``match`` False and ``refused``, the refusal's line."""
    import copy

    from transformers import AutoModelForCausalLM, GPT2Config

    from hf_condinit.attention._common import compile_refusal

    config = GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=128, n_positions=32, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0)
    kwargs = {"attn_implementation": "sdpa" if impl == "spectral" else impl}
    if impl == "spectral":
        kwargs["condinit"] = {"method": "default", "spectral_lambda": 10.0}
    torch.manual_seed(0)
    with torch.device(device):
        eager = AutoModelForCausalLM.from_config(config, **kwargs).train()
    refused = compile_refusal(eager.config)
    if refused:
        return dict(match=False, backend=getattr(backend, "__name__", backend), refused=refused)
    with torch.no_grad():
        for name, p in eager.named_parameters():
            if "condinit_" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(device))
    compiled_model = copy.deepcopy(eager)
    ids = torch.randint(0, config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2)).to(device)
    torch._dynamo.reset()
    eager(ids, labels=ids).loss.backward()
    torch.compile(compiled_model, backend=backend)(ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    errors, zeroed = {}, []
    for (name, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        errors[name] = ((got - q.grad).norm() / q.grad.norm().clamp(min=1e-12)).item()
        if got.abs().max() == 0 < q.grad.abs().max():
            zeroed.append(name)
    worst = max(errors, key=errors.get)
    return dict(match=errors[worst] <= rtol, backend=getattr(backend, "__name__", backend), worst=worst,
                worst_rel_err=errors[worst], zero_compiled_grads=zeroed)


def train_arm(torch, label, size, impl, init, batch, seq, warmup, measured, device, smoke, peak,
              tuned: bool = False) -> dict:
    """One arm: build (``impl="spectral"``: SDPA with spectral conditioning λ = 10), train, read the throughput."""
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator

    from hf_condinit.callbacks import add_throughput_callback
    from hf_condinit.perf import model_flops_shape, training_flops

    t_arm = time.time()
    raw = gpt2_json(size, smoke)
    raw["n_positions"] = max(raw["n_positions"], seq)
    config = AutoConfig.for_model(**raw)
    kwargs = {"attn_implementation": "sdpa" if impl == "spectral" else impl}
    if init != "default" or impl == "spectral":
        kwargs["condinit"] = {"method": init, "seed": 0, **({"spectral_lambda": 10.0} if impl == "spectral" else {})}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    sync(torch, device)
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    steps = warmup + measured
    ids = torch.randint(0, config.vocab_size, (batch * steps, seq), generator=gen)
    data = [{"input_ids": row, "labels": row} for row in ids]
    compile_args = _compile_env(tuned, smoke)
    torch._dynamo.reset()  # a fresh cache per arm: the blocks' shared forward code must not hit the recompile limit
    counters.clear()
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=batch, max_steps=steps, logging_steps=warmup,
            learning_rate=1e-4, warmup_steps=0, weight_decay=0.1, bf16=True, use_cpu=device.type == "cpu",
            optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch", report_to=[],
            save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0, **compile_args,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
        add_throughput_callback(trainer)
        trainer.train()
    history = trainer.state.log_history
    windows = [h for h in history if "throughput/seconds_per_step" in h]
    # the callback logs every `warmup` steps: the first window is the warm-up, the rest are the measured steps
    timed = windows[1:]
    seconds = sum(h["throughput/seconds_per_step"] * warmup for h in timed)
    n_steps = warmup * len(timed)
    warmup_s = windows[0]["throughput/seconds_per_step"] * warmup if windows else None
    tokens = batch * seq * n_steps
    n, layers, width = model_flops_shape(model)
    flops = training_flops(n, layers, width, batch, seq) * n_steps
    mem = [h.get("throughput/peak_memory_gib") for h in windows if h.get("throughput/peak_memory_gib")]
    losses = [h["loss"] for h in history if "loss" in h]
    row = dict(kind="train", arm=label, size=size, shape=shape_of(config), attention=impl, init=init, batch=batch,
               seq=seq, n_params=sum(p.numel() for p in model.parameters()), matmul_params=n, build_s=build_s,
               measured_steps=n_steps, tokens_per_s=tokens / seconds if seconds else None,
               seconds_per_step=seconds / n_steps if n_steps else None,
               flops_per_step=training_flops(n, layers, width, batch, seq),
               tflops=flops / seconds / 1e12 if seconds else None,
               mfu=(flops / seconds / peak) if seconds and peak else None,
               peak_memory_gib=max(mem) if mem else None, first_loss=losses[0] if losses else None,
               last_loss=losses[-1] if losses else None, arm_wall_s=time.time() - t_arm, tuned=tuned,
               warmup_extra_s=(max(0.0, warmup_s - warmup * seconds / n_steps) if warmup_s is not None and n_steps
                               else None),
               graphs=counters["stats"].get("unique_graphs", 0) if tuned else None,
               graph_breaks=sum(counters["graph_break"].values()) if tuned else None)
    _compile_env(False, smoke)
    del trainer, model, data
    gc.collect()
    return row


def regional_graphs(module) -> int:
    """Graphs accelerate's regional compilation compiles for ``module`` (``accelerate.utils.compile_regions``): one
    per list of repeated blocks (blocks of one class share it: trained without a KV cache, as the Trainer trains,
    nothing tells them apart) and one per other region (a child of a module holding such a list, recursively). The
    same for GPT-2 472M and 1.72B: it depends on neither depth nor width."""
    from torch import nn

    def repeated(m) -> bool:  # accelerate.utils.other.is_repeated_blocks
        return isinstance(m, nn.ModuleList) and len(m) > 0 and all(isinstance(b, m[0].__class__) for b in m)

    if repeated(module):
        return 1
    if any(repeated(m) for m in module.modules()):
        return sum(regional_graphs(child) for child in module.children())
    return 1


def estimate_seconds(torch, measured: dict, size: str, batch: int, seq: int, smoke: bool, steps: int,
                     tuned: bool) -> dict:
    """Seconds an arm of ``size`` at ``batch`` needs, from ``measured`` (the 472M default arm of the arm's
    configuration: the first tuned arm for a tuned one), part by part:

    - build: its ``build_s`` × the parameter ratio (the init writes every weight);
    - warm-up beyond steady-state steps (``warmup_extra_s``): for a tuned arm its compilation, per compiled graph
      (the measured arm's extra over the graphs dynamo captured there) × the graphs regional compilation compiles
      for this model (`regional_graphs`), so it does not grow with the parameters; for today's arms unchanged;
    - steps: its s/step × the FLOP ratio per step (`hf_condinit.perf.training_flops`) × ``steps``;
    - the rest of its wall time (Trainer set-up, data): unchanged.

    The model is counted on the meta device. Returns ``seconds``, the parts, the ratios and ``how`` (one line).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_condinit.perf import model_flops_shape, training_flops

    raw = gpt2_json(size, smoke)
    raw["n_positions"] = max(raw["n_positions"], seq)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**raw))
    n, layers, width = model_flops_shape(model)
    flop_ratio = training_flops(n, layers, width, batch, seq) / measured["flops_per_step"]
    param_ratio = sum(p.numel() for p in model.parameters()) / measured["n_params"]
    step_s = measured["seconds_per_step"]
    warm_s = measured["warmup_extra_s"]
    graphs = regional_graphs(model) if tuned else None
    parts = dict(build_s=measured["build_s"] * param_ratio,
                 warmup_extra_s=warm_s * graphs / measured["graphs"] if tuned else warm_s,
                 steps_s=step_s * flop_ratio * steps,
                 other_s=max(0.0, measured["arm_wall_s"] - measured["build_s"] - warm_s - step_s * steps))
    compile_how = f"{warm_s / measured['graphs']:.2g} s × {graphs} graphs" if tuned else f"{warm_s:.0f} s"
    return dict(seconds=sum(parts.values()), **parts, flop_ratio=flop_ratio, param_ratio=param_ratio, graphs=graphs,
                how=f"build {measured['build_s']:.2g} s × {param_ratio:.2f} (parameter ratio) + warm-up "
                    f"{compile_how} + {step_s:.3g} s/step × {flop_ratio:.2f} (FLOP ratio) × {steps} steps + "
                    f"{parts['other_s']:.0f} s other")
