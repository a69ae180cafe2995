"""Spectral conditioning (docs/methods.md §3): C = λ·E as a buffer, W_eff = W + C in the forward pass only.

The expected C of each layout is written out here by hand in *storage* orientation (independent of the layout's
``Projection.heads`` code): GPT-2 ``Conv1D`` (in, out) with ``[Q | K | V]``, BERT/Llama ``nn.Linear`` (out, in) with
GQA, and GPT-NeoX's per-head interleaved ``[q_h; k_h; v_h]`` rows.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

import hf_condinit
from hf_condinit.attention import merge_spectral, remove_spectral
from hf_condinit.layouts import get_layout
from hf_condinit.attention.spectral import SpectralHolder
from utils import mini_config

LAM = 2.5
D, H, d = 32, 4, 8


def _build(family, **condinit):
    torch.manual_seed(0)
    cls = AutoModel if family == "bert" else AutoModelForCausalLM
    kwargs = {"condinit": {"method": "default", **condinit}} if condinit else {}
    return cls.from_config(mini_config(family), **kwargs)


def _ids(model):
    return torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))


def _out(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def test_gpt2_fused_conv1d_C():
    model = hf_condinit.apply_spectral_conditioning(_build("gpt2"), lam=LAM)
    holder = model.transformer.h[0].attn.condinit_spectral_qkv
    eye = torch.eye(D)
    torch.testing.assert_close(holder.C, LAM * torch.cat([eye, eye, eye], dim=1), rtol=0, atol=0)


def test_bert_separate_linear_C():
    model = _build("bert", spectral_lambda=LAM)
    core = model.encoder.layer[1].attention.self
    for role in ("q", "k", "v"):
        torch.testing.assert_close(getattr(core, f"condinit_spectral_{role}").C, LAM * torch.eye(D), rtol=0, atol=0)


def test_llama_gqa_C():
    model = _build("llama", spectral_lambda=LAM)
    attn = model.model.layers[0].self_attn
    torch.testing.assert_close(attn.condinit_spectral_q.C, LAM * torch.eye(D), rtol=0, atol=0)
    n_kv = model.config.num_key_value_heads
    for role in ("k", "v"):  # (n_kv·d, D): the first n_kv·d coordinates
        torch.testing.assert_close(getattr(attn, f"condinit_spectral_{role}").C, LAM * torch.eye(n_kv * d, D),
                                   rtol=0, atol=0)


def test_neox_interleaved_C():
    model = _build("gpt_neox", spectral_lambda=LAM)
    C = model.gpt_neox.layers[0].attention.condinit_spectral_qkv.C  # (3·H·d, D), rows [q_h; k_h; v_h]
    expected = torch.zeros(3 * H * d, D)
    for h in range(H):
        for part in range(3):
            for r in range(d):
                expected[h * 3 * d + part * d + r, h * d + r] = LAM
    torch.testing.assert_close(C, expected, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "gpt_neox"])
def test_forward_equals_merged_weights_and_gradients_on_W(family):
    model = _build(family, spectral_lambda=LAM).eval()  # eval: no dropout; gradients still flow
    ids = _ids(model)
    merged = merge_spectral(copy.deepcopy(model))
    assert not any(isinstance(m, SpectralHolder) for m in merged.modules())
    assert merged.config.condinit["spectral_lambda"] is None
    y, y_merged = _out(model, ids), _out(merged, ids)
    torch.testing.assert_close(y, y_merged, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, _out(remove_spectral(copy.deepcopy(model)), ids), atol=1e-3)
    y.pow(2).sum().backward()
    y_merged.pow(2).sum().backward()
    grads = dict(merged.named_parameters())
    for name, p in model.named_parameters():  # dL/dW = dL/dW_eff
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-4)


def test_C_is_a_fixed_buffer_and_weight_decay_touches_W_only():
    model = _build("llama", spectral_lambda=LAM)
    holders = [m for m in model.modules() if isinstance(m, SpectralHolder)]
    assert len(holders) == 2 * 3
    param_ids = {id(p) for p in model.parameters()}
    assert all(id(h.C) not in param_ids and not h.C.requires_grad for h in holders)
    state = model.state_dict()
    assert "model.layers.0.self_attn.q_proj.weight" in state
    assert "model.layers.0.self_attn.condinit_spectral_q.C" in state
    w = model.model.layers[0].self_attn.q_proj.weight
    w_before, c_before = w.detach().clone(), holders[0].C.clone()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(w.detach(), w_before * (1 - 0.1 * 0.5))
    assert torch.equal(holders[0].C, c_before)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
def test_lambda_zero_equals_vanilla(family):
    vanilla = _build(family).eval()
    spectral = hf_condinit.apply_spectral_conditioning(copy.deepcopy(vanilla), lam=0.0).eval()
    ids = _ids(vanilla)
    assert torch.equal(_out(vanilla, ids), _out(spectral, ids))


def _head_condition_numbers(model):
    layout = get_layout(model)
    kappas = []
    for _, block in layout.attention_modules(model):
        core = layout.core_module(block)
        projs = layout.projections(block, layout.geometry(block, model.config))
        holders = {h.roles: h for h in core.children() if isinstance(h, SpectralHolder)}
        for role in ("q", "k", "v"):
            holder = next(h for r, h in holders.items() if role in r)
            for w, c in zip(projs[role].heads(projs[role].weight.detach()), projs[role].heads(holder.C)):
                s = torch.linalg.svdvals((w + c).double())
                kappas.append((s.max() / s.min()).item())
    return kappas


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_svd_mode_bounds_condition_number(family):
    model = hf_condinit.apply_spectral_conditioning(_build(family), lam=1.0, mode="svd")
    kappas = _head_condition_numbers(model)
    assert max(kappas) <= 2.0 + 1e-6
    remove_spectral(model)
    assert not any(isinstance(m, SpectralHolder) for m in model.modules())


def test_svd_mode_from_config_uses_weights_after_the_init_scheme():
    """C must be computed after the conditioned scheme rewrote q/k/v (hooks → on_block_initialized)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        mini_config("llama"), condinit={"method": "conditioned", "spectral_lambda": 1.0, "spectral_mode": "svd"}
    )
    assert max(_head_condition_numbers(model)) <= 2.0 + 1e-6
    for holder in (m for m in model.modules() if isinstance(m, SpectralHolder)):
        torch.testing.assert_close(holder.C, holder.compute_C(), rtol=1e-6, atol=1e-6)  # from the final weights


