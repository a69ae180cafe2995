"""Shared pieces of the benchmarks (``compare.py``, ``throughput.py``): data, arms, model building, a compact
training loop, step-0 diagnostics and the κ(J) measurement.

Everything here is plain PyTorch around Hugging Face ``GPT2LMHeadModel`` built through
``AutoModelForCausalLM.from_config(cfg, condinit=..., attn_implementation=...)`` after ``import hf_condinit``.

Training recipe (METHODS.md §7 LM settings): AdamW β = (0.9, 0.95), ε = 1e-8, weight decay 0.1 on every parameter
with ≥ 2 dimensions (embeddings, q/k/v/o, MLP) except hf_condinit holder parameters (``condinit_*``: affine W_a,
sink logits), no decay on biases and LayerNorm; linear warmup over ``warmup`` (fraction) of the steps, then cosine
decay to 0 (HF ``cosine``); gradient clipping at global norm 1.0; fp32 on CPU.

Data order: the training blocks are shuffled by a ``torch.Generator`` seeded with the run's seed (a fresh
permutation per epoch), so every arm of one seed sees exactly the same batches in the same order. Model init:
``torch.manual_seed(seed)`` before building (the default-init parameters), ``condinit={"seed": seed}`` for the
scheme's own generators.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data"))
DATASETS = {
    "tinystories": os.path.join(SHARED_DATA, "tinystories", "TinyStories-train.sample-2MiB.txt"),
    "wikitext": os.path.join(SHARED_DATA, "wikitext", "wikitext-2-raw", "wiki.valid.raw"),
}

# arm name -> (init method, attn_implementation, extra condinit options)
ARMS: dict[str, tuple[str, str, dict]] = {
    "default": ("default", "sdpa", {}),
    "mimetic": ("mimetic", "sdpa", {}),
    "conditioned": ("conditioned", "sdpa", {}),
    "conditioned+affine_scaled": ("conditioned", "affine_scaled", {}),
    "affine_scaled": ("default", "affine_scaled", {}),
    "spectral": ("default", "sdpa", {"spectral_lambda": 10.0}),
    "preconditioned": ("default", "preconditioned", {}),
    "attention_sink": ("default", "attention_sink", {}),
}


def set_threads(n: Optional[int]) -> None:
    if n:
        torch.set_num_threads(n)


def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        import datasets

        datasets.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def stable_hash(obj: Any, n: int = 12) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


# ---------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------


def split_documents(text: str) -> list[str]:
    """TinyStories-style ``<|endoftext|>`` separators when present; otherwise WikiText-style articles (a new
    article starts at a `` = Title = `` line), otherwise non-blank lines."""
    if "<|endoftext|>" in text:
        docs = text.split("<|endoftext|>")
    else:
        docs, cur = [], []
        for line in text.split("\n"):
            s = line.strip()
            is_title = s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")
            if is_title and cur:
                docs.append("\n".join(cur))
                cur = []
            cur.append(line)
        docs.append("\n".join(cur))
        if len(docs) < 4:
            docs = [line for line in text.split("\n")]
    return [d.strip() for d in docs if d.strip()]


@dataclass
class DataBundle:
    train: torch.Tensor  # (n_train_blocks, block) int64
    val: torch.Tensor  # (n_val_blocks, block) int64
    vocab_size: int
    eos_id: int
    info: dict


def prepare_data(path: str, *, vocab_size: int, block_size: int, val_fraction: float = 0.05,
                 max_bytes: Optional[int] = None, cache_dir: Optional[str] = None) -> DataBundle:
    """Load a text file, hold out the first ``val_fraction`` of its documents for evaluation (contiguous, seed-free),
    train a byte-level BPE on the *training* documents only, tokenize (EOS after every document), pack into
    ``block_size`` blocks (remainder dropped). Cached as a ``.pt`` file under ``cache_dir``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} not found (pass --data PATH)")
    st = os.stat(path)
    key = stable_hash([os.path.abspath(path), st.st_size, vocab_size, block_size, val_fraction, max_bytes, 2])
    cache = os.path.join(cache_dir, f"data_{key}.pt") if cache_dir else None
    if cache and os.path.exists(cache):
        d = torch.load(cache)
        return DataBundle(**d)
    with open(path, encoding="utf-8") as f:
        text = f.read() if max_bytes is None else f.read(max_bytes)
    docs = split_documents(text)
    n_val = max(1, int(round(len(docs) * val_fraction)))
    if len(docs) - n_val < 1:
        raise ValueError(f"{path!r}: too few documents ({len(docs)}) for a validation split")
    val_docs, train_docs = docs[:n_val], docs[n_val:]
    from hf_condinit.data import train_bpe_tokenizer

    tok = train_bpe_tokenizer(train_docs, vocab_size)
    eos = tok.eos_token_id
    backend = tok._tokenizer if hasattr(tok, "_tokenizer") else tok.backend_tokenizer

    def pack(ds):
        ids = []
        for enc in backend.encode_batch(ds):
            ids.extend(enc.ids)
            ids.append(eos)
        n = len(ids) // block_size
        t = torch.tensor(ids[: n * block_size], dtype=torch.long).view(n, block_size)
        return t, len(ids)

    train, n_train_tok = pack(train_docs)
    val, n_val_tok = pack(val_docs)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"{path!r}: not enough tokens for one block of {block_size} in train and validation")
    info = dict(path=os.path.abspath(path), bytes=len(text.encode("utf-8")), documents=len(docs),
                train_documents=len(train_docs), val_documents=len(val_docs), train_tokens=n_train_tok,
                val_tokens=n_val_tok, train_blocks=len(train), val_blocks=len(val), block_size=block_size,
                vocab_size=len(tok), val_fraction=val_fraction)
    bundle = DataBundle(train=train, val=val, vocab_size=len(tok), eos_id=int(eos), info=info)
    if cache:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = cache + f".tmp{os.getpid()}"
        torch.save(asdict(bundle), tmp)
        os.replace(tmp, cache)
    return bundle


