"""Part b: correctness on the device — every fast path against its naive reference, tensor by tensor (``judge``).

Cases: each attention variant's training forward + backward (output and every gradient) on GPT-2 (head dim 64),
Llama (GQA) and BERT, fp32 and bf16, with and without padding; KV-cache generation; spectral conditioning (fp32: hooks
vs the merged weights; bf16: against the fp32 model, `spectral_case`); conditioned / mimetic init built on the
device vs the CPU build; builds of every variant × init under a default-device context. Each case is its own row; an exception is a failing row with its message.
"""

from __future__ import annotations

import copy
import math
import traceback

from .common import dtype_of, error_text, torch_setup
from .judge import compare

VARIANTS = ("affine_scaled", "attention_sink", "preconditioned")

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


def build_family(torch, family: str, impl: str, dtype, device, tiny: bool = False, **condinit):
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


def make_inputs(torch, model, padded: bool, device):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, SEQ_B), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0  # left padding
        mask[1, -2:] = 0  # right padding
    return ids.to(device), (mask.to(device) if padded else None)


def forward_backward(torch, model, impl, ids, mask) -> tuple[list[str], list]:
    """``(names, tensors)``: ``"output"`` (logits or last hidden state, padded positions zeroed) and the gradient of
    every parameter that gets one (sorted by name), of the loss ``Σ (y · linspace(−1, 1))²``."""
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
    names = sorted(grads)
    return ["output", *names], [y.detach(), *[grads[n] for n in names]]


def train_case(torch, family: str, variant: str, dtype_name: str, padded: bool, device, tiny: bool,
               perturb=None) -> dict:
    """Fast path vs the fp32 naive reference, training forward + backward, on the same randomised weights.

    ``perturb(model)``, when given, is applied to the fast path's model just before its forward + backward (the
    tests plant faults with it: a NaN or a factor 2 in one gradient must fail the case).
    """
    from hf_condinit.attention.reference import randomise_holders

    model = build_family(torch, family, variant, torch.float32, device, tiny=tiny)
    randomise_holders(model)
    low = copy.deepcopy(model).to(dtype_of(torch, dtype_name)) if dtype_name != "fp32" else None
    start = copy.deepcopy(model.state_dict())
    ids, mask = make_inputs(torch, model, padded, device)
    names, truth = forward_backward(torch, model, variant + "_reference", ids, mask)
    ref = None
    if low is None:
        model.load_state_dict(start)
        fast = model
    else:
        low_start = copy.deepcopy(low.state_dict())
        ref_names, ref = forward_backward(torch, low, variant + "_reference", ids, mask)
        if ref_names != names:
            return dict(passed=False, error="the bf16 reference's gradients differ in which parameters get one")
        low.load_state_dict(low_start)
        fast = low
    if perturb is not None:
        perturb(fast)
    got_names, got = forward_backward(torch, fast, variant, ids, mask)
    if got_names != names:
        return dict(passed=False, error="the fast path's gradients differ in which parameters get one: "
                    f"{sorted(set(got_names) ^ set(names))[:5]}")
    return compare(names, got, truth, dtype_name, ref)


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


