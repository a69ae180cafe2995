"""Init schemes on every layout, fp32 and bf16, against independent references.

Tolerances: fp32 ‖WᵀW − I‖_max ≤ 1e-5; bf16 ≤ 2e-2 (bf16 keeps 8 mantissa bits: entries of a D=32 semi-orthogonal
block carry ~2⁻⁹ relative error, summed over D terms in WᵀW).
"""

import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    GPT2LMHeadModel,
)

import hf_condinit
from hf_condinit.init.functional import mimetic_target
from hf_condinit.layouts import get_layout
from utils import MINI_CONFIGS, mini_config

DTYPES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SEED_STRIDE = 1_000_003  # documented in hf_condinit.api


def build(model_type, condinit=None, dtype=torch.float32, global_seed=0, **kw):
    torch.manual_seed(global_seed)
    kwargs = {"dtype": dtype, **kw}
    if condinit is not None:
        kwargs["condinit"] = condinit
    return AutoModel.from_config(mini_config(model_type), **kwargs)


def qkv_param_names(model):
    layout = get_layout(model)
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = set()
    for _, block in layout.attention_modules(model):
        for role, proj in layout.projections(block).items():
            if role != "o":
                names |= {by_id[id(t)] for t in (proj.weight, proj.bias) if t is not None}
    return names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model_type", sorted(MINI_CONFIGS))
def test_conditioned_properties(model_type, dtype):
    tol = DTYPES[dtype]
    model = build(model_type, {"method": "conditioned", "seed": 0}, dtype)
    layout = get_layout(model)
    for _, block in layout.attention_modules(model):
        projs = layout.projections(block)
        for role in ("q", "k"):
            heads = projs[role].heads(projs[role].weight)
            for w in heads:
                assert w.dtype == dtype
                gram = w.float().T @ w.float()
                assert (gram - torch.eye(w.shape[1])).abs().max() <= tol
            # fresh draws: no two heads equal
            assert not torch.equal(heads[0], heads[-1]) or len(heads) == 1
        d = projs["v"].head_dim
        for j, w in enumerate(projs["v"].heads(projs["v"].weight)):
            expected = torch.zeros_like(w)
            expected[j * d + torch.arange(d), torch.arange(d)] = 1
            assert torch.equal(w, expected), f"V head {j} is not the block identity"
        for role in ("q", "k", "v"):
            if projs[role].bias is not None:
                assert torch.count_nonzero(projs[role].bias) == 0
    # every other parameter is exactly the default init for the same global seed
    default = build(model_type, None, dtype)
    touched = qkv_param_names(model)
    assert touched
    ours, ref = dict(model.named_parameters()), dict(default.named_parameters())
    for name, p in ref.items():
        if name in touched:
            continue
        assert torch.equal(ours[name], p), f"{name} differs from the default init"
    assert any(not torch.equal(ours[n], ref[n]) for n in touched)


def _per_head_reference(model, seed: int, qk_gain: float = 1.0) -> list[list[torch.Tensor]]:
    """Today's per-head path, redone independently: per block, from the block's generator, one randn(D, d) per Q
    head then per K head, each factorised on its own: gain · U Vᵀ of its thin SVD (fp32)."""
    layout = get_layout(model)
    out = []
    for ordinal, (_, block) in enumerate(layout.attention_modules(model)):
        projs = layout.projections(block, layout.geometry(block, model.config))
        gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
        heads = []
        for role in ("q", "k"):
            for view in projs[role].heads(projs[role].weight):
                u, _, vh = torch.linalg.svd(torch.randn(*view.shape, generator=gen), full_matrices=False)
                heads.append(qk_gain * (u @ vh))
        out.append(heads)
    return out


