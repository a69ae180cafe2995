"""Part d's training arm: one configuration of GPT-2 trained through ``transformers.Trainer`` and timed with the
library's ``ThroughputCallback``; and the planner that estimates an arm's seconds from a measured one.

An arm is a model (size, attention, init), a micro-batch and a set of speed levers (:class:`Levers`), each applied
the way ``run_clm.py``'s flags apply it, so a measured configuration is one a user can run:

- ``pad_vocab``: :func:`hf_condinit.lm_head.pad_vocabulary` after the build (``--pad_vocab_to_multiple_of``);
- ``chunked_ce``: :func:`hf_condinit.lm_head.use_chunked_lm_head_loss` (``--lm_head_ce chunked``; with the padded
  vocabulary's real size when both are on, as ``hf_condinit.scripts.levers.apply_speed_levers`` does);
- ``compile``: Trainer's ``torch_compile`` (``--torch_compile``): ``"whole"`` model, or ``"regional"`` with
  ``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1`` (each repeated block compiled once);
- ``fused_adamw``: ``optim="adamw_torch_fused"`` (``--optim adamw_torch_fused``) instead of ``run_clm.py``'s
  default ``adamw_torch``;
- ``tf32``: fp32 matmuls in TF32 (``--tf32``; what transformers' ``enable_tf32`` sets). The part sets the precision
  itself after ``TrainingArguments`` is built, for every arm (:func:`set_tf32`): transformers 5.17 turns TF32 on by
  itself whenever ``torch_compile`` and ``bf16`` are both set (which would mix the TF32 lever into the compile arms),
  and its ``enable_tf32`` is ``lru_cache``-d, so within one process it cannot switch TF32 back and forth.

Each row records what the arm really ran with, read from the objects: the embedding's rows (``vocab_rows``), the
file and function of the forward the Trainer was given (``loss_forward``: ``lm_head.py:forward`` for the chunked
loss; accelerate wraps it for autocast afterwards), the optimizer class and its ``fused`` flag, what accelerate
compiled (``compiled``: the whole model, the number of compiled regions, or nothing) and the fp32 matmul precision
when training began (``fp32_matmul``); a compiled arm also its graphs, graph breaks and their reasons.
bf16 mixed precision, one process (no ZeRO: it partitions nothing on one GPU), no gradient checkpointing, random
tokens. Smoke mode compiles with the ``aot_eager`` backend (dynamo and AOTAutograd without inductor's C++ build).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import time

from .common import gpt2_json, shape_of, sync

#: The accelerate switch Trainer's ``torch_compile`` reads for regional compilation (TorchDynamoPlugin).
REGIONAL = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"
COMPILE_MODES = ("regional", "whole")


@dataclasses.dataclass(frozen=True)
class Levers:
    """The speed levers of one arm (module docstring); ``Levers()`` is today's ``run_clm.py`` run: eager,
    ``adamw_torch``, the model's own loss, the tokenizer's vocabulary, fp32 matmuls in full precision."""

    pad_vocab: int | None = None  # pad the vocabulary to a multiple of this
    chunked_ce: bool = False
    compile: str | None = None  # None, "regional" or "whole"
    fused_adamw: bool = False
    tf32: bool = False

    def describe(self) -> str:
        parts = ([f"vocab padded to ×{self.pad_vocab}"] if self.pad_vocab else []) + (
            ["chunked CE"] if self.chunked_ce else []) + (
            [f"{self.compile} compile"] if self.compile else []) + (
            ["fused AdamW"] if self.fused_adamw else []) + (["TF32"] if self.tf32 else [])
        return " + ".join(parts) or "none (today)"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One timed configuration: ``label`` (its row's name), GPT-2 ``size`` ("472m" / "1.72b"), ``attention``
    ("spectral": SDPA with spectral conditioning λ = 10), ``init``, ``levers``, micro-``batch``, and the ``stage`` of
    part d it belongs to ("levers", "micro-batch", "best")."""

    label: str
    size: str
    attention: str
    init: str
    levers: Levers
    batch: int
    stage: str