def kv_case(torch, family: str, variant: str, dtype_name: str, device, tiny: bool) -> dict:
    """KV-cache generation (left padding), fast vs reference: the logits of every comparable decoding step."""
    from hf_condinit.attention.reference import randomise_holders

    model = build_family(torch, family, variant, torch.float32, device, tiny=tiny).eval()
    randomise_holders(model)
    ids, _ = make_inputs(torch, model, False, device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    truth = _generate(model, variant + "_reference", ids, mask)
    low = model if dtype_name == "fp32" else copy.deepcopy(model).to(dtype_of(torch, dtype_name))
    got = _generate(low, variant, ids, mask)
    k = _agreeing_steps(torch, got, truth, ids.shape[1])
    ref = None
    if dtype_name != "fp32":
        ref_out = _generate(low, variant + "_reference", ids, mask)
        k = min(k, _agreeing_steps(torch, ref_out, truth, ids.shape[1]))
        ref = list(ref_out.logits[:k])
    names = [f"logits step {i}" for i in range(k)]
    return dict(**compare(names, list(got.logits[:k]), list(truth.logits[:k]), dtype_name, ref), steps_compared=k,
                same_tokens=bool(torch.equal(got.sequences, truth.sequences)))


def spectral_case(torch, family: str, mode: str, dtype_name: str, device, tiny: bool, perturb=None) -> dict:
    """Spectral conditioning. fp32: hooks (x·W + x·C) vs the merged weights (x·(W + C)), per tensor.

    bf16: the bf16 model against the *fp32 model* (no longer against W + C merged in bf16, whose own error was ~1 on
    the H200, so that a limit of 4× it could never fail), with
    `hf_condinit.attention.spectral.low_precision_error`: every spectral projection, fed the bf16 model's own input,
    within ``PROJECTION_TOL`` (2⁻⁷) of its fp32 value, and the logits within the judge's bf16 limit relative to the
    error of the fp32 model computing with its weights (W and C) rounded to bf16 (λ = 10 makes attention nearly
    one-hot, so the logits' sensitivity to rounding q/k is the model's, not the kernels').
    ``perturb(low)`` (tests) plants a fault in the bf16 model before it runs.
    """
    from hf_condinit.attention import merge_spectral
    from hf_condinit.attention.spectral import PROJECTION_TOL, low_precision_error

    from .judge import BF16_FACTOR, BF16_FLOOR

    model = build_family(torch, family, "sdpa", torch.float32, device, tiny=tiny, spectral_lambda=10.0,
                         spectral_mode=mode).eval()
    ids, mask = make_inputs(torch, model, True, device)
    if dtype_name == "fp32":
        with torch.no_grad():
            truth = merge_spectral(copy.deepcopy(model))(input_ids=ids, attention_mask=mask).logits
            got = model(input_ids=ids, attention_mask=mask).logits
        return dict(**compare(["logits"], [got], [truth], dtype_name), note="reference = merged W + C in fp32")
    low = copy.deepcopy(model).to(dtype_of(torch, dtype_name))
    rounded = copy.deepcopy(low).float()
    if perturb is not None:
        perturb(low)
    errors = low_precision_error(model, low, dict(input_ids=ids, attention_mask=mask), rounded=rounded)
    ref = errors["logits_rounded"]
    tensors = [["logits", errors["logits"], ref, max(BF16_FACTOR * ref, BF16_FLOOR)]]
    tensors += [[f"projection {name}", e, None, PROJECTION_TOL] for name, e in errors["projections"].items()]
    worst = max(tensors, key=lambda t: t[1] / t[3] if math.isfinite(t[1]) else math.inf)
    passed = bool(errors["projections"]) and all(rel <= limit for _, rel, _, limit in tensors)  # NaN fails
    return dict(passed=passed, worst_tensor=worst[0], rel_err=worst[1], ref_rel_err=worst[2], limit=worst[3],
                out_rel_err=errors["logits"], n_tensors=len(tensors), tensors=tensors,
                note="truth = the fp32 model; projections fed the bf16 model's own inputs")


def init_case(torch, family: str, method: str, dtype_name: str, device, tiny: bool) -> dict:
    """Init built on the device (inside a default-device context) vs the CPU build: the same written weights."""
    from hf_condinit.layouts import get_layout

    dt = dtype_of(torch, dtype_name)
    on_dev = build_family(torch, family, "sdpa", dt, device, tiny=tiny, method=method, seed=0)
    on_cpu = build_family(torch, family, "sdpa", torch.float32, torch.device("cpu"), tiny=tiny, method=method, seed=0)
    layout = get_layout(on_dev)
    written = ("q", "k", "v", "o") if method == "mimetic" else ("q", "k", "v")
    worst, ortho, non_finite = 0.0, 0.0, []
    for (name, blk_d), (_, blk_c) in zip(layout.attention_modules(on_dev), layout.attention_modules(on_cpu)):
        pd, pc = layout.projections(blk_d), layout.projections(blk_c)
        for role in written:  # the rest is HF's init, drawn from each device's own RNG
            a, b = pd[role].weight.detach(), pc[role].weight.detach().to(dt)
            if not bool(torch.isfinite(a).all()):
                non_finite.append(f"{name}.{role}")
            worst = max(worst, (a.cpu().float() - b.float()).abs().max().item())
        if method == "conditioned":
            for w in pd["q"].heads(pd["q"].weight.detach().float()):
                eye = torch.eye(w.shape[1], device=w.device)
                ortho = max(ortho, (w.T @ w - eye).abs().max().item())
    ok = not non_finite and worst == 0.0 and (
        method != "conditioned" or ortho <= (1e-5 if dtype_name == "fp32" else 2e-2))
    return dict(max_abs_err=worst, qTq_minus_I=ortho if method == "conditioned" else None, passed=ok,
                non_finite=non_finite, note=f"device build vs CPU build, {'/'.join(written)} weights")


def placement_case(torch, where: str, smoke: bool) -> dict:
    """Builds under ``torch.device(where)``: every parameter and buffer of every variant × init × spectral there."""
    impls = ("sdpa",) + VARIANTS
    methods = ("default", "conditioned", "mimetic")
    spectrals = (None, "svd") if smoke else (None, "identity", "svd")
    bad, n = [], 0
    for impl in impls:
        for method in methods:
            for spectral in spectrals:
                opts = {"method": method, "seed": 0}
                if spectral:
                    opts.update(spectral_lambda=10.0, spectral_mode=spectral)
                model = build_family(torch, "gpt2", impl, torch.float32, torch.device(where), tiny=True, **opts)
                n += 1
                target = torch.device(where).type
                bad += [f"{impl}/{method}/{spectral}: {name} on {t.device}"
                        for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != target]
    return dict(builds=n, off_device=bad[:5], n_off_device=len(bad), passed=not bad)


def part_b(ctx: dict, record) -> None:
    from hf_condinit.attention.reference import register_references

    torch = torch_setup(ctx)
    register_references()
    device = torch.device(ctx["device"])
    smoke = ctx["smoke"]
    # smoke: one representative of each code path (CPU time); full: every combination
    families = ("gpt2",) if smoke else tuple(FAMILIES)
    paddings = (True,) if smoke else (False, True)
    spectral_modes = ("identity",) if smoke else ("identity", "svd")
    decoder_families = ("gpt2",) if smoke else ("gpt2", "llama")

    def dtypes_for(kind: str):  # smoke: bf16 (the per-tensor bf16 verdict) in the train cases only
        return ("fp32",) if smoke and kind != "train" else ("fp32", "bf16")

    def case(name, dtype_name, fn):
        try:
            record(kind="case", case=name, dtype=dtype_name, **fn())
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            record(kind="case", case=name, dtype=dtype_name, passed=False, error=error_text(e),
                   traceback=traceback.format_exc()[-1500:])

    for family in families:
        for variant in VARIANTS:
            for dtype_name in dtypes_for("train"):
                for padded in paddings:
                    case(f"{variant} fast vs reference, {family}, {'padded' if padded else 'no padding'}, train "
                         "fwd+bwd", dtype_name,
                         lambda f=family, v=variant, d=dtype_name, p=padded: train_case(torch, f, v, d, p, device,
                                                                                        smoke))
    for family in decoder_families:
        for variant in VARIANTS:
            for dtype_name in dtypes_for("kv"):
                case(f"{variant} KV-cache generate fast vs reference, {family}", dtype_name,
                     lambda f=family, v=variant, d=dtype_name: kv_case(torch, f, v, d, device, smoke))
    for family in decoder_families:
        for mode in spectral_modes:
            for dtype_name in dtypes_for("spectral"):
                what = "hooks vs merged W + C" if dtype_name == "fp32" else "model vs the fp32 model"
                case(f"spectral ({mode}) {what}, {family}", dtype_name,
                     lambda f=family, m=mode, d=dtype_name: spectral_case(torch, f, m, d, device, smoke))
    for family in decoder_families:
        for method in ("conditioned", "mimetic"):
            for dtype_name in dtypes_for("init"):
                case(f"{method} init on the device vs CPU, {family}", dtype_name,
                     lambda f=family, m=method, d=dtype_name: init_case(torch, f, m, d, device, smoke))
    for where in ([ctx["device"], "meta"] if ctx["device"] != "cpu" else ["cpu", "meta"]):
        case(f"build every variant × init × spectral under torch.device({where!r})", "fp32",
             lambda w=where: placement_case(torch, w, smoke))
