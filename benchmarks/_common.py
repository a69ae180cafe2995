"""Shared pieces of the benchmarks (``compare.py``, ``throughput.py``): data, arms, model building, step-0
diagnostics, claims on records, provenance. One training run through the Hugging Face ``Trainer`` is ``_lm_run``'s,
the zero-shot evaluations recorded with it (BLiMP, the held-out cloze) ``_lm_zero_shot``'s.

A run is what a user gets from ``run_clm.py``: ``GPT2LMHeadModel`` built with
``AutoModelForCausalLM.from_config(cfg, condinit=..., attn_implementation=...)`` after ``import hf_condinit``,
trained by ``hf_condinit.scripts_common.CondInitTrainer`` with the docs/methods.md §7 LM recipe
(``scripts_common.LM_TRAINING_DEFAULTS``: AdamW β = (0.9, 0.95), ε = 1e-8, weight decay 0.1 on every ≥ 2-D weight
except ``condinit_`` holders, HF ``cosine`` schedule with 5 % linear warmup, gradient clipping 1.0; fp32 on CPU),
saved and evaluated by ``scripts_common.train_and_save`` / ``evaluate_with_perplexity``, κ(J) logged by
``hf_condinit.callbacks.ConditionNumberCallback``. Each run's output folder is a normal Trainer output folder
(``config.json`` with ``condinit``, ``model.safetensors``, ``trainer_state.json``, ``train_results.json``,
``eval_results.json``, ``condition_number.jsonl``); ``_lm_run.summarize_trainer_run`` reads one back.

Data (library helpers, ``hf_condinit.data``): the documents of the ``--data`` files in a fixed order
(``read_documents``), the first 5 % of them held out (``documents_dataset``), a byte-level BPE trained on the training
documents only (``train_bpe_tokenizer``), EOS after every document (``tokenize_datasets(append_eos=True)``), packed
into ``block_size`` blocks (``pack_datasets``). Cached per data set under ``<out>/cache``.

Same batches per arm and seed: the Trainer's sampler is seeded with ``data_seed = seed`` (accelerate's
``SeedableRandomSampler``: the order depends on the seed and the epoch only, not on the global RNG that model
building consumes); each run records the SHA-256 of the batches it trained on (``train_batches_sha256``). Model
init: ``torch.manual_seed(seed)`` before building (the default-init parameters), ``condinit={"seed": seed}`` for the
scheme's own generators.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hf_condinit import stats  # noqa: E402
from hf_condinit.stats import crossing_step  # noqa: E402,F401
from hf_condinit.locks import claimed, is_claimed  # noqa: E402,F401
from hf_condinit.study.files import write_json  # noqa: E402,F401
from hf_condinit.study.recipes import parse_recipe  # noqa: E402

#: How the committed reports (README.md's findings, docs/results.md, results.md) cite the verdict rule, which lives in
#: :mod:`hf_condinit.stats`: the name of the module that once re-exported it, kept so that the generated pages stay
#: byte-identical (``findings.py --check``); changing it rewrites those pages.
RULE_CITED = "benchmarks/_verdict.py"
flat_sentence = functools.partial(stats.flat_sentence, source=RULE_CITED)
family_caption = functools.partial(stats.family_caption, source=RULE_CITED)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data"))
_WT2 = os.path.join(SHARED_DATA, "wikitext", "wikitext-2-raw")
BLIMP_DIR = os.path.join(SHARED_DATA, "blimp")  # BLiMP minimal pairs scored after every LM run (compare.py)
# --data aliases -> files or directories (read in this order)
DATASETS: dict[str, list[str]] = {
    "tinystories": [os.path.join(SHARED_DATA, "tinystories", "TinyStories-train.sample-2MiB.txt")],
    "wikitext": [os.path.join(_WT2, "wiki.valid.raw")],
    "wikitext2-train": [os.path.join(_WT2, f"wiki.train.part{i}of3.raw") for i in (1, 2, 3)],
    "enwiki": [os.path.join(SHARED_DATA, "enwiki-2015-extract")],
    "gutenberg": [os.path.join(SHARED_DATA, "gutenberg-nltk")],
}

#: Every arm of the benchmarks: name (in records, folders and reports) -> recipe, in the study's grammar
#: (:mod:`hf_condinit.study.recipes`: ``INIT+ATTENTION[:OPTION=VALUE,...]``, what ``hf-condinit-study --arms`` takes).
RECIPES: dict[str, str] = {
    "default": "default+sdpa",
    "mimetic": "mimetic+sdpa",
    "conditioned": "conditioned+sdpa",
    "conditioned+affine_scaled": "conditioned+affine_scaled",
    "affine_scaled": "default+affine_scaled",
    "spectral": "default+sdpa:spectral_lambda=10",
    "preconditioned": "default+preconditioned",
    "attention_sink": "default+attention_sink",
    "conditioned_v0.25": "conditioned+sdpa:v_gain=0.25",
}
#: The LM suite's arms (compare.py), in report order.
ARMS = ("default", "mimetic", "conditioned", "conditioned+affine_scaled", "affine_scaled", "spectral", "preconditioned",
        "attention_sink")


TRAIN_DEVICE = "cpu"  # where the harness trains and evaluates (compare.py --device; set_device)


def set_threads(n: Optional[int]) -> None:
    if n:
        torch.set_num_threads(n)


def set_device(device: str) -> None:
    """Train and evaluate on ``device`` ("cpu" or "cuda": the Trainer's first GPU); "cuda" without one is a user
    error (exit 2). The device is not part of a run's key: a record says where it ran (``device``), and a report
    pools records of both, so a sweep compares arms on one device (pair by seed within a device)."""
    global TRAIN_DEVICE
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no GPU here; drop --device or run where torch.cuda.is_available()")
    TRAIN_DEVICE = device


def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets

        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def stable_hash(obj: Any, n: int = 12) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def resolve_data_paths(names: list[str]) -> list[str]:
    """``--data`` values: aliases of :data:`DATASETS` expanded, anything else taken as a file or directory path."""
    out: list[str] = []
    for name in names:
        out += DATASETS.get(name, [name])
    return out


# ---------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class LMData:
    """Packed blocks of the training and held-out documents, the tokenizer trained on the training documents, and
    a description (``info``: files, document / token / block counts, vocabulary size)."""

    train: Any  # datasets.Dataset, columns input_ids, labels: (block_size,) int64 each, torch format
    val: Any
    tokenizer: Any
    info: dict
    cache_path: Optional[str] = None


def _files_fingerprint(paths: list[str]) -> list:
    from hf_condinit.data.documents import expand_text_paths

    return [[os.path.abspath(p), os.path.getsize(p), int(os.path.getmtime(p))] for p in expand_text_paths(paths)]


def _tokenize_and_pack(raw, tokenizer, block_size: int):
    """Library pipeline: EOS after every document, packed into ``block_size`` blocks; keeps ``input_ids`` and
    ``labels`` (no all-ones attention mask, so the model takes its plain causal path). Returns
    ``(packed, tokens_per_split)``."""
    from hf_condinit.data import pack_datasets, tokenize_datasets

    tokenized = tokenize_datasets(raw, tokenizer, "text", append_eos=True)
    tokens = {split: sum(len(x) for x in tokenized[split]["input_ids"]) for split in tokenized}
    packed = pack_datasets(tokenized, block_size)
    packed = packed.select_columns(["input_ids", "labels"])
    return packed, tokens


def _save_atomic(build, path: str) -> None:
    """Run ``build(tmp_dir)`` and move the directory to ``path`` (a concurrent worker's copy wins)."""
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another worker finished first
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_data(paths: list[str], *, vocab_size: int, block_size: int, val_fraction: float = 0.05,
                 max_bytes: Optional[int] = None, cache_dir: Optional[str] = None) -> LMData:
    """Read the documents of ``paths`` (files or directories, in order), hold out the first ``val_fraction`` of
    them, train a byte-level BPE of ``vocab_size`` on the training documents only, tokenize and pack (module
    docstring). Cached under ``cache_dir`` as a ``datasets`` folder plus the tokenizer."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from hf_condinit.data import train_bpe_tokenizer
    from hf_condinit.data.documents import documents_dataset, read_documents

    key = stable_hash([_files_fingerprint(paths), vocab_size, block_size, val_fraction, max_bytes, 3])
    cache = os.path.join(cache_dir, f"data_{key}") if cache_dir else None
    if cache and os.path.isdir(cache):
        packed = load_from_disk(os.path.join(cache, "packed"))
        with open(os.path.join(cache, "info.json")) as f:
            info = json.load(f)
        return LMData(packed["train"].with_format("torch"), packed["validation"].with_format("torch"),
                      AutoTokenizer.from_pretrained(os.path.join(cache, "tokenizer")), info, cache)
    docs = read_documents(paths, max_bytes)
    raw = documents_dataset(docs, val_fraction)
    tok = train_bpe_tokenizer(raw["train"]["text"], vocab_size, model_max_length=block_size)
    packed, tokens = _tokenize_and_pack(raw, tok, block_size)
    if len(packed["train"]) == 0 or len(packed["validation"]) == 0:
        raise ValueError(f"not enough tokens for one block of {block_size} in the training and held-out splits")
    info = dict(paths=[os.path.abspath(p) for p in paths], files=[f[0] for f in _files_fingerprint(paths)],
                bytes=sum(len(d.encode("utf-8")) for d in docs), documents=len(docs),
                train_documents=len(raw["train"]), val_documents=len(raw["validation"]),
                train_tokens=tokens["train"], val_tokens=tokens["validation"], train_blocks=len(packed["train"]),
                val_blocks=len(packed["validation"]), block_size=block_size, vocab_size=len(tok),
                val_fraction=val_fraction, max_bytes=max_bytes)
    info["path"] = info["paths"][0] if len(paths) == 1 else " + ".join(info["paths"])
    if cache:
        os.makedirs(cache_dir, exist_ok=True)

        def build(tmp):
            packed.save_to_disk(os.path.join(tmp, "packed"))
            tok.save_pretrained(os.path.join(tmp, "tokenizer"))
            write_json(os.path.join(tmp, "info.json"), info)

        _save_atomic(build, cache)
    return LMData(packed["train"].with_format("torch"), packed["validation"].with_format("torch"), tok, info, cache)


def prepare_eval_file(path: str, data: LMData) -> tuple[Any, dict]:
    """Every document of the text file ``path``, tokenized with ``data``'s tokenizer (EOS after each document) and
    packed into ``data``'s block size: ``(dataset, info)``. Cached next to ``data``'s cache."""
    from datasets import DatasetDict, load_from_disk

    from hf_condinit.data.documents import read_documents

    block = data.info["block_size"]
    key = stable_hash([_files_fingerprint([path]), data.info, 1])
    cache = os.path.join(data.cache_path, f"eval_{key}") if data.cache_path else None
    if cache and os.path.isdir(cache):
        with open(os.path.join(cache, "info.json")) as f:
            info = json.load(f)
        return load_from_disk(os.path.join(cache, "packed")).with_format("torch"), info
    from datasets import Dataset

    docs = read_documents([path], arg_name="eval-file")
    packed, tokens = _tokenize_and_pack(DatasetDict(eval=Dataset.from_dict({"text": docs})), data.tokenizer, block)
    ds = packed["eval"]
    if len(ds) == 0:
        raise ValueError(f"--eval-file {path!r}: fewer than {block} tokens, not one block")
    info = dict(path=os.path.abspath(path), documents=len(docs), tokens=tokens["eval"], blocks=len(ds),
                evaluated_tokens=len(ds) * block)
    if cache:
        def build(tmp):
            ds.save_to_disk(os.path.join(tmp, "packed"))
            write_json(os.path.join(tmp, "info.json"), info)

        _save_atomic(build, cache)
    return ds.with_format("torch"), info


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
    """Build a ``GPT2LMHeadModel`` for ``arm`` (its recipe in ``RECIPES``) from ``config``; global RNG seeded with
    ``seed``; ``condinit_overrides``: the conditioned init's ``qk_gain`` / ``v_gain`` / ``value_init`` (a sweep's)."""
    import hf_condinit  # noqa: F401  (hooks + variants)
    from transformers import AutoModelForCausalLM

    from hf_condinit.scripts_common import with_causal_loss_type

    if arm not in RECIPES:
        raise ValueError(f"unknown arm {arm!r}; known: {list(RECIPES)}")
    recipe = parse_recipe(RECIPES[arm])
    condinit = {"method": recipe.init, "seed": int(seed), **recipe.typed_options()}
    if condinit_overrides and recipe.init == "conditioned":
        condinit.update({k: v for k, v in condinit_overrides.items() if k in ("qk_gain", "v_gain", "value_init")})
    torch.manual_seed(seed)
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), condinit=condinit,
                                             attn_implementation=recipe.attention, **kwargs)
    return with_causal_loss_type(model)


def param_counts(model) -> dict:
    """``n_params`` (every parameter once; the tied LM head is the token embedding) and ``n_params_non_embedding``
    (without the token and position embeddings: the count that scaling laws use)."""
    total = sum(p.numel() for p in model.parameters())
    emb = sum(m.weight.numel() for m in (model.transformer.wte, model.transformer.wpe))
    return dict(n_params=total, n_params_non_embedding=total - emb)


@functools.lru_cache(maxsize=None)
def non_embedding_params(*, n_layer: int, n_embd: int, n_head: int) -> int:
    """Non-embedding parameter count of the harness's GPT-2 shape (built on the meta device: no memory, no init)."""
    from transformers import GPT2LMHeadModel

    config = gpt2_config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=8, vocab_size=8)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    return param_counts(model)["n_params_non_embedding"]