def set_tf32(torch, on: bool, initial: tuple) -> str:
    """Set the fp32 matmul precision for the next arm: TF32 (as transformers' ``enable_tf32(True)``) or back to
    ``initial`` (:func:`fp32_state` at the start of the part). Returns the CUDA matmul precision now in force.

    torch >= 2.9: ``torch.backends.fp32_precision`` (the generic switch transformers sets) and
    ``torch.backends.cuda.matmul.fp32_precision``, both string properties (torch 2.11's own
    ``torch/backends/__init__.py``, ``GenericModule.fp32_precision``, and ``torch/backends/cuda/__init__.py``,
    ``cuBLASModule.__getattr__`` / ``__setattr__`` for ``"fp32_precision"``, read in the 2.11.0 wheel and in
    pytorch/pytorch). Only this API is used there: once it is set, torch refuses to read the legacy ``allow_tf32``
    state (``get_float32_matmul_precision`` raises "mix of the legacy and new APIs"). Older torch: the legacy
    ``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32`` booleans."""
    if hasattr(torch.backends, "fp32_precision"):
        generic, matmul = ("tf32", "tf32") if on else initial
        torch.backends.fp32_precision = generic
        torch.backends.cuda.matmul.fp32_precision = matmul
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (True, True) if on else initial
    return fp32_matmul(torch)


def fp32_state(torch) -> tuple:
    """The precision settings :func:`set_tf32` restores (read once, at the start of the part)."""
    if hasattr(torch.backends, "fp32_precision"):
        return torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def fp32_matmul(torch) -> str:
    """The CUDA fp32 matmul precision in force: ``"tf32"``, ``"ieee"`` or ``"none"`` (torch's default: IEEE)."""
    if hasattr(torch.backends, "fp32_precision"):
        return torch.backends.cuda.matmul.fp32_precision
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def compile_env(mode: str | None, smoke: bool) -> dict:
    """TrainingArguments' compile fields for compile ``mode``; sets or clears the regional switch (and the dynamo
    variables an earlier compiled arm's TrainingArguments left in the environment, which accelerate would read)."""
    for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE", REGIONAL):
        os.environ.pop(var, None)
    if mode is None:
        return {}
    if mode == "regional":
        os.environ[REGIONAL] = "1"
    return {"torch_compile": True, "torch_compile_backend": backend(smoke)}


def backend(smoke: bool) -> str:
    """The compiled arms' torch.compile backend."""
    return "aot_eager" if smoke else "inductor"


def arm_config(torch, arm: Arm, seq: int, smoke: bool):
    """The arm's GPT-2 config (``n_positions`` ≥ ``seq``) and the keyword arguments of its build."""
    from transformers import AutoConfig

    raw = gpt2_json(arm.size, smoke)
    raw["n_positions"] = max(raw["n_positions"], seq)
    kwargs = {"attn_implementation": "sdpa" if arm.attention == "spectral" else arm.attention}
    if arm.init != "default" or arm.attention == "spectral":
        kwargs["condinit"] = {"method": arm.init, "seed": 0,
                              **({"spectral_lambda": 10.0} if arm.attention == "spectral" else {})}
    return AutoConfig.for_model(**raw), kwargs


