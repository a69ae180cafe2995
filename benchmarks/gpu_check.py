"""GPU readiness check: one command that measures what the mission needs the day a GPU is available (≤ 8 min, H200).

    python benchmarks/gpu_check.py --out gpu_check_out            # full mode, on a CUDA machine
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu_smoke   # every part on CPU with tiny shapes (< 2 min)

Parts, in order, each in its own forked process under its own time cap (``--cap PART=SECONDS`` overrides), so a slow
or hung part is killed and the next one runs; each row is appended to ``OUT/parts/<part>.jsonl`` the moment it is
measured and ``OUT/gpu_check.json`` / ``OUT/gpu_check.md`` are rewritten after every row (a killed run keeps what
it measured):

a. **environment**: device, CUDA / torch / transformers / deepspeed versions, the dense bf16 peak TFLOP/s from
   `hf_condinit.perf.PEAK_BF16_TFLOPS` (unknown devices say so), the SDPA backends that run (flash, memory-efficient,
   cuDNN, math; head dim 64 and the attention sink's padded 72), and a measured bf16 matmul TFLOP/s;
b. **correctness on the device**: each attention variant's fast path against its naive N×N reference
   (`hf_condinit.attention.reference`, the references of the CPU tests) on the same model, GPT-2 (head dim 64),
   Llama (GQA) and BERT, fp32 and bf16, with and without padding: max abs error of the output and of every gradient;
   KV-cache generation fast vs reference; spectral conditioning (hooks) vs the merged weights; conditioned and
   mimetic init built on the device vs the CPU build (same seed → the same weights); builds of every variant × init
   under a default-device context (``with torch.device(...)``, and ``"meta"``) with every tensor where it belongs;
c. **attention speed and memory**: forward + backward of one 472M-shaped layer (1280 wide, 20 heads of 64, bf16) at
   sequence 1024 / 4096 / 8192 (8192 tokens per step) for sdpa, eager, affine_scaled, attention_sink, preconditioned,
   spectral, through ``benchmarks/attention_speed.py``: tokens/s and peak ``torch.cuda.max_memory_allocated``, as
   ratios to sdpa in the same run;
d. **training**: GPT-2 472M (``configs/gpt2-472m.json``), bf16 mixed precision, plain ``transformers.Trainer`` in
   one process (ZeRO partitions nothing on one GPU, and the DeepSpeed launcher plus its op builds would spend minutes
   of a 15-minute window; the DeepSpeed path is covered by the CPU tests), fused AdamW, no gradient checkpointing,
   batch 16 × 1024 random tokens, 10 warm-up + 60 measured steps, for default, conditioned and affine_scaled; then
   1.72B (batch 8) if the part's time allows. Tokens/s, MFU and peak memory come from the library's own
   `hf_condinit.callbacks.ThroughputCallback` (so the run also checks it on a GPU);
e. **init cost**: building the 472M and 1.72B configs on the device (fp32, ``with torch.device(...)``) with default vs
   conditioned init (seconds, ratio, peak allocator memory), and mimetic's per-head D×D factorisation (drawn and
   factorised on CPU by design: same weights whatever the device), timed on a few heads and extrapolated to the
   model (labelled as such).

``--smoke`` runs every part on CPU with tiny stand-in shapes (labelled SMOKE everywhere: never GPU results); it is
run by ``tests/test_gpu_check.py``. Numbers of a smoke run mean nothing beyond "the code path works".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

PARTS = ("a", "b", "c", "d", "e")
TITLES = {
    "a": "a. environment",
    "b": "b. correctness on the device",
    "c": "c. attention speed and memory (one 472M-shaped layer)",
    "d": "d. training throughput (GPT-2 472M / 1.72B, bf16, Trainer)",
    "e": "e. init cost",
}
CAPS = {"a": 30, "b": 75, "c": 90, "d": 190, "e": 75}  # seconds, full mode: 460 s in all (+ ~15 s start-up)
SMOKE_CAPS = dict.fromkeys(PARTS, 300)  # a safety net only: a smoke part takes seconds on an idle CPU
VARIANTS = ("affine_scaled", "attention_sink", "preconditioned")
SPEED_IMPLS = ("sdpa", "eager", "affine_scaled", "attention_sink", "preconditioned", "spectral")
REL_TOL_FP32 = 1e-4  # fp32 fast path vs fp32 reference: float precision (bf16: see `_verdict`)


# ---------------------------------------------------------------------------------------------------------------
# recording: rows appended as they are measured, the report rewritten after each
# ---------------------------------------------------------------------------------------------------------------


class Recorder:
    """Appends rows of one part to ``OUT/parts/<part>.jsonl`` and rewrites the report after each."""

    def __init__(self, out: str, part: str):
        self.out, self.part = out, part

    def __call__(self, **row) -> dict:
        path = os.path.join(self.out, "parts", f"{self.part}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        write_report(self.out)
        return row


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a row cut by a kill mid-write
                    pass
    return rows


def _status(out: str) -> dict:
    path = os.path.join(out, "status.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _set_status(out: str, part: str, **fields) -> None:
    status = _status(out)
    status.setdefault("parts", {}).setdefault(part, {}).update(fields)
    tmp = os.path.join(out, "status.json.tmp")
    with open(tmp, "w") as f:
        json.dump(status, f, indent=1)
    os.replace(tmp, os.path.join(out, "status.json"))


def collect(out: str) -> dict:
    """Everything measured so far: settings, per-part status and rows."""
    status = _status(out)
    result = {"settings": status.get("settings", {}), "parts": {}}
    for part in status.get("settings", {}).get("parts", PARTS):
        result["parts"][part] = {
            "title": TITLES[part],
            **status.get("parts", {}).get(part, {"state": "pending"}),
            "rows": _read_jsonl(os.path.join(out, "parts", f"{part}.jsonl")),
        }
    return result


def write_report(out: str) -> dict:
    result = collect(out)
    texts = (("gpu_check.json", json.dumps(result, indent=1, default=str)), ("gpu_check.md", markdown(result)))
    for name, text in texts:
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))
    return result


# ---------------------------------------------------------------------------------------------------------------
# orchestration: one forked process per part, killed at its cap
# ---------------------------------------------------------------------------------------------------------------


def _child(fn, ctx: dict, out: str, part: str) -> None:
    record = Recorder(out, part)
    try:
        fn(ctx, record)
    except BaseException as e:  # noqa: BLE001 - the error is the result
        record(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        os._exit(1)
    os._exit(0)


def orchestrate(out: str, parts: list[tuple[str, object]], caps: dict[str, float], ctx: dict) -> dict:
    """Run each ``(name, fn)`` as ``fn(ctx, record)`` in a forked process, killed after ``caps[name]`` seconds.

    The parent never touches the accelerator (a CUDA context does not survive ``fork``); each child initialises its
    own. Returns the collected result.
    """
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    for name, fn in parts:
        cap = caps[name]
        _set_status(out, name, state="running", cap_s=cap)
        write_report(out)
        t0 = time.perf_counter()
        proc = fork.Process(target=_child, args=(fn, ctx, out, name), daemon=True)
        proc.start()
        proc.join(cap)
        if proc.is_alive():
            proc.kill()
            proc.join()
            state = "timeout"
        else:
            state = "done" if proc.exitcode == 0 else f"error (exit {proc.exitcode})"
        seconds = time.perf_counter() - t0
        _set_status(out, name, state=state, seconds=round(seconds, 1))
        write_report(out)
        print(f"gpu_check: part {name} {state} in {seconds:.1f}s (cap {cap:.0f}s)", file=sys.stderr, flush=True)
    return collect(out)


# ---------------------------------------------------------------------------------------------------------------
# shared helpers of the parts (run inside the children)
# ---------------------------------------------------------------------------------------------------------------


def _torch_setup(ctx: dict):
    import torch
    import transformers

    import hf_condinit  # noqa: F401  (hooks, variants)

    transformers.logging.set_verbosity_error()
    if ctx["threads"]:
        torch.set_num_threads(ctx["threads"])
    return torch


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dtype(torch, name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _warm_up(torch, device) -> None:
    """One-time costs kept out of the timings: the CUDA context, LAPACK's first SVD (used by the init schemes)."""
    torch.zeros(1, device=device)
    torch.linalg.svd(torch.randn(8, 4))
    _sync(torch, device)