# ---------------------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------------------


def gpt2_config(*, n_layer: int, n_embd: int, n_head: int, n_positions: int, vocab_size: int, eos_id: int = 0):
    from transformers import GPT2Config

    return GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions, vocab_size=vocab_size,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
        initializer_range=0.02, tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id,
    )


def build_model(arm: str, config, seed: int, *, condinit_overrides: Optional[dict] = None, dtype=None):
    """Build a ``GPT2LMHeadModel`` for ``arm`` (``ARMS``) from ``config``; global RNG seeded with ``seed``."""
    import hf_condinit  # noqa: F401  (hooks + variants)
    from transformers import AutoModelForCausalLM

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {list(ARMS)}")
    method, impl, extra = ARMS[arm]
    condinit = {"method": method, "seed": int(seed), **extra}
    if condinit_overrides and method == "conditioned":
        condinit.update({k: v for k, v in condinit_overrides.items() if k in ("qk_gain", "v_gain", "value_init")})
    torch.manual_seed(seed)
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), condinit=condinit, attn_implementation=impl,
                                             **kwargs)
    return model


def param_groups(model, weight_decay: float):
    try:
        from hf_condinit import no_decay_parameter_names

        holder_names = set(no_decay_parameter_names(model))
    except (ImportError, AttributeError):  # pragma: no cover
        holder_names = {n for n, _ in model.named_parameters() if "condinit_" in n}
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and n not in holder_names else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step: int, total: int, peak: float, warmup_frac: float) -> float:
    warm = max(1, int(round(warmup_frac * total)))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats/token) over all ``blocks``."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        x = blocks[i : i + batch_size]
        out = model(input_ids=x, labels=x)
        n = x.numel() - x.shape[0]
        total += float(out.loss) * n
        count += n
    model.train(was)
    return total / count


# ---------------------------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------------------------


