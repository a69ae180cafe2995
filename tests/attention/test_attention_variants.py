"""Attention variants as HF attention implementations: fast paths against the naive N×N references.

Families: GPT-2 (causal, fused Conv1D), BERT (bidirectional, padding), Llama (GQA 4 query / 2 KV heads, rotary).
Every comparison switches the *same* model between the fast path and the reference
(``model.config._attn_implementation``), with non-trivial holder values (random W_a, α_ma, sink logits), left and
right padding, and gradients of every parameter. The references live in each variant's folder
(``hf_condinit/attention/<variant>/reference.py``), collected in `hf_condinit.attention.reference`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AttentionInterface, AutoModel, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface

import hf_condinit
import hf_condinit.attention as attention
from hf_condinit.attention.reference import randomise_holders, register_references
from hf_condinit.attention.affine_scaled import AffineScaledHolder
from hf_condinit.attention.attention_sink import AttentionSinkHolder
from hf_condinit.registry import ATTENTION_VARIANTS
from utils import mini_config

register_references()

FAMILIES = ("gpt2", "bert", "llama")
VARIANTS = ("affine_scaled", "attention_sink", "preconditioned")
NO_DROPOUT = {
    "gpt2": dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
    "bert": dict(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0),
    "llama": dict(attention_dropout=0.0),
}
SEQ = 9


def build(family: str, impl: str, dtype=torch.float32, seed: int = 0, **condinit):
    torch.manual_seed(seed)
    config = mini_config(family, **NO_DROPOUT[family])
    cls = AutoModel if family == "bert" else AutoModelForCausalLM
    kwargs = {"attn_implementation": impl}
    if condinit:
        kwargs["condinit"] = {"method": "default", **condinit}
    model = cls.from_config(config, **kwargs).to(dtype)
    randomise_holders(model, seed)
    return model


def inputs(family: str, model, padded: bool, batch: int = 2, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (batch, SEQ), generator=gen)
    out = {"input_ids": ids}
    if padded:
        mask = torch.ones(batch, SEQ, dtype=torch.long)
        mask[0, :3] = 0  # left padding
        mask[1, -2:] = 0  # right padding
        out["attention_mask"] = mask
    return out


def set_impl(model, impl: str) -> None:
    model.config._attn_implementation = impl


def holder_buffers(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items() if "alpha_ma" in k}


def run(model, impl: str, batch: dict, train: bool):
    """Output, gradients of every parameter, and α_ma after one forward (+ backward when training)."""
    set_impl(model, impl)
    model.train(train)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    y = out.logits if hasattr(out, "logits") else out.last_hidden_state
    if "attention_mask" in batch:  # only real tokens enter the loss
        y = y * batch["attention_mask"][..., None].to(y.dtype)
    grads = {}
    if train:
        (y.float() * torch.linspace(-1, 1, y.shape[-1])).pow(2).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return y.detach(), grads, holder_buffers(model)


# --------------------------------------------------------------------------------------------- registration


def test_registered_everywhere():
    for name in VARIANTS:
        assert name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping, "HF would pass attention_mask=None (no padding)"
        assert name in ATTENTION_VARIANTS
    attention.register_all()  # idempotent for our own functions
    attention.register_all()


def test_register_refuses_foreign_function():
    original = AttentionInterface._global_mapping["affine_scaled"]
    AttentionInterface._global_mapping["affine_scaled"] = lambda *a, **k: None
    try:
        with pytest.raises(ValueError, match="already registered"):
            attention.register_all()
    finally:
        AttentionInterface._global_mapping["affine_scaled"] = original


def test_every_table_follows_the_one_registration():
    """`hf_condinit.attention.catalog.VARIANTS` is the one list: HF's registries, ``ATTENTION_VARIANTS``, the
    references, the options' readers, the forward options kept on reload and the holders all come from it, and each
    variant's option defaults are `CondInitConfig`'s."""
    import dataclasses

    from hf_condinit.attention.catalog import VARIANTS as CATALOG
    from hf_condinit.attention.reference import REFERENCES
    from hf_condinit.attention.spectral import SPECTRAL_OPTIONS
    from hf_condinit.config import CondInitConfig, option_readers
    from hf_condinit.hooks import FORWARD_OPTIONS

    assert [v.name for v in CATALOG] == list(VARIANTS) == list(attention.VARIANTS)
    for v in CATALOG:
        assert AttentionInterface._global_mapping[v.name] is v.forward is ATTENTION_VARIANTS[v.name]
        assert REFERENCES[f"{v.name}_reference"] is v.reference
        assert all(option_readers()[name] == ("attention", v.name) for name in v.options)
    assert FORWARD_OPTIONS == ("spectral_lambda", "spectral_mode", "affine_rho", "affine_bias_length", "precond_eps",
                               "precond_scale")
    defaults = {f.name: f.default for f in dataclasses.fields(CondInitConfig)}
    for name, default in {**SPECTRAL_OPTIONS, **{k: d for v in CATALOG for k, d in v.options.items()}}.items():
        assert defaults[name] == default, name
    held = {type(m): n.rpartition(".")[2] for variant in VARIANTS
            for n, m in build("gpt2", variant).named_modules() if isinstance(m, attention.CondInitHolder)}
    assert held == {v.holder: v.holder_name for v in CATALOG if v.holder is not None}


def test_bundled_modules_define_each_name_once():
    """A portable checkpoint's ``condinit_modeling.py`` concatenates the bundled modules into one namespace: a
    top-level name defined by two of them (``OPTIONS`` in two variants' folders) would silently shadow the first."""
    import ast
    import importlib
    import inspect

    from hf_condinit.attention.portable import bundled_modules

    owner = {}
    for module in bundled_modules():
        tree = ast.parse(inspect.getsource(importlib.import_module(module)))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
            else:
                continue
            for name in names:
                assert owner.setdefault(name, module) == module, f"{name}: {owner[name]} and {module}"


def test_holders_injected_and_named():
    model = build("llama", "affine_scaled")
    names = [n for n, _ in model.named_parameters() if "condinit" in n]
    assert names == [f"model.layers.{i}.self_attn.condinit_affine.weight" for i in range(2)]
    holder = model.model.layers[0].self_attn.condinit_affine
    assert holder.weight.shape == (4, 32)  # (H, D): nn.Linear orientation
    assert "model.layers.0.self_attn.condinit_affine.alpha_ma" in model.state_dict()
    bert = build("bert", "attention_sink")
    assert bert.encoder.layer[0].attention.self.condinit_sink.logit.shape == (4,)
    # idempotent injection: no second holder, no second hook
    n_hooks = len(model.model.layers[0].self_attn._forward_pre_hooks)
    attention.inject(model)
    assert len(model.model.layers[0].self_attn._forward_pre_hooks) == n_hooks


def test_fresh_holders_are_initialised():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="affine_scaled")
    holder = model.transformer.h[0].attn.condinit_affine
    assert torch.count_nonzero(holder.weight) == 0 and torch.count_nonzero(holder.alpha_ma) == 0
    sink = AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="attention_sink")
    assert torch.count_nonzero(sink.transformer.h[0].attn.condinit_sink.logit) == 0