def train_arm(torch, arm: Arm, seq: int, warmup: int, measured: int, device, smoke: bool, peak,
              initial_fp32: tuple) -> dict:
    """Build the arm's model on ``device``, apply its levers, train ``warmup + measured`` steps of random tokens,
    and return its row (throughput from the callback's windows after the first; what it ran with: module
    docstring). ``initial_fp32``: :func:`fp32_state` at the start of the part."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments, default_data_collator

    from hf_condinit.callbacks import add_throughput_callback
    from hf_condinit.lm_head import pad_vocabulary, use_chunked_lm_head_loss
    from hf_condinit.perf import model_flops_shape, training_flops
    from hf_condinit.scripts_common import with_causal_loss_type

    t_arm = time.time()
    levers = arm.levers
    config, kwargs = arm_config(torch, arm, seq, smoke)
    real_vocab = config.vocab_size
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = with_causal_loss_type(AutoModelForCausalLM.from_config(config, **kwargs))  # as run_clm.py builds it
        if levers.pad_vocab:
            pad_vocabulary(model, real_vocab, levers.pad_vocab)
    sync(torch, device)
    build_s = time.perf_counter() - t0
    if levers.chunked_ce:
        use_chunked_lm_head_loss(model, real_vocab=real_vocab if levers.pad_vocab else None)
    code = model.forward.__func__.__code__ if "forward" in vars(model) else None  # before accelerate's autocast wrap
    steps = warmup + measured
    ids = torch.randint(0, real_vocab, (arm.batch * steps, seq), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    compile_args = compile_env(levers.compile, smoke)
    torch._dynamo.reset()  # a fresh cache per arm: the blocks' shared forward code must not hit the recompile limit
    counters.clear()
    began = {}

    class _ReadState(TrainerCallback):  # the precision in force once the Trainer has set everything up
        def on_train_begin(self, args, state, control, **kw):
            began["fp32_matmul"] = fp32_matmul(torch)

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=arm.batch, max_steps=steps, logging_steps=warmup,
            learning_rate=1e-4, warmup_steps=0, weight_decay=0.1, bf16=True, use_cpu=device.type == "cpu",
            optim="adamw_torch_fused" if levers.fused_adamw else "adamw_torch", report_to=[],
            save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0, **compile_args,
        )
        set_tf32(torch, levers.tf32, initial_fp32)  # after TrainingArguments, which may have set it (docstring)
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                          callbacks=[_ReadState()])
        add_throughput_callback(trainer)
        trainer.train()
    history = trainer.state.log_history
    windows = [h for h in history if "throughput/seconds_per_step" in h]
    # the callback logs every `warmup` steps: the first window is the warm-up, the rest are the measured steps
    timed = windows[1:]
    seconds = sum(h["throughput/seconds_per_step"] * warmup for h in timed)
    n_steps = warmup * len(timed)
    warmup_s = windows[0]["throughput/seconds_per_step"] * warmup if windows else None
    tokens = arm.batch * seq * n_steps
    n, layers, width = model_flops_shape(model)
    flops = training_flops(n, layers, width, arm.batch, seq) * n_steps
    mem = [h.get("throughput/peak_memory_gib") for h in windows if h.get("throughput/peak_memory_gib")]
    losses = [h["loss"] for h in history if "loss" in h]
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper, if any
    row = dict(kind="train", arm=arm.label, stage=arm.stage, levers=dataclasses.asdict(levers),
               levers_text=levers.describe(), size=arm.size, shape=shape_of(config), attention=arm.attention,
               init=arm.init, batch=arm.batch, seq=seq, n_params=sum(p.numel() for p in model.parameters()),
               matmul_params=n, layers=layers, build_s=build_s, measured_steps=n_steps,
               tokens_per_s=tokens / seconds if seconds else None,
               seconds_per_step=seconds / n_steps if n_steps else None,
               flops_per_step=training_flops(n, layers, width, arm.batch, seq),
               tflops=flops / seconds / 1e12 if seconds else None,
               mfu=(flops / seconds / peak) if seconds and peak else None,
               peak_memory_gib=max(mem) if mem else None, first_loss=losses[0] if losses else None,
               last_loss=losses[-1] if losses else None, arm_wall_s=time.time() - t_arm,
               warmup_extra_s=(max(0.0, warmup_s - warmup * seconds / n_steps) if warmup_s is not None and n_steps
                               else None),
               vocab_rows=model.get_input_embeddings().weight.shape[0], real_vocab=real_vocab,
               loss_forward=f"{os.path.basename(code.co_filename)}:{code.co_name}" if code else
               f"{type(model).__name__}.forward (the model's own)",
               optimizer=f"{type(optimizer).__name__}(fused={optimizer.defaults.get('fused')})",
               compiled=_compiled(torch, trainer.model_wrapped), fp32_matmul=began.get("fp32_matmul"),
               graphs=counters["stats"].get("unique_graphs", 0) if levers.compile else None,
               graph_breaks=sum(counters["graph_break"].values()) if levers.compile else None,
               graph_break_reasons=sorted(counters["graph_break"])[:5] if levers.compile else None)
    compile_env(None, smoke)
    set_tf32(torch, False, initial_fp32)
    del trainer, model, data
    gc.collect()
    return row


def _compiled(torch, model) -> str:
    """What accelerate compiled of the trained ``model``: ``"whole model"``, ``"N regions"`` or ``"nothing"``."""
    compiled = torch._dynamo.eval_frame.OptimizedModule
    if isinstance(model, compiled):
        return "whole model"
    regions = sum(isinstance(m, compiled) for m in model.modules())
    return f"{regions} regions" if regions else "nothing"


def compiled_gradients_match(torch, impl: str, device, backend, rtol: float = 1e-4) -> dict:
    """Whether ``torch.compile(model, backend=backend)`` of a 2-layer fp32 GPT-2 with attention ``impl``
    (``"spectral"``: SDPA with spectral conditioning λ = 10), holders set to non-trivial values, gives every parameter
    eager's gradient of one training step on ``device`` (relative L2 error ≤ ``rtol``, per parameter). Returns
    ``match``, the worst parameter and its error, and the parameters with a zero compiled gradient but not an eager
    one. ``backend``: a name or a dynamo backend callable. Where the library refuses to compile that attention on the
    running torch (``hf_condinit.attention.compile_guard.compile_refusal``: torch 2.11 and affine_scaled / spectral), no
    compile is tried: ``match`` False and ``refused``, the refusal's line."""
    import copy

    from transformers import AutoModelForCausalLM, GPT2Config

    from hf_condinit.attention.compile_guard import compile_refusal

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