def _qk_heads(model) -> list[list[torch.Tensor]]:
    layout = get_layout(model)
    return [[w.detach() for role in ("q", "k") for w in layout.projections(block)[role].heads(
        layout.projections(block)[role].weight)] for _, block in layout.attention_modules(model)]


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "bert"])
def test_conditioned_batched_equals_the_per_head_path(model_type):
    """On the CPU the batched factorisation (one SVD call per block) writes today's per-head weights, bit for bit."""
    model = build(model_type, {"method": "conditioned", "seed": 5, "qk_gain": 0.5})
    for got_block, want_block in zip(_qk_heads(model), _per_head_reference(model, 5, 0.5)):
        assert len(got_block) == len(want_block)
        for got, want in zip(got_block, want_block):
            assert torch.equal(got, want)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_conditioned_accelerator_path(model_type, monkeypatch):
    """The path a model built on an accelerator takes (the Newton–Schulz polar factor in float64, run here on the
    CPU): semi-orthogonal heads (fp32 ‖WᵀW − I‖ ≤ 1e-6), the same weights as the per-head path up to fp32
    rounding (≤ 1e-6), the V block identity, zero biases."""
    from hf_condinit.init import functional

    monkeypatch.setattr(functional, "_accelerated", lambda device: True)
    model = build(model_type, {"method": "conditioned", "seed": 5})
    for got_block, want_block in zip(_qk_heads(model), _per_head_reference(model, 5)):
        for got, want in zip(got_block, want_block):
            assert float(functional.semi_orthogonality_error(got.double())) <= 1e-6
            assert float((got - want).abs().max()) <= 1e-6
    layout = get_layout(model)
    for _, block in layout.attention_modules(model):
        projs = layout.projections(block)
        d = projs["v"].head_dim
        for j, w in enumerate(projs["v"].heads(projs["v"].weight)):
            expected = torch.zeros_like(w)
            expected[j * d + torch.arange(d), torch.arange(d)] = 1
            assert torch.equal(w, expected)
        for role in ("q", "k", "v"):
            if projs[role].bias is not None:
                assert torch.count_nonzero(projs[role].bias) == 0


def test_polar_factor_against_the_svd():
    """`_polar_newton` (float64) = U Vᵀ of a thin SVD: tall, wide, square ill-conditioned; a rank-deficient draw
    (no unique polar factor) falls back to the SVD and is still semi-orthogonal."""
    from hf_condinit.init.functional import _polar_newton, semi_orthogonality_error

    gen = torch.Generator().manual_seed(0)
    for shape in [(6, 96, 16), (3, 8, 40), (4, 48, 48)]:
        a = torch.randn(*shape, generator=gen, dtype=torch.float64)
        u, _, vh = torch.linalg.svd(a, full_matrices=False)
        torch.testing.assert_close(_polar_newton(a), u @ vh, atol=1e-9, rtol=0)
    a = torch.randn(2, 32, 8, generator=gen, dtype=torch.float64)
    a[:, :, 1] = a[:, :, 0]  # rank 7
    q = _polar_newton(a)
    assert all(float(semi_orthogonality_error(w)) <= 1e-10 for w in q)


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "gpt_neox"])
def test_value_init_per_head_and_gains(model_type):
    model = build(model_type, {"method": "conditioned", "seed": 1, "value_init": "per_head", "qk_gain": 0.5,
                               "v_gain": 0.25})
    layout = get_layout(model)
    _, block = layout.attention_modules(model)[0]
    projs = layout.projections(block)
    d = projs["v"].head_dim
    for w in projs["v"].heads(projs["v"].weight):
        expected = torch.zeros_like(w)
        expected[torch.arange(d), torch.arange(d)] = 0.25
        assert torch.equal(w, expected)
    w = projs["q"].heads(projs["q"].weight)[0]
    torch.testing.assert_close(w.T @ w, 0.25 * torch.eye(d), atol=1e-5, rtol=0)