def _shape(config) -> str:
    return f"{config.n_layer}×{config.n_embd} ({config.n_head} heads)"


def _gpt2_json(size: str, smoke: bool) -> dict:
    """The assumed 472M / 1.72B GPT-2 shape (configs/), or its tiny smoke stand-in."""
    path = os.path.join(REPO, "configs", {"472m": "gpt2-472m.json", "1.72b": "gpt2-1.72b.json"}[size])
    with open(path) as f:
        raw = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    if smoke:
        raw.update({"472m": dict(n_layer=2, n_embd=64, n_head=4), "1.72b": dict(n_layer=2, n_embd=96, n_head=6)}[size],
                   vocab_size=256, n_positions=64)
    return raw


# ---------------------------------------------------------------------------------------------------------------
# a. environment
# ---------------------------------------------------------------------------------------------------------------


def part_a(ctx: dict, record) -> None:
    import importlib.metadata as md
    import importlib.util
    import platform

    torch = _torch_setup(ctx)
    import torch.nn.functional as F
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hf_condinit.perf import peak_bf16_flops

    device = torch.device(ctx["device"])

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    env = dict(device=str(device), python=platform.python_version(), torch=torch.__version__,
               transformers=transformers.__version__, deepspeed=version("deepspeed"), cuda=torch.version.cuda,
               flash_attn_package=version("flash-attn") or version("flash_attn"),
               kernels_package=version("kernels") if importlib.util.find_spec("kernels") else None)
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

    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    seq = 64 if ctx["smoke"] else 1024
    for head_dim in (64, 72):  # 72 = 64 + the attention sink's padding on GPUs
        q = torch.randn(1, 4, seq, head_dim, device=device, dtype=dt)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
                _sync(torch, device)
                ok, why = True, ""
            except Exception as e:  # noqa: BLE001 - "not available" is the answer
                ok, why = False, str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            record(kind="sdpa_backend", backend=backend.name, head_dim=head_dim, dtype=str(dt), runs=ok, why=why)

    n = 256 if ctx["smoke"] else 8192
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    for _ in range(2):
        a @ b
    _sync(torch, device)
    reps = 3 if ctx["smoke"] else 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(torch, device)
    seconds = (time.perf_counter() - t0) / reps
    record(kind="matmul", n=n, dtype=str(dt), tflops=2 * n**3 / seconds / 1e12,
           fraction_of_peak=(2 * n**3 / seconds / peak) if peak else None)


# ---------------------------------------------------------------------------------------------------------------
# b. correctness on the device
# ---------------------------------------------------------------------------------------------------------------