# --------------------------------------------------------------------------------------------- fast == reference


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_fast_path_matches_reference_fp32(family, variant, padded):
    model = build(family, variant)
    batch = inputs(family, model, padded)
    start = holder_buffers(model)
    y_fast, g_fast, b_fast = run(model, variant, batch, train=True)
    model.load_state_dict(start, strict=False)
    y_ref, g_ref, b_ref = run(model, variant + "_reference", batch, train=True)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-5, atol=1e-5)
    assert g_fast.keys() == g_ref.keys() and len(g_fast) > 0
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_ref[name], rtol=1e-5, atol=1e-5, msg=name)
    for name in b_fast:  # α_ma updated identically (and actually updated)
        torch.testing.assert_close(b_fast[name], b_ref[name], rtol=1e-6, atol=1e-6)
        assert not torch.equal(b_fast[name], start[name])
    if variant == "affine_scaled":
        assert any("condinit_affine.weight" in n and g.abs().sum() > 0 for n, g in g_fast.items())
    if variant == "attention_sink":
        assert any("condinit_sink.logit" in n and g.abs().sum() > 0 for n, g in g_fast.items())


def test_affine_bias_length_full_matches_reference():
    model = build("bert", "affine_scaled", affine_bias_length="full")
    assert model.config.condinit["affine_bias_length"] == "full"
    batch = inputs("bert", model, padded=True)
    y_fast, _, _ = run(model, "affine_scaled", batch, train=False)
    y_ref, _, _ = run(model, "affine_scaled_reference", batch, train=False)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-5, atol=1e-5)
    model.config.condinit = {**model.config.condinit, "affine_bias_length": "visible"}
    y_vis, _, _ = run(model, "affine_scaled", batch, train=False)
    assert not torch.allclose(y_vis, y_fast, atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_kv_cache_generation_matches_reference(family, variant):
    model = build(family, variant).eval()
    batch = inputs(family, model, padded=False)
    mask = torch.ones_like(batch["input_ids"])
    mask[0, :3] = 0  # left padding, as generation requires
    results = {}
    for impl in (variant, variant + "_reference"):
        set_impl(model, impl)
        results[impl] = model.generate(
            batch["input_ids"], attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
            output_logits=True, return_dict_in_generate=True,
        )
    fast, ref = results[variant], results[variant + "_reference"]
    assert torch.equal(fast.sequences, ref.sequences)
    for a, b in zip(fast.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # cached decoding equals a full forward of the generated sequence (no cache)
    set_impl(model, variant)
    full_mask = torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() derives them from the mask
        full = model(fast.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(full[:, -2], fast.logits[-1], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------- affine specifics


def _capture_inputs(model):
    captured = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args, kw: captured.append(args[0] if args else kw["hidden_states"]),
                                    with_kwargs=True)
        for m in model.modules() if isinstance(getattr(m, "condinit_affine", None), AffineScaledHolder)
    ]
    return captured, handles


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_alpha_ma_ema_over_real_tokens_training_only(family):
    model = build(family, "affine_scaled")
    batch = inputs(family, model, padded=True)
    holders = [m for m in model.modules() if isinstance(m, AffineScaledHolder)]
    before = [h.alpha_ma.clone() for h in holders]
    captured, handles = _capture_inputs(model)
    model.train()
    with torch.no_grad():
        model(**batch)
    for h in handles:
        h.remove()
    real = batch["attention_mask"].bool()
    for holder, x, old in zip(holders, captured, before):
        a = holder.alpha(x)[real]  # (n_real, H) — padding tokens excluded
        expected = 0.9 * old + 0.1 * a.mean(0)
        torch.testing.assert_close(holder.alpha_ma, expected, rtol=1e-6, atol=1e-6)
        assert not holder.alpha_ma.requires_grad
    snapshot = [h.alpha_ma.clone() for h in holders]
    model.eval()
    model(**batch).last_hidden_state if family == "bert" else model(**batch).logits
    for holder, old in zip(holders, snapshot):
        assert torch.equal(holder.alpha_ma, old), "α_ma must not change in eval"


def test_output_attentions_returns_affine_weights():
    model = build("gpt2", "affine_scaled").eval()
    batch = inputs("gpt2", model, padded=True)
    out = model(**batch, output_attentions=True)
    assert len(out.attentions) == 2
    w = out.attentions[0]
    assert w.shape == (2, 4, SEQ, SEQ)
    alpha_ma = model.transformer.h[0].attn.condinit_affine.alpha_ma
    real = batch["attention_mask"].bool()
    # rows of [α softmax + β] sum to α·1 + (α_ma − α) = α_ma over the visible keys; future keys get exactly 0
    row_sums = w.sum(-1).transpose(1, 2)[real]  # (n_real, H)
    torch.testing.assert_close(row_sums, alpha_ma.expand_as(row_sums), rtol=1e-5, atol=1e-5)
    assert torch.all(w.triu(diagonal=1) == 0)
    fast = model(**batch).logits
    torch.testing.assert_close(out.logits, fast, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_gradient_checkpointing(family):
    batch = None
    results = []
    for checkpointing in (False, True):
        model = build(family, "affine_scaled")
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        batch = batch or inputs(family, model, padded=True)
        results.append(run(model, "affine_scaled", batch, train=True))
    (y0, g0, b0), (y1, g1, b1) = results
    torch.testing.assert_close(y0, y1, rtol=1e-6, atol=1e-6)
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=1e-5, atol=1e-6, msg=name)
    for name in b0:  # α_ma updated once per training step, not again in the recompute
        torch.testing.assert_close(b0[name], b1[name], rtol=0, atol=0)


def test_deepcopy_keeps_hooks_on_the_copy():
    model = build("gpt2", "affine_scaled").eval()
    clone = copy.deepcopy(model)
    batch = inputs("gpt2", model, padded=False)
    torch.testing.assert_close(clone(**batch).logits, model(**batch).logits)
    with torch.no_grad():
        clone.transformer.h[0].attn.condinit_affine.weight.zero_()
    assert not torch.allclose(clone(**batch).logits, model(**batch).logits)


# --------------------------------------------------------------------------------------------- low precision


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_low_precision_fully_padded_rows_finite(family, variant, dtype):
    model = build(family, variant, dtype=dtype)
    batch = inputs(family, model, padded=True)
    batch["attention_mask"][0, :6] = 0  # long left padding: fully masked query rows under the causal mask
    y, grads, _ = run(model, variant, batch, train=True)
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(g).all() for g in grads.values())
    if dtype == torch.bfloat16:
        y_ref, _, _ = run(model, variant + "_reference", batch, train=False)
        y_fast, _, _ = run(model, variant, batch, train=False)
        torch.testing.assert_close(y_fast.float(), y_ref.float(), rtol=0.05, atol=0.05)


# --------------------------------------------------------------------------------------------- neutral settings


def _force_alpha(model, value: float):
    for m in model.modules():
        if isinstance(m, AffineScaledHolder):
            m.alpha = lambda x, v=value, h=m.n_heads: torch.full((*x.shape[:-1], h), v, dtype=x.dtype)


@pytest.mark.parametrize("family", FAMILIES)
def test_neutral_affine_equals_sdpa(family):
    model = build(family, "affine_scaled").eval()
    batch = inputs(family, model, padded=True)
    _force_alpha(model, 1.0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AffineScaledHolder):
                m.alpha_ma.fill_(1.0)
    y_aff, _, _ = run(model, "affine_scaled", batch, train=False)
    y_sdpa, _, _ = run(model, "sdpa", batch, train=False)
    torch.testing.assert_close(y_aff, y_sdpa, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_neutral_sink_equals_sdpa(family):
    model = build(family, "attention_sink").eval()
    batch = inputs(family, model, padded=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AttentionSinkHolder):
                m.logit.fill_(-1e4)
    y_sink, _, _ = run(model, "attention_sink", batch, train=False)
    y_sdpa, _, _ = run(model, "sdpa", batch, train=False)
    torch.testing.assert_close(y_sink, y_sdpa, rtol=1e-5, atol=1e-5)


def test_preconditioned_normalises_each_head():
    model = build("llama", "preconditioned", precond_scale="sqrt_d").eval()
    seen = []
    fn = AttentionInterface._global_mapping["preconditioned"]

    def spy(*args, **kwargs):
        out, w = fn(*args, **kwargs)
        seen.append(out)
        return out, w

    AttentionInterface.register("condinit_test_precond_spy", spy)
    AttentionMaskInterface.register("condinit_test_precond_spy", AttentionMaskInterface._global_mapping["sdpa"])
    batch = inputs("llama", model, padded=False)
    run(model, "condinit_test_precond_spy", batch, train=False)
    norms = seen[0].norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, 8 ** 0.5), rtol=1e-4, atol=1e-4)