def _eckart_young_excess(a: torch.Tensor, product: torch.Tensor, rank: int) -> float:
    """‖A − P‖_F / ‖A − A_r‖_F − 1, float64, the optimum from a full float64 SVD's singular values."""
    a = a.double()
    optimum = torch.linalg.svdvals(a)[rank:].square().sum().sqrt()
    return float((a - product).norm() / optimum - 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model_type", sorted(MINI_CONFIGS))
def test_mimetic_products_match_svd_targets(model_type, dtype):
    """Each KV group's first W_Q W_Kᵀ and Σ_h W_V W_O within 1e-4 (bf16 weights: 1e-3) relative of the Eckart–Young
    optimum (the rounding of a factor is second order there: A − A_r is orthogonal to A_r's row and column
    spaces); when the rank reaches D, L R = A to 1e-4 relative (bf16: 2e-2, first order: 2·2⁻⁹ per factor);
    every head the least-squares fit to the shared W_K."""
    seed = 3
    opts = {"method": "mimetic", "seed": seed}
    model = build(model_type, opts, dtype)
    cfg = hf_condinit.CondInitConfig(**opts)
    layout = get_layout(model)
    tol = 1e-4 if dtype == torch.float32 else 6e-2
    excess_tol, full_tol = (1e-4, 1e-4) if dtype == torch.float32 else (1e-3, 2e-2)
    for ordinal, (_, block) in enumerate(layout.attention_modules(model)):
        g = layout.geometry(block, model.config)
        projs = layout.projections(block, g)
        gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
        qk = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
              for _ in range(g.n_heads)]
        vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, -1, cfg.mimetic_dist, gen)
        group = g.n_heads // g.n_kv_heads
        q_heads = projs["q"].heads(projs["q"].weight.detach())
        k_heads = projs["k"].heads(projs["k"].weight.detach())
        for h in range(0, g.n_heads, group):
            product = q_heads[h].double() @ k_heads[h // group].double().T
            assert _eckart_young_excess(qk[h], product, g.head_dim) <= excess_tol, (ordinal, h)
        for h in range(g.n_heads):  # GQA: every query head is the least-squares fit of its target to the shared W_K
            w_k = k_heads[h // group].double()
            w_q = q_heads[h].double()
            expected = torch.linalg.lstsq(w_k, qk[h].double().T).solution.T  # min ‖W_K W_Qᵀ − T_hᵀ‖
            torch.testing.assert_close(w_q, expected, rtol=0, atol=tol)
            # so every head carries the β1·I term: trace(W_Q^h W_Kᵀ) ≈ β1·d + α1·tr(Z Π) > β1·d / 2
            assert float(torch.trace(w_q @ w_k.T)) > cfg.mimetic_beta1 * g.head_dim / 2, h
        v_heads = projs["v"].heads(projs["v"].weight.detach())
        o_heads = projs["o"].heads(projs["o"].weight.detach())
        vo_product = sum(v_heads[h // group].double() @ o_heads[h].double() for h in range(g.n_heads))
        rank = g.n_kv_heads * g.head_dim
        if rank < g.hidden:
            assert _eckart_young_excess(vo, vo_product, rank) <= excess_tol, ordinal
        else:
            assert float((vo_product - vo.double()).norm() / vo.double().norm()) <= full_tol, ordinal
        # the identity terms are visible in the products: trace ≈ +β1·D for QK (full rank) and −β2·D for VO
        if rank == g.hidden:
            assert float(vo_product.trace()) < 0


def test_same_seed_same_weights_across_head_classes_and_apply_init():
    config = mini_config("gpt2")
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config, condinit={"method": "conditioned", "seed": 7})
    torch.manual_seed(123)
    base = AutoModel.from_config(config, condinit={"method": "conditioned", "seed": 7})
    assert torch.equal(lm.transformer.h[1].attn.c_attn.weight, base.h[1].attn.c_attn.weight)
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_config(config)
    report = hf_condinit.apply_init(plain, "conditioned", seed=7)
    assert torch.equal(plain.transformer.h[0].attn.c_attn.weight, lm.transformer.h[0].attn.c_attn.weight)
    assert report.layout == "gpt2_fused" and len(report.layers) == 2
    assert report.layers[0]["written"] == ["q", "k", "v"] and report.layers[0]["name"] == "transformer.h.0.attn"
    assert plain.config.condinit["seed"] == 7
    other = AutoModel.from_config(config, condinit={"method": "conditioned", "seed": 8})
    assert not torch.equal(other.h[0].attn.c_attn.weight, base.h[0].attn.c_attn.weight)


def test_seed_none_records_the_global_seed():
    torch.manual_seed(42)
    model = AutoModel.from_config(mini_config("gpt2"), condinit=True)
    assert model.config.condinit["seed"] == 42
    assert model.config.condinit["method"] == "conditioned"
    assert model.config.condinit["layout"] == "gpt2_fused"
    assert model.config.condinit["hf_condinit_version"] == hf_condinit.__version__


@pytest.mark.parametrize(
    "value, method",
    [(True, "conditioned"), ("conditioned", "conditioned"), ("mimetic", "mimetic"), ("default", "default"),
     ({"method": "conditioned", "value_init": "per_head", "seed": 0}, "conditioned")],
)
def test_condinit_spellings(value, method):
    model = AutoModelForMaskedLM.from_config(mini_config("bert"), condinit=value)
    assert model.config.condinit["method"] == method


@pytest.mark.parametrize("value", [False, None])
def test_condinit_off(value):
    torch.manual_seed(0)
    off = AutoModelForSequenceClassification.from_config(mini_config("bert", num_labels=3), condinit=value)
    torch.manual_seed(0)
    plain = AutoModelForSequenceClassification.from_config(mini_config("bert", num_labels=3))
    assert getattr(off.config, "condinit", None) is None
    for (n, a), b in zip(off.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), n


def test_default_method_leaves_weights_untouched():
    torch.manual_seed(0)
    ours = AutoModel.from_config(mini_config("llama"), condinit="default")
    torch.manual_seed(0)
    plain = AutoModel.from_config(mini_config("llama"))
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), plain.parameters()))