# (model_type, AutoModel class name, config kwargs): GPT-2 with head dim 64 (the real one), Llama with GQA, BERT
FAMILIES = {
    "gpt2": ("AutoModelForCausalLM", dict(n_layer=2, n_embd=256, n_head=4, vocab_size=128, n_positions=64,
                                          bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0,
                                          embd_pdrop=0.0)),
    "llama": ("AutoModelForCausalLM", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                           num_hidden_layers=2, intermediate_size=128, vocab_size=128,
                                           max_position_embeddings=64, attention_bias=True, attention_dropout=0.0)),
    "bert": ("AutoModel", dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
                               vocab_size=128, max_position_embeddings=64, attention_probs_dropout_prob=0.0,
                               hidden_dropout_prob=0.0)),
}
TINY = {"gpt2": dict(n_layer=1, n_embd=32, n_head=2)}
SEQ_B = 12


def _build_family(torch, family: str, impl: str, dtype, device, tiny: bool = False, **condinit):
    import transformers
    from transformers import AutoConfig

    cls_name, kwargs = FAMILIES[family]
    if tiny:  # smoke runs, and checks of where tensors are placed: the shape does not matter
        kwargs = {**kwargs, **TINY.get(family, {})}
    cls = getattr(transformers, cls_name)
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(0)
    extra = {"condinit": {"method": "default", **condinit}} if condinit else {}
    with torch.device(device):
        model = cls.from_config(config, attn_implementation=impl, dtype=dtype, **extra)
    return model


def _inputs(torch, model, padded: bool, device):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, SEQ_B), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0  # left padding
        mask[1, -2:] = 0  # right padding
    return ids.to(device), (mask.to(device) if padded else None)


def _errors(got, truth) -> tuple[float, float]:
    """(max abs error, that over max |truth|) over lists of tensors (outputs, or every gradient of a model)."""
    err = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, truth))
    scale = max(b.float().abs().max().item() for b in truth)
    return err, err / scale if scale else err


def _verdict(dtype_name: str, rel: float, ref_rel: float) -> bool:
    """fp32: agree with the fp32 reference to float precision. bf16: be no worse than the naive reference run in
    bf16 on the same weights (both against the fp32 reference; factor 2, floor 1e-2): bf16 rounding is allowed,
    extra error of the fast path is not."""
    if dtype_name == "fp32":
        return rel <= REL_TOL_FP32
    return rel <= max(2.0 * ref_rel, 1e-2)


def _forward_backward(torch, model, impl, ids, mask):
    model.config._attn_implementation = impl
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask)
    y = out.logits if hasattr(out, "logits") else out.last_hidden_state
    if mask is not None:
        y = y * mask[..., None].to(y.dtype)
    weight = torch.linspace(-1, 1, y.shape[-1], device=y.device)
    (y.float() * weight).pow(2).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return [y.detach(), *[grads[n] for n in sorted(grads)]], sorted(grads)


def _generate(model, impl, ids, mask):
    model.config._attn_implementation = impl
    return model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                          output_logits=True, return_dict_in_generate=True)


def _agreeing_steps(torch, a, b, prompt: int) -> int:
    """Decoding steps whose logits are comparable: up to and including the first step where the tokens differ."""
    n = len(a.logits)
    for i in range(n):
        if not torch.equal(a.sequences[:, prompt + i], b.sequences[:, prompt + i]):
            return i + 1
    return n