def steps_for_tokens_per_param(kw: dict) -> int:
    """Optimizer steps that give ``kw["tokens_per_param"]`` training tokens per non-embedding parameter (rounded
    up) for the model shape and batch of ``kw``."""
    n = non_embedding_params(n_layer=kw["n_layer"], n_embd=kw["n_embd"], n_head=kw["n_head"])
    return max(1, math.ceil(kw["tokens_per_param"] * n / (kw["batch_size"] * kw["block_size"])))


def param_groups(model, weight_decay: float):
    """AdamW groups of the LM recipe (``throughput.py``'s hand-made optimizer): decay on ≥ 2-D weights except the
    ``condinit_`` holders, the example scripts' rule (``hf_condinit.no_decay_parameter_names(model, vectors=True)``)."""
    from hf_condinit import no_decay_parameter_names

    skip = set(no_decay_parameter_names(model, vectors=True))
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n not in skip]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and n in skip]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# resumable execution: one record per finished run, claimed with lock files (several workers may share a folder)
# ---------------------------------------------------------------------------------------------------------------


def fail(message: str):
    """A user error: one line on stderr, exit status 2."""
    print(f"compare.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def finished_record(path: str, spec) -> Optional[dict]:
    """The record ``path`` when it exists and was made with ``spec`` (same ``key()``), else None."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return rec if rec.get("key") == spec.key() else None


def claimed_elsewhere(path: str) -> bool:
    """Whether a live worker holds the run recorded in ``path`` (its claim: ``path + ".lock"``)."""
    return is_claimed(path + ".lock")


@contextlib.contextmanager
def run_slot(path: str, spec):
    """This worker's turn at the run recorded in ``path``: yields ``"finished"`` (a record made with ``spec`` exists),
    ``"locked"`` (another live worker holds its claim) or ``"claimed"`` (this worker holds it for the block). The
    claim is the library's (:func:`hf_condinit.locks.claimed` on ``path + ".lock"``): an ``flock`` that the
    kernel drops with its process, so a lock file left by a dead worker is free."""
    if finished_record(path, spec):
        yield "finished"
        return
    with claimed(path + ".lock") as fd:
        yield "locked" if fd is None else "finished" if finished_record(path, spec) else "claimed"



@contextlib.contextmanager
def exit_75_when_preempted(tag: str):
    """Around a harness run: ``TrainingPreempted`` (a signal stopped training after its checkpoint was saved) ends
    the process with one line on stderr and exit status 75, the library's "run the same command again"; the run's
    claim is released on the way out and its record is not written."""
    from hf_condinit.callbacks import PREEMPTED_EXIT_CODE, TrainingPreempted

    try:
        yield
    except TrainingPreempted as err:
        print(f"[{tag}] {err}", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT_CODE) from None


def device_name(model) -> str:
    """Where ``model`` ran: "cpu" or the GPU's name (e.g. "cuda: NVIDIA H200")."""
    dev = next(model.parameters()).device
    return f"cuda: {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type


@functools.cache
def provenance() -> dict:
    """What every new run record carries beside its ``device``: ``commit`` (``git rev-parse HEAD`` of the repo, with
    ``commit_dirty`` when tracked files differ from it; None outside a git checkout), ``command`` (this process's
    command line) and ``versions`` (python, torch, transformers, datasets, accelerate).

    Taken once per process: ``compare.py``'s ``main`` calls it first, so a record names the code its process loaded,
    not a commit made while it trained."""
    import importlib.metadata
    import platform
    import subprocess

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    # torch's own version string: its package metadata omits the build tag
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "datasets", "accelerate"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    status = git("status", "--porcelain", "--untracked-files=no")
    return dict(commit=git("rev-parse", "HEAD") or None, commit_dirty=None if status is None else bool(status),
                command=" ".join([os.path.basename(sys.executable)] + sys.argv), versions=versions)


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