def test_apply_twice_replaces_lambda_without_duplicate_hooks():
    model = _build("gpt2").eval()
    ids = _ids(model)
    hf_condinit.apply_spectral_conditioning(model, lam=1.0)
    once = _out(model, ids)
    hf_condinit.apply_spectral_conditioning(model, lam=3.0)
    hf_condinit.apply_spectral_conditioning(model, lam=1.0)
    assert len(model.transformer.h[0].attn.c_attn._forward_hooks) == 1
    torch.testing.assert_close(_out(model, ids), once)


def test_spectral_E_is_the_conditioned_value_identity_when_heads_overflow_the_width():
    """H·d > D: conditioned W_V wraps modulo D, and spectral E is the very same block identity (docs/methods.md §1)."""
    config = mini_config("llama", num_key_value_heads=4, head_dim=16)  # 4 heads × 16 = 64 > D = 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, condinit={"method": "conditioned", "seed": 0, "spectral_lambda": 2.0}
    )
    attn = model.model.layers[0].self_attn
    D, d = 32, 16
    for role, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj)):
        C = getattr(attn, f"condinit_spectral_{role}").C
        for h in range(4):
            block = C[h * d : (h + 1) * d].T  # nn.Linear stores (out, in): head h in math orientation (D, d)
            expected = torch.zeros(D, d)
            for i in range(d):
                expected[(h * d + i) % D, i] = 2.0
            assert torch.equal(block, expected), (role, h)
    torch.testing.assert_close(attn.condinit_spectral_v.C / 2.0, attn.v_proj.weight, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("mode", ["identity", "svd"])
def test_bf16_projections_match_fp32_and_a_planted_error_fails(family, mode):
    """docs/methods.md §3, bf16: each spectral projection of the bf16 model computes x·W + b + x·C in fp32 from its own
    bf16 input and rounds once; against the fp32 model on the same input it is within PROJECTION_TOL (2⁻⁷). C off by
    2 % in the bf16 model fails."""
    from hf_condinit.attention.spectral import PROJECTION_TOL, low_precision_error

    model = _build(family, spectral_lambda=10.0, spectral_mode=mode).eval()
    ids = _ids(model)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    errors = low_precision_error(model, copy.deepcopy(model).to(torch.bfloat16), inputs)
    assert len(errors["projections"]) == len(hf_condinit.attention.spectral.spectral_holders(model)) > 0
    assert max(errors["projections"].values()) <= PROJECTION_TOL, errors
    planted = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        for _, holder in hf_condinit.attention.spectral.spectral_holders(planted):
            holder.C.mul_(1.02)
    assert max(low_precision_error(model, planted, inputs)["projections"].values()) > PROJECTION_TOL


def test_spectral_term_is_fp32_under_autocast():
    """Under bf16 autocast the projection itself runs in bf16, but x·C is added in fp32 (autocast off in the hook)."""
    model = _build("gpt2", spectral_lambda=10.0).eval()
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn.c_attn(x)
    plain = torch.addmm(attn.c_attn.bias.bfloat16().float(), x.bfloat16().float().view(-1, D),
                        attn.c_attn.weight.bfloat16().float()).view(2, 5, -1)
    expected = (plain.bfloat16().float() + x @ attn.condinit_spectral_qkv.C).bfloat16()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