def part_b(ctx: dict, record) -> None:
    import copy

    torch = _torch_setup(ctx)
    from hf_condinit.attention import merge_spectral
    from hf_condinit.attention.reference import randomise_holders, register_references
    from hf_condinit.layouts import get_layout

    register_references()
    device = torch.device(ctx["device"])
    smoke = ctx["smoke"]
    # smoke: one representative of each code path (CPU time); full: every combination
    families = ("gpt2",) if smoke else tuple(FAMILIES)
    paddings = (True,) if smoke else (False, True)
    spectral_modes = ("identity",) if smoke else ("identity", "svd")
    init_families = ("gpt2",) if smoke else ("gpt2", "llama")
    dtypes = ("fp32", "bf16")

    def dtypes_for(kind: str):  # smoke: bf16 (the _verdict path) in the train cases only
        return ("fp32",) if smoke and kind != "train" else dtypes

    def case(name, dtype_name, fn):
        try:
            fields = fn()
            if "passed" not in fields:
                fields["passed"] = _verdict(dtype_name, fields["rel_err"], fields.get("ref_rel_err") or 0.0)
            record(kind="case", case=name, dtype=dtype_name, **fields)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            record(kind="case", case=name, dtype=dtype_name, passed=False, error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc()[-1500:])

    def in_dtype(model, dtype_name):
        return model if dtype_name == "fp32" else copy.deepcopy(model).to(_dtype(torch, dtype_name))

    # 1. fast path vs naive reference, training forward + backward (outputs and every gradient)
    for family in families:
        for variant in VARIANTS:
            for dtype_name in dtypes_for("train"):
                for padded in paddings:
                    def run(family=family, variant=variant, dtype_name=dtype_name, padded=padded):
                        model = _build_family(torch, family, variant, torch.float32, device, tiny=smoke)
                        randomise_holders(model)
                        low = in_dtype(model, dtype_name) if dtype_name != "fp32" else None
                        start = copy.deepcopy(model.state_dict())
                        ids, mask = _inputs(torch, model, padded, device)
                        truth, names = _forward_backward(torch, model, variant + "_reference", ids, mask)
                        ref_rel = 0.0
                        if low is None:
                            model.load_state_dict(start)
                            got, got_names = _forward_backward(torch, model, variant, ids, mask)
                        else:
                            low_start = copy.deepcopy(low.state_dict())
                            got, got_names = _forward_backward(torch, low, variant, ids, mask)
                            low.load_state_dict(low_start)
                            ref, _ = _forward_backward(torch, low, variant + "_reference", ids, mask)
                            ref_rel = _errors(ref, truth)[1]
                        if got_names != names:
                            return dict(passed=False, error="gradients differ in which parameters get one")
                        err, rel = _errors(got, truth)
                        return dict(max_abs_err=err, rel_err=rel, ref_rel_err=ref_rel,
                                    out_rel_err=_errors(got[:1], truth[:1])[1])
                    case(f"{variant} fast vs reference, {family}, {'padded' if padded else 'no padding'}, train "
                         "fwd+bwd", dtype_name, run)

    # 2. KV-cache generation (left padding), fast vs reference: logits of every comparable decoding step
    for family in ("gpt2",) if smoke else ("gpt2", "llama"):
        for variant in VARIANTS:
            for dtype_name in dtypes_for("kv"):
                def run(family=family, variant=variant, dtype_name=dtype_name):
                    model = _build_family(torch, family, variant, torch.float32, device, tiny=smoke).eval()
                    randomise_holders(model)
                    ids, _ = _inputs(torch, model, False, device)
                    mask = torch.ones_like(ids)
                    mask[0, :3] = 0
                    truth = _generate(model, variant + "_reference", ids, mask)
                    low = in_dtype(model, dtype_name)
                    got = _generate(low, variant, ids, mask)
                    k = _agreeing_steps(torch, got, truth, ids.shape[1])
                    err, rel = _errors(got.logits[:k], truth.logits[:k])
                    ref_rel = 0.0
                    if dtype_name != "fp32":
                        ref = _generate(low, variant + "_reference", ids, mask)
                        kr = _agreeing_steps(torch, ref, truth, ids.shape[1])
                        ref_rel = _errors(ref.logits[:min(k, kr)], truth.logits[:min(k, kr)])[1]
                    return dict(max_abs_err=err, rel_err=rel, ref_rel_err=ref_rel, steps_compared=k,
                                same_tokens=bool(torch.equal(got.sequences, truth.sequences)))
                case(f"{variant} KV-cache generate fast vs reference, {family}", dtype_name, run)

    # 3. spectral conditioning: hooks (x·W + x·C) vs the merged weights (x·(W + C)), truth = merged in fp32
    for family in ("gpt2",) if smoke else ("gpt2", "llama"):
        for mode in spectral_modes:
            for dtype_name in dtypes_for("spectral"):
                def run(family=family, mode=mode, dtype_name=dtype_name):
                    model = _build_family(torch, family, "sdpa", torch.float32, device, tiny=smoke,
                                          spectral_lambda=10.0, spectral_mode=mode).eval()
                    ids, mask = _inputs(torch, model, True, device)
                    low = in_dtype(model, dtype_name)
                    with torch.no_grad():
                        truth = merge_spectral(copy.deepcopy(model))(input_ids=ids, attention_mask=mask).logits
                        got = low(input_ids=ids, attention_mask=mask).logits
                        ref = merge_spectral(copy.deepcopy(low))(input_ids=ids, attention_mask=mask).logits
                    err, rel = _errors([got], [truth])
                    return dict(max_abs_err=err, rel_err=rel, ref_rel_err=_errors([ref], [truth])[1],
                                note="reference = merged W + C in the same dtype")
                case(f"spectral ({mode}) hooks vs merged W + C, {family}", dtype_name, run)

    # 4. init built on the device (inside a default-device context) vs the CPU build: the same weights
    for family in init_families:
        for method in ("conditioned", "mimetic"):
            for dtype_name in dtypes_for("init"):
                def run(family=family, method=method, dtype_name=dtype_name):
                    dt = _dtype(torch, dtype_name)
                    on_dev = _build_family(torch, family, "sdpa", dt, device, tiny=smoke, method=method, seed=0)
                    on_cpu = _build_family(torch, family, "sdpa", torch.float32, torch.device("cpu"), tiny=smoke,
                                           method=method, seed=0)
                    layout = get_layout(on_dev)
                    written = ("q", "k", "v", "o") if method == "mimetic" else ("q", "k", "v")
                    worst, ortho = 0.0, 0.0
                    pairs = zip(layout.attention_modules(on_dev), layout.attention_modules(on_cpu))
                    for (_, blk_d), (_, blk_c) in pairs:
                        pd, pc = layout.projections(blk_d), layout.projections(blk_c)
                        for role in written:  # the rest is HF's init, drawn from each device's own RNG
                            a, b = pd[role].weight.detach(), pc[role].weight.detach().to(dt)
                            worst = max(worst, (a.cpu().float() - b.float()).abs().max().item())
                        if method == "conditioned":
                            for w in pd["q"].heads(pd["q"].weight.detach().float()):
                                eye = torch.eye(w.shape[1], device=w.device)
                                ortho = max(ortho, (w.T @ w - eye).abs().max().item())
                    ok = worst == 0.0 and (method != "conditioned" or ortho <= (1e-5 if dtype_name == "fp32" else 2e-2))
                    return dict(max_abs_err=worst, qTq_minus_I=ortho if method == "conditioned" else None, passed=ok,
                                note=f"device build vs CPU build, {'/'.join(written)} weights")
                case(f"{method} init on the device vs CPU, {family}", dtype_name, run)

    # 5. builds under a default-device context: every tensor on that device (and on meta for "meta")
    impls = ("sdpa",) + VARIANTS
    methods = ("default", "conditioned", "mimetic")
    spectrals = (None, "svd") if smoke else (None, "identity", "svd")
    for where in ([ctx["device"], "meta"] if ctx["device"] != "cpu" else ["cpu", "meta"]):
        def run(where=where):
            bad, n = [], 0
            for impl in impls:
                for method in methods:
                    for spectral in spectrals:
                        opts = {"method": method, "seed": 0}
                        if spectral:
                            opts.update(spectral_lambda=10.0, spectral_mode=spectral)
                        model = _build_family(torch, "gpt2", impl, torch.float32, torch.device(where),
                                              tiny=True, **opts)
                        n += 1
                        target = torch.device(where).type
                        bad += [f"{impl}/{method}/{spectral}: {name} on {t.device}"
                                for name, t in [*model.named_parameters(), *model.named_buffers()]
                                if t.device.type != target]
            return dict(builds=n, off_device=bad[:5], n_off_device=len(bad), passed=not bad)
        case(f"build every variant × init × spectral under torch.device({where!r})", "fp32", run)