def test_missing_holder_is_a_clear_error():
    model = build("gpt2", "sdpa").eval()
    set_impl(model, "affine_scaled")
    with pytest.raises(RuntimeError, match="condinit_affine"):
        model(**inputs("gpt2", model, padded=False))


def test_no_decay_parameter_names():
    model = build("llama", "affine_scaled")
    names = hf_condinit.no_decay_parameter_names(model)
    assert names == [f"model.layers.{i}.self_attn.condinit_affine.weight" for i in range(2)]
    assert attention.no_decay_parameter_names(model, include_matrices=False) == []
    sink = build("gpt2", "attention_sink")
    assert attention.no_decay_parameter_names(sink) == [f"transformer.h.{i}.attn.condinit_sink.logit" for i in range(2)]
    # vectors=True: nanoGPT's rule too, every parameter of fewer than 2 dimensions; the scripts' trainer decays the rest
    rule = [n for n, p in sink.named_parameters() if p.ndim < 2 or "condinit_" in n]
    assert attention.no_decay_parameter_names(sink, vectors=True) == rule and len(rule) > 2
    from hf_condinit.scripts_common import CondInitTrainer

    decayed = CondInitTrainer.get_decay_parameter_names(None, sink)
    assert decayed == [n for n, _ in sink.named_parameters() if n not in rule] and decayed