def estimate_seconds(torch, measured: dict, arm: Arm, seq: int, smoke: bool, steps: int) -> dict:
    """Seconds ``arm`` needs, from ``measured`` (a measured row with the arm's compile mode: part d's reference,
    ``matrix.reference_for``), part by part:

    - build: its ``build_s`` × the parameter ratio (the init writes every weight);
    - warm-up beyond steady-state steps (``warmup_extra_s``): for a regionally compiled arm, the measured extra per
      compiled graph × the graphs regional compilation compiles for this model (`regional_graphs`: the same at any
      depth and width); for a whole-model compile, × the layer ratio (dynamo traces every block into one graph); for
      an eager arm unchanged;
    - steps: its s/step × the FLOP ratio per step (`hf_condinit.perf.training_flops`) × ``steps``;
    - the rest of its wall time (Trainer set-up, data): unchanged.

    The arm's model (its vocabulary padded as its levers say) is counted on the meta device. Returns ``seconds``, the
    parts, the ratios and ``how`` (one line)."""
    from transformers import AutoModelForCausalLM

    from hf_condinit.perf import model_flops_shape, training_flops

    config, _ = arm_config(torch, arm, seq, smoke)
    if arm.levers.pad_vocab:
        config.vocab_size = -(-config.vocab_size // arm.levers.pad_vocab) * arm.levers.pad_vocab
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n, layers, width = model_flops_shape(model)
    flop_ratio = training_flops(n, layers, width, arm.batch, seq) / measured["flops_per_step"]
    param_ratio = sum(p.numel() for p in model.parameters()) / measured["n_params"]
    step_s, warm_s = measured["seconds_per_step"], measured["warmup_extra_s"]
    mode = arm.levers.compile
    graphs = regional_graphs(model) if mode == "regional" else None
    if mode == "regional":
        warmup = warm_s * graphs / measured["graphs"]
        compile_how = f"{warm_s / measured['graphs']:.2g} s × {graphs} graphs"
    elif mode == "whole":
        warmup = warm_s * layers / measured["layers"]
        compile_how = f"{warm_s:.2g} s × {layers / measured['layers']:.2f} (layer ratio)"
    else:
        warmup, compile_how = warm_s, f"{warm_s:.0f} s"
    parts = dict(build_s=measured["build_s"] * param_ratio, warmup_extra_s=warmup,
                 steps_s=step_s * flop_ratio * steps,
                 other_s=max(0.0, measured["arm_wall_s"] - measured["build_s"] - warm_s - step_s * steps))
    return dict(seconds=sum(parts.values()), **parts, flop_ratio=flop_ratio, param_ratio=param_ratio, graphs=graphs,
                reference=measured["arm"],
                how=f"from {measured['arm']}: build {measured['build_s']:.2g} s × {param_ratio:.2f} (parameter "
                    "ratio) + "
                    f"warm-up {compile_how} + {step_s:.3g} s/step × {flop_ratio:.2f} (FLOP ratio) × {steps} steps + "
                    f"{parts['other_s']:.0f} s other")