# ---------------------------------------------------------------------------------------------------------------
# c. attention speed and memory
# ---------------------------------------------------------------------------------------------------------------


def part_c(ctx: dict, record) -> None:
    torch = _torch_setup(ctx)
    import attention_speed

    smoke = ctx["smoke"]
    settings = argparse.Namespace(
        layers=1, hidden=32 if smoke else 1280, heads=2 if smoke else 20, batch=1, tokens=128 if smoke else 8192,
        seqs=[32] if smoke else [1024, 4096, 8192], impls=list(SPEED_IMPLS),
        warmup=1 if smoke else 2, reps=1 if smoke else 5, threads=ctx["threads"], clock="wall",
        device=ctx["device"], dtype="fp32" if smoke else "bf16",
    )
    record(kind="settings", **{k: v for k, v in vars(settings).items()},
           memory=("torch.cuda.max_memory_allocated over the allocation before the step" if ctx["device"] != "cpu"
                   else "process peak RSS over the RSS before the step"))
    for seq in settings.seqs:  # one length at a time: a cap hit at 8192 keeps 1024 and 4096
        rows = attention_speed.measure(argparse.Namespace(**{**vars(settings), "seqs": [seq]}))
        base = next(r for r in rows if r["impl"] == "sdpa")
        for r in rows:
            record(kind="speed", impl=r["impl"], seq=seq, batch=r["batch"], tokens_per_s=r["tokens_per_s"],
                   seconds=r["seconds"], peak_mem_bytes=r["peak_mem_bytes"],
                   throughput_vs_sdpa=r["tokens_per_s"] / base["tokens_per_s"],
                   memory_vs_sdpa=(r["peak_mem_bytes"] / base["peak_mem_bytes"]
                                   if base["peak_mem_bytes"] > 0 else None))
        del rows
        if torch.device(ctx["device"]).type == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# d. training throughput through the Trainer and the library's ThroughputCallback
# ---------------------------------------------------------------------------------------------------------------

TRAIN_ARMS = (  # (label, size, attention, init)
    ("472M default", "472m", "sdpa", "default"),
    ("472M conditioned", "472m", "sdpa", "conditioned"),
    ("472M affine_scaled", "472m", "affine_scaled", "default"),
    ("1.72B default", "1.72b", "sdpa", "default"),
)


def part_d(ctx: dict, record) -> None:
    import gc
    import tempfile

    torch = _torch_setup(ctx)
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator

    from hf_condinit.callbacks import add_throughput_callback
    from hf_condinit.perf import model_flops_shape, training_flops

    smoke, device = ctx["smoke"], torch.device(ctx["device"])
    warmup, measured = (2, 2) if smoke else (10, 60)
    seq = 16 if smoke else 1024
    deadline = ctx["started"] + ctx["cap"]
    record(kind="settings", warmup_steps=warmup, measured_steps=measured, seq=seq, precision="bf16 autocast, fp32 "
           "master weights", optimizer="adamw_torch_fused" if device.type == "cuda" else "adamw_torch",
           gradient_checkpointing=False, runner="transformers.Trainer, one process",
           timing="hf_condinit.callbacks.ThroughputCallback (step time device-synchronised; warm-up window dropped)")
    _warm_up(torch, device)
    first_arm_s = None
    for label, size, impl, init in TRAIN_ARMS:
        batch = (2 if smoke else 16) if size == "472m" else (2 if smoke else 8)
        if size == "1.72b" and first_arm_s is not None:
            need = first_arm_s * 4.0  # ~3.6× the parameters, half the batch: about 2× the step time, + build
            left = deadline - time.time()
            if left < need:
                record(kind="train", arm=label, skipped=f"not enough time left in the part's cap ({left:.0f}s left, "
                       f"~{need:.0f}s needed)")
                continue
        t_arm = time.time()
        raw = _gpt2_json(size, smoke)
        raw["n_positions"] = max(raw["n_positions"], seq)
        config = AutoConfig.for_model(**raw)
        kwargs = {"attn_implementation": impl}
        if init != "default":
            kwargs["condinit"] = {"method": init, "seed": 0}
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        _sync(torch, device)
        build_s = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(0)
        steps = warmup + measured
        ids = torch.randint(0, config.vocab_size, (batch * steps, seq), generator=gen)
        data = [{"input_ids": row, "labels": row} for row in ids]
        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(
                output_dir=tmp, per_device_train_batch_size=batch, max_steps=steps, logging_steps=warmup,
                learning_rate=1e-4, warmup_steps=0, weight_decay=0.1, bf16=True, use_cpu=device.type == "cpu",
                optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch", report_to=[],
                save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
                gradient_checkpointing=False,
            )
            trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
            add_throughput_callback(trainer)
            trainer.train()
        windows = [h for h in trainer.state.log_history if "throughput/seconds_per_step" in h]
        # the callback logs every `warmup` steps: the first window is the warm-up, the rest are the measured steps
        timed = windows[1:]
        seconds = sum(h["throughput/seconds_per_step"] * warmup for h in timed)
        tokens = batch * seq * warmup * len(timed)
        n, layers, width = model_flops_shape(model)
        flops = training_flops(n, layers, width, batch, seq) * warmup * len(timed)
        peak = ctx.get("peak_flops")
        mem = [h.get("throughput/peak_memory_gib") for h in windows if h.get("throughput/peak_memory_gib")]
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        record(kind="train", arm=label, size=size, shape=_shape(config), attention=impl, init=init, batch=batch,
               seq=seq,
               n_params=sum(p.numel() for p in model.parameters()), matmul_params=n, build_s=build_s,
               measured_steps=warmup * len(timed), tokens_per_s=tokens / seconds if seconds else None,
               seconds_per_step=seconds / (warmup * len(timed)) if timed else None,
               tflops=flops / seconds / 1e12 if seconds else None,
               mfu=(flops / seconds / peak) if seconds and peak else None,
               peak_memory_gib=max(mem) if mem else None, first_loss=losses[0] if losses else None,
               last_loss=losses[-1] if losses else None, arm_wall_s=time.time() - t_arm)
        if first_arm_s is None:
            first_arm_s = time.time() - t_arm
        del trainer, model, data
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# e. init cost
# ---------------------------------------------------------------------------------------------------------------