def test_concrete_class_from_config_and_user_config_not_mutated():
    config = mini_config("gpt2")
    model = GPT2LMHeadModel._from_config(config, condinit="mimetic")
    assert model.config.condinit["method"] == "mimetic"
    assert getattr(config, "condinit", None) is None
    again = GPT2LMHeadModel._from_config(config)
    assert getattr(again.config, "condinit", None) is None


@pytest.mark.parametrize(
    "value, pattern",
    [("orthogonalish", r"Unknown condinit method 'orthogonalish'; accepted: 'default', 'mimetic', 'conditioned'"),
     ({"method": "conditioned", "qk_scale": 2.0}, r"Unknown condinit option\(s\) \['qk_scale'\]. Accepted options"),
     ({"method": "conditioned", "value_init": "diag"}, r"value_init 'diag'; accepted: 'block', 'per_head'"),
     (3.5, r"condinit must be True/False/None"),
     ({"method": "conditioned", "qk_gain": float("nan")}, r"qk_gain must be a finite number, got nan"),
     ({"method": "mimetic", "mimetic_beta1": float("inf")}, r"mimetic_beta1 must be a finite number, got inf"),
     ({"method": "default", "spectral_lambda": float("nan")}, r"spectral_lambda must be a finite number"),
     ({"method": "default", "affine_rho": float("nan")}, r"affine_rho must be a finite number"),
     ({"method": "default", "precond_eps": float("-inf")}, r"precond_eps must be a finite number"),
     ({"method": "conditioned", "v_gain": "2"}, r"v_gain must be a finite number, got '2'")],
)
def test_bad_condinit_values(value, pattern):
    with pytest.raises(ValueError, match=pattern):
        AutoModel.from_config(mini_config("gpt2"), condinit=value)
    with pytest.raises(ValueError, match=pattern):
        hf_condinit.apply_init(AutoModel.from_config(mini_config("gpt2")), value)


def test_from_config_refuses_options_the_recipe_never_reads():
    """At the library level: a user's condinit dict with an option its method (or attention) ignores is an
    error naming the option, not a silently recorded no-op; the same options are accepted where they are read."""
    cfg = mini_config("gpt2")
    with pytest.raises(ValueError, match="value_init is read by method 'conditioned' only"):
        AutoModelForCausalLM.from_config(cfg, condinit={"method": "mimetic", "value_init": "per_head"})
    with pytest.raises(ValueError, match="affine_rho is read by attention 'affine_scaled' only"):
        AutoModelForCausalLM.from_config(cfg, condinit={"method": "default", "affine_rho": 0.5},
                                         attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "default", "affine_rho": 0.5},
                                             attn_implementation="affine_scaled")
    assert model.config.condinit["affine_rho"] == 0.5
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "orthogonal", "value_init": "per_head"})
    assert model.config.condinit["method"] == "conditioned" and model.config.condinit["value_init"] == "per_head"