def distinct_probe(blocks: torch.Tensor, n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows of ``length`` tokens from the first blocks, with distinct first tokens (METHODS.md §6)."""
    rows, firsts = [], set()
    for b in blocks:
        for off in range(0, b.numel() - length + 1):
            if int(b[off]) not in firsts:
                rows.append(b[off : off + length])
                firsts.add(int(b[off]))
                break
        if len(rows) == n:
            break
    if len(rows) < n:
        raise ValueError("not enough distinct first tokens for the κ probe")
    ids = torch.stack(rows)
    return ids, torch.ones_like(ids)


def _rms(t: torch.Tensor) -> float:
    return float(t.float().pow(2).mean().sqrt())


@torch.no_grad()
def step0_diagnostics(model, probe_ids: torch.Tensor) -> dict:
    """Initial-state statistics that explain early optimisation: per layer the softmax attention entropy (nats,
    mean over heads and query positions; with the uniform-causal reference ``mean_t log(t+1)``), the std of the
    attention logits over allowed entries, the mean max-probability, RMS of the attention input X (ln_1 output),
    of Q, K, V (after any spectral shift, read from the ``c_attn`` output), of the attention block output (after
    ``c_proj``) and of the residual stream; and the std of the final logits.

    GPT-2 only (``transformer.h[i].attn.c_attn``). For affine_scaled / attention_sink / preconditioned the entropy
    is that of the plain softmax inside the variant.
    """
    was = model.training
    model.eval()
    tr = model.transformer
    n_head = model.config.n_head
    D = model.config.n_embd
    d = D // n_head
    caps: dict[int, dict] = {}
    handles = []

    def mk_in(i):
        def hook(mod, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            caps.setdefault(i, {})["x"] = x.detach()
        return hook

    def mk_qkv(i):
        def hook(mod, args, out):
            caps.setdefault(i, {})["qkv"] = out.detach()
        return hook

    def mk_out(i):
        def hook(mod, args, out):
            o = out[0] if isinstance(out, tuple) else out
            caps.setdefault(i, {})["o"] = o.detach()
        return hook

    for i, blk in enumerate(tr.h):
        handles.append(blk.attn.register_forward_pre_hook(mk_in(i), with_kwargs=True))
        handles.append(blk.attn.c_attn.register_forward_hook(mk_qkv(i)))
        handles.append(blk.attn.register_forward_hook(mk_out(i)))
    try:
        out = model(input_ids=probe_ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    B, N = probe_ids.shape
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    uniform_entropy = float(torch.log(torch.arange(1, N + 1, dtype=torch.float64)).mean())
    layers = []
    for i in range(len(tr.h)):
        c = caps[i]
        q, k, v = c["qkv"].float().split(D, dim=-1)
        q = q.view(B, N, n_head, d).transpose(1, 2)
        k = k.view(B, N, n_head, d).transpose(1, 2)
        v = v.view(B, N, n_head, d).transpose(1, 2)
        scaling = float(getattr(tr.h[i].attn, "scaling", d ** -0.5) or d ** -0.5)
        S = scaling * (q @ k.transpose(-1, -2))
        allowed = S.masked_select(causal.expand_as(S))
        P = torch.softmax(S.masked_fill(~causal, float("-inf")), dim=-1)
        ent = -(P * torch.log(P.clamp_min(1e-30))).sum(-1)  # (B, H, N)
        layers.append(dict(
            layer=i,
            attn_entropy=float(ent.mean()),
            attn_entropy_per_head=[float(e) for e in ent.mean(dim=(0, 2))],
            logit_std=float(allowed.std()),
            max_prob=float(P.max(-1).values.mean()),
            x_rms=_rms(c["x"]), q_rms=_rms(q), k_rms=_rms(k), v_rms=_rms(v), attn_out_rms=_rms(c["o"]),
            resid_rms=_rms(out.hidden_states[i]),
        ))
    return dict(uniform_causal_entropy=uniform_entropy, probe_shape=list(probe_ids.shape), layers=layers,
                final_resid_rms=_rms(out.hidden_states[-1]), logits_std=float(out.logits.float().std()))


def measure_kappa(model, probe_ids: torch.Tensor, probe_mask: torch.Tensor, *, include_unmasked: bool = True) -> dict:
    """κ(J) of every layer and head on the probe (``hf_condinit.attention_jacobian_condition_number``, causal mask
    as the model uses it, plus the unmasked value). Spectral conditioning is measured on a merged copy (W + C), since
    the diagnostic reads the layout's weight views."""
    import hf_condinit

    target = model
    merged = False
    if any("condinit_spectral" in n for n, _ in model.named_modules()):
        target = copy.deepcopy(model)
        hf_condinit.merge_spectral(target)
        merged = True
    t0 = time.perf_counter()
    rep = hf_condinit.attention_jacobian_condition_number(target, probe_ids, probe_mask,
                                                          include_unmasked=include_unmasked)
    secs = time.perf_counter() - t0
    flat = rep.to_log_dict()
    layers = []
    for lc in rep.layers:
        d = lc.to_dict()
        layers.append({k: d.get(k) for k in ("layer", "mean", "max", "bound", "kappa_px", "kappa_p", "n_saturated",
                                             "unmasked_mean", "unmasked_max")})
        layers[-1]["unmasked_bound"] = (sum(h["bound"] for h in d["unmasked_heads"]) / len(d["unmasked_heads"])
                                        if d.get("unmasked_heads") else None)
        layers[-1]["n_heads"] = len(d["heads"])
    mean = flat["kappa/mean"]
    um = [l["unmasked_mean"] for l in layers if l.get("unmasked_mean") is not None]
    bounds = [l["bound"] for l in layers]
    ubounds = [l["unmasked_bound"] for l in layers if l.get("unmasked_bound") is not None]
    return dict(mean=mean, max=flat["kappa/max"],
                unmasked_mean=(sum(um) / len(um)) if um else None,
                bound_mean=sum(bounds) / len(bounds),
                unmasked_bound_mean=(sum(ubounds) / len(ubounds)) if ubounds else None,
                n_saturated=sum(l["n_saturated"] for l in layers), n_heads=sum(l["n_heads"] for l in layers),
                seconds=secs, merged_spectral=merged, layers=layers)


# ---------------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class TrainSpec:
    arm: str
    seed: int
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    block_size: int = 256
    batch_size: int = 16
    steps: int = 300
    lr: float = 1e-3
    warmup: float = 0.05
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 25
    eval_blocks: int = 64  # blocks of the held-out split used for the curve; the final eval uses all of them
    log_every: int = 5
    kappa_at: tuple = (0.0, 0.25, 0.5, 1.0)  # fractions of the run (empty: no κ)
    kappa_probe: tuple = (2, 16)  # (sequences, tokens)
    diag_probe: tuple = (4, 128)
    qk_gain: Optional[float] = None
    v_gain: Optional[float] = None
    setting: str = "base"
    extra: dict = field(default_factory=dict)

    def key(self) -> str:
        return stable_hash(asdict(self))


def train_run(spec: TrainSpec, data: DataBundle, *, progress=None) -> dict:
    """Train one arm for one seed; return the run record (curves, final eval, κ, step-0 diagnostics, timings)."""
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    config = gpt2_config(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
                         n_positions=spec.block_size, vocab_size=data.vocab_size, eos_id=data.eos_id)
    overrides = {k: v for k, v in (("qk_gain", spec.qk_gain), ("v_gain", spec.v_gain)) if v is not None}
    t_build = time.perf_counter()
    model = build_model(spec.arm, config, spec.seed, condinit_overrides=overrides)
    t_build = time.perf_counter() - t_build
    model.train()
    opt = torch.optim.AdamW(param_groups(model, spec.weight_decay), lr=spec.lr, betas=tuple(spec.betas), eps=1e-8)
    val_curve_blocks = data.val[: spec.eval_blocks]
    eval_bs = max(1, spec.batch_size)
    kappa_steps = sorted({min(spec.steps, int(round(f * spec.steps))) for f in spec.kappa_at})
    kprobe = distinct_probe(data.val, *spec.kappa_probe) if kappa_steps else None
    dprobe = data.val[: spec.diag_probe[0], : spec.diag_probe[1]]

    gen = torch.Generator().manual_seed(spec.seed)
    order: list[int] = []
    epoch_pos = 0
    tokens_seen = 0

    def next_batch():
        nonlocal order, epoch_pos
        idx = []
        while len(idx) < spec.batch_size:
            if epoch_pos >= len(order):
                order = torch.randperm(len(data.train), generator=gen).tolist()
                epoch_pos = 0
            take = min(spec.batch_size - len(idx), len(order) - epoch_pos)
            idx.extend(order[epoch_pos : epoch_pos + take])
            epoch_pos += take
        return data.train[idx]

    rec: dict[str, Any] = dict(spec=asdict(spec), key=spec.key(), arm=spec.arm, seed=spec.seed, setting=spec.setting,
                               n_params=sum(p.numel() for p in model.parameters()),
                               data=data.info, train_curve=[], eval_curve=[], kappa=[], build_seconds=t_build)
    rec["step0"] = step0_diagnostics(model, dprobe)
    kappa_seconds = 0.0
    train_seconds = 0.0
    eval_seconds = 0.0

    def do_eval(step):
        nonlocal eval_seconds
        t = time.perf_counter()
        loss = evaluate(model, val_curve_blocks, eval_bs)
        eval_seconds += time.perf_counter() - t
        rec["eval_curve"].append([step, loss])
        return loss

    def do_kappa(step):
        nonlocal kappa_seconds
        t = time.perf_counter()
        k = measure_kappa(model, *kprobe)
        kappa_seconds += time.perf_counter() - t
        k["step"] = step
        rec["kappa"].append(k)

    do_eval(0)
    rec["initial_eval_loss"] = rec["eval_curve"][0][1]
    if 0 in kappa_steps:
        do_kappa(0)
    run_loss, run_n = 0.0, 0
    for step in range(spec.steps):
        t = time.perf_counter()
        lr = lr_at(step, spec.steps, spec.lr, spec.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = next_batch()
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip) if spec.grad_clip else None
        opt.step()
        train_seconds += time.perf_counter() - t
        tokens_seen += x.numel()
        lv = float(loss.detach())
        if not math.isfinite(lv):
            rec["diverged_at"] = step + 1
            break
        run_loss += lv
        run_n += 1
        done = step + 1
        if done % spec.log_every == 0 or done == spec.steps:
            rec["train_curve"].append([done, run_loss / run_n, lr, float(gn) if gn is not None else None])
            run_loss, run_n = 0.0, 0
        if done % spec.eval_every == 0 and done != spec.steps:
            do_eval(done)
        if done in kappa_steps and done != 0:
            do_kappa(done)
        if progress is not None:
            progress(done, spec.steps, lv)
    t = time.perf_counter()
    final = evaluate(model, data.val, eval_bs)
    eval_seconds += time.perf_counter() - t
    done_steps = rec.get("diverged_at", spec.steps)
    if not rec["eval_curve"] or rec["eval_curve"][-1][0] != done_steps:
        rec["eval_curve"].append([done_steps, evaluate(model, val_curve_blocks, eval_bs)])
    rec.update(final_eval_loss=final, final_eval_ppl=math.exp(final) if math.isfinite(final) else float("inf"),
               steps=done_steps, tokens_seen=tokens_seen, epochs=tokens_seen / max(1, data.train.numel()),
               train_seconds=train_seconds, eval_seconds=eval_seconds, kappa_seconds=kappa_seconds,
               tokens_per_s=tokens_seen / max(train_seconds, 1e-9), torch_threads=torch.get_num_threads(),
               wall_seconds=time.perf_counter() - t_start, loadavg_1m_at_start=load_start)
    if hasattr(model.transformer.h[0].attn, "condinit_affine"):
        rec["alpha_ma"] = [[float(a) for a in blk.attn.condinit_affine.alpha_ma] for blk in model.transformer.h]
    return rec


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=float)
    os.replace(tmp, path)


def machine_info() -> dict:
    import platform

    import transformers

    info = dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), platform=platform.platform())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["loadavg_1m"] = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        pass
    return info