def part_e(ctx: dict, record) -> None:
    import gc

    torch = _torch_setup(ctx)
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_condinit.config import CondInitConfig
    from hf_condinit.init.functional import mimetic_factors, mimetic_target
    from hf_condinit.perf import accelerator_memory, reset_accelerator_peak

    smoke, device = ctx["smoke"], torch.device(ctx["device"])
    _warm_up(torch, device)
    for size in ("472m", "1.72b"):
        config = AutoConfig.for_model(**_gpt2_json(size, smoke))
        builds = {}
        for method in ("default", "conditioned"):
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            reset_accelerator_peak(device)
            kwargs = {"condinit": {"method": method, "seed": 0}} if method != "default" else {}
            torch.manual_seed(0)
            t0 = time.perf_counter()
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **kwargs)
            _sync(torch, device)
            seconds = time.perf_counter() - t0
            memory = accelerator_memory(device)
            builds[method] = seconds
            record(kind="build", size=size, shape=_shape(config), method=method, seconds=seconds, dtype="fp32",
                   n_params=sum(p.numel() for p in model.parameters()),
                   peak_allocated_gib=memory["peak_allocated"] / 2**30 if memory else None,
                   vs_default=seconds / builds["default"])
            del model
        # mimetic: one D×D target + SVD per query head and one per layer for V/O, on CPU (see the docstring)
        cfg = CondInitConfig(method="mimetic", seed=0)
        gen = torch.Generator().manual_seed(0)
        budget = 0.0 if smoke else 8.0
        times, t_start = [], time.perf_counter()
        while not times or (time.perf_counter() - t_start < budget and len(times) < 20):
            t0 = time.perf_counter()
            mimetic_factors(mimetic_target(config.n_embd, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist,
                                           gen))
            times.append(time.perf_counter() - t0)
        per = sorted(times)[len(times) // 2]
        total = per * (config.n_head + 1) * config.n_layer
        record(kind="mimetic", size=size, factorisations_timed=len(times), seconds_per_factorisation=per,
               hidden=config.n_embd, extrapolated_total_s=total, extrapolated_vs_default=total / builds["default"],
               note=f"extrapolated: {config.n_head + 1} factorisations per layer × {config.n_layer} layers")


PART_FUNCTIONS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e}


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def _fmt(x, spec=".3g", none="–"):
    if x is None:
        return none
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def markdown(result: dict) -> str:
    s = result.get("settings", {})
    smoke = s.get("smoke", False)
    L = []
    if smoke:
        L.append("# GPU check — SMOKE RUN (CPU, tiny stand-in shapes): these numbers are not GPU results\n")
        L.append("Rows named 472M / 1.72B use the tiny shapes in their *shape* column, not the real models.\n")
    else:
        L.append(f"# GPU check on {s.get('device_name') or s.get('device', '?')}\n")
    L.append(f"Command: `{s.get('command', '?')}`  \nStarted {s.get('started_utc', '?')}; every number below was "
             "measured by this run" + (" in smoke mode (CPU)." if smoke else ".") + "\n")
    for part, p in result.get("parts", {}).items():
        state = p.get("state", "pending")
        L.append(f"## {p['title']} — {state}" + (f" ({p['seconds']} s of a {p['cap_s']:.0f} s cap)" if "seconds" in p
                                                   else ""))
        L.append("")
        rows = p.get("rows", [])
        errors = [r for r in rows if "error" in r and r.get("kind") != "case"]
        L.extend(RENDER[part](rows))
        for r in errors:
            L.append(f"\n**error**: `{r['error'][:300]}`")
        if state == "timeout":
            L.append("\n*Killed at its time cap: the rows above are what it measured before.*")
        L.append("")
    return "\n".join(L) + "\n"


def _render_a(rows):
    L = []
    env = next((r for r in rows if r.get("kind") == "env"), None)
    if env:
        L.append("| item | value |\n|---|---|")
        for key in ("device", "device_name", "capability", "memory_gib", "cpu_count", "torch", "cuda", "cudnn",
                    "transformers", "deepspeed", "flash_attn_package", "kernels_package", "peak_bf16_tflops",
                    "peak_source"):
            if key in env:
                L.append(f"| {key} | {_fmt(env[key], '.4g', 'none')} |")
    backends = [r for r in rows if r.get("kind") == "sdpa_backend"]
    if backends:
        L.append("\nSDPA backends (causal, 4 heads, " + str(backends[0]["dtype"]) + "):\n")
        L.append("| backend | head dim | runs | why not |\n|---|---|---|---|")
        for r in backends:
            L.append(f"| {r['backend']} | {r['head_dim']} | {'yes' if r['runs'] else 'no'} | {r['why'] or ''} |")
    mm = next((r for r in rows if r.get("kind") == "matmul"), None)
    if mm:
        L.append(f"\nMeasured {mm['n']}×{mm['n']} matmul ({mm['dtype']}): {mm['tflops']:.3g} TFLOP/s"
                 + (f" = {100 * mm['fraction_of_peak']:.0f} % of the table's peak"
                    if mm.get("fraction_of_peak") else ""))
    return L


def _render_b(rows):
    cases = [r for r in rows if r.get("kind") == "case"]
    if not cases:
        return []
    n_ok = sum(r["passed"] for r in cases)
    L = [f"{n_ok} / {len(cases)} cases pass. Error = max |got − fp32 reference| over max |fp32 reference|, over the "
         "output and every gradient (train cases) or the logits of each comparable decoding step (KV cache). fp32 "
         f"passes at ≤ {REL_TOL_FP32:g}; bf16 passes when the fast path is no worse than the naive reference run in "
         "bf16 on the same weights (≤ 2 × its error, floor 1e-2): bf16 rounding is allowed, extra error is not. "
         "Init: device build equals the CPU build exactly.\n",
         "| case | dtype | max abs err | rel err | bf16 reference's rel err | pass | detail |",
         "|---|---|---|---|---|---|---|"]
    for r in cases:
        detail = r.get("error") or ""
        if "same_tokens" in r:
            detail = f"{r['steps_compared']} steps compared, same tokens: {r['same_tokens']}"
        if r.get("qTq_minus_I") is not None:
            detail = f"max abs(QᵀQ − I) {r['qTq_minus_I']:.2g}"
        if "builds" in r:
            detail = f"{r['builds']} builds, {r['n_off_device']} tensors off the device {r['off_device'] or ''}"
        ref = _fmt(r.get("ref_rel_err"), ".2g") if r["dtype"] != "fp32" else "–"
        L.append(f"| {r['case']} | {r['dtype']} | {_fmt(r.get('max_abs_err'), '.2g')} | "
                 f"{_fmt(r.get('rel_err'), '.2g')} | {ref} | {'yes' if r['passed'] else '**NO**'} | {detail} |")
    return L


def _render_c(rows):
    speed = [r for r in rows if r.get("kind") == "speed"]
    st = next((r for r in rows if r.get("kind") == "settings"), None)
    L = []
    if st:
        L.append(f"{st['layers']} GPT-2 layer, {st['hidden']} wide, {st['heads']} heads, {st['dtype']}, "
                 f"{st['tokens']} tokens per step, forward + backward, median of {st['reps']} steps; memory: "
                 f"{st['memory']}.\n")
    if speed:
        L.append("| seq | impl | batch | tokens/s | × sdpa | peak MiB | memory × sdpa |")
        L.append("|---|---|---|---|---|---|---|")
        for r in speed:
            L.append(f"| {r['seq']} | {r['impl']} | {r['batch']} | {r['tokens_per_s']:.0f} | "
                     f"{r['throughput_vs_sdpa']:.2f} | {r['peak_mem_bytes'] / 2**20:.1f} | "
                     f"{_fmt(r['memory_vs_sdpa'], '.2f')} |")
    return L


def _render_d(rows):
    st = next((r for r in rows if r.get("kind") == "settings"), None)
    L = []
    if st:
        L.append(f"{st['runner']}, {st['precision']}, {st['optimizer']}, gradient checkpointing "
                 f"{st['gradient_checkpointing']}, sequence {st['seq']}, {st['warmup_steps']} warm-up + "
                 f"{st['measured_steps']} measured steps; {st['timing']}. MFU = (6·N + 12·L·D·T) FLOPs per token "
                 "(hf_condinit.perf) over the table's peak.\n")
    train = [r for r in rows if r.get("kind") == "train"]
    if train:
        L.append("| arm | shape | batch | tokens/s | s/step | TFLOP/s | MFU | peak GiB | build s | "
                 "loss first → last |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in train:
            if "skipped" in r:
                L.append(f"| {r['arm']} | skipped: {r['skipped']} |  |  |  |  |  |  |  |  |")
                continue
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "– (peak unknown)"
            L.append(f"| {r['arm']} | {r['shape']} | {r['batch']} | {_fmt(r['tokens_per_s'], '.0f')} | "
                     f"{_fmt(r['seconds_per_step'], '.3f')} | {_fmt(r['tflops'], '.1f')} | {mfu} | "
                     f"{_fmt(r['peak_memory_gib'], '.1f', '– (CPU)')} | {r['build_s']:.1f} | "
                     f"{_fmt(r['first_loss'], '.3f')} → {_fmt(r['last_loss'], '.3f')} |")
    return L


def _render_e(rows):
    L = []
    builds = [r for r in rows if r.get("kind") == "build"]
    if builds:
        L.append("| config | shape | init | params | build s | × default | peak allocated GiB |\n"
                 "|---|---|---|---|---|---|---|")
        for r in builds:
            L.append(f"| {r['size']} | {r['shape']} | {r['method']} | {r['n_params'] / 1e6:.1f} M | "
                     f"{r['seconds']:.2f} | "
                     f"{r['vs_default']:.2f} | {_fmt(r['peak_allocated_gib'], '.2f', '– (CPU)')} |")
    for r in (r for r in rows if r.get("kind") == "mimetic"):
        L.append(f"\nmimetic {r['size']}: {r['seconds_per_factorisation']:.3f} s per {r['hidden']}×{r['hidden']} "
                 f"factorisation (median of {r['factorisations_timed']}), {r['note']} → "
                 f"**{r['extrapolated_total_s']:.0f} s extrapolated**, {r['extrapolated_vs_default']:.1f}× the default "
                 "build.")
    return L


RENDER = {"a": _render_a, "b": _render_b, "c": _render_c, "d": _render_d, "e": _render_e}


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.md and parts/")
    p.add_argument("--smoke", action="store_true", help="every part on CPU with tiny shapes (labelled SMOKE)")
    p.add_argument("--device", default=None, help="default: cuda (full mode), cpu (--smoke)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS", help="override a part's time cap")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in each part (default: 1 with --smoke, where a shared CPU makes "
                        "multi-threaded LAPACK crawl; else torch's default)")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    if args.threads is None:
        args.threads = 1 if args.smoke else 0
    caps = dict(SMOKE_CAPS if args.smoke else CAPS)
    for item in args.cap:
        part, _, seconds = item.partition("=")
        try:
            if part not in PARTS:
                raise ValueError
            caps[part] = float(seconds)
        except ValueError:
            p.error(f"--cap {item!r}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
    args.caps = caps
    if args.smoke and args.device != "cpu":
        p.error("--smoke runs on CPU; drop --device, or drop --smoke to measure the device")
    return p, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if os.path.isdir(args.out) and os.listdir(args.out):
        parser.exit(2, f"gpu_check.py: --out {args.out} is not empty; give a new folder (nothing is overwritten)\n")
    import torch  # this process never touches CUDA: the parts fork from it

    import hf_condinit  # noqa: F401  imported once here, inherited by every forked part

    if torch.cuda.is_initialized():  # pragma: no cover - a CUDA context would not survive the fork of each part
        parser.exit(2, "gpu_check.py: an import initialised CUDA in the parent process, so the forked parts could "
                       "not use the GPU; this is a bug of gpu_check.py, please report it\n")

    if args.device.startswith("cuda") and not _cuda_visible():
        parser.exit(2, "gpu_check.py: no CUDA device visible to torch; run it on a GPU machine, or add --smoke "
                       "for the CPU check of the code paths\n")
    os.makedirs(os.path.join(args.out, "parts"), exist_ok=True)
    command = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with open(os.path.join(args.out, "status.json"), "w") as f:
        json.dump({"settings": dict(smoke=args.smoke, device=args.device,
                                    parts=args.parts, caps=args.caps, command=command,
                                    started_utc=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))}, f)
    ctx = dict(smoke=args.smoke, device=args.device, threads=args.threads)
    t0 = time.perf_counter()
    for part in args.parts:
        orchestrate(args.out, [(part, _with_context(PART_FUNCTIONS[part], part, args.out))], args.caps, ctx)
    result = write_report(args.out)
    print(markdown(result))
    print(f"gpu_check: {time.perf_counter() - t0:.0f}s in all; wrote {os.path.join(args.out, 'gpu_check.md')} and "
          "gpu_check.json", file=sys.stderr)
    failed = [p for p, v in result["parts"].items() if v.get("state") != "done"]
    bad_cases = [r for r in result["parts"].get("b", {}).get("rows", []) if r.get("kind") == "case" and not r["passed"]]
    return 1 if failed or bad_cases else 0


def _cuda_probe() -> None:
    import torch

    os._exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 3)


def _cuda_visible() -> bool:
    """Whether torch sees a CUDA device, asked in a forked child: the parent must not even initialise the driver
    (CUDA does not support ``fork`` after initialisation, and every part is a fork of the parent)."""
    import multiprocessing

    probe = multiprocessing.get_context("fork").Process(target=_cuda_probe, daemon=True)
    probe.start()
    probe.join(120)
    if probe.is_alive():
        probe.kill()
        probe.join()
    return probe.exitcode == 0


def _with_context(fn, part: str, out: str):
    """``fn`` with the part's start time and cap in ``ctx`` (part d plans its 1.72B arm with them), and the
    device's peak FLOP/s (read in the child: the parent never initialises CUDA)."""
    def run(ctx, record):
        import torch

        from hf_condinit.perf import peak_bf16_flops

        cap = _status(out).get("parts", {}).get(part, {}).get("cap_s", 0)
        peak = peak_bf16_flops(torch.device(ctx["device"])) if ctx["device"] != "cpu" else None
        fn({**ctx, "started": time.time(), "cap": cap, "peak_flops": peak}, record)

    return run


if __name__ == "__main__":
    sys.exit(main())
