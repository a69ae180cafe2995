"""Device correctness on a CPU-only machine: default-device contexts, meta-device builds, holder device/dtype, and the
GPU-only code path of the attention sink (its padding of q/k/v to a multiple of 8).

A default-device context (``with torch.device("cuda")``, HF's ``device_map`` builds) redirects every factory call that
names no device; ``"meta"`` is the context a CPU machine can run, and it exposes the same mistakes (a draw that lands
on the wrong device, a CPU generator handed to a factory on another device).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

import hf_condinit.attention.attention_sink as sink_module
from hf_condinit import apply_init, registry
from hf_condinit.attention.reference import register_references
from hf_condinit.init.functional import mimetic_target, rect_identity_, semi_orthogonal_
from hf_condinit.attention.holder_base import CondInitHolder
from utils import mini_config

register_references()


def test_init_functions_ignore_the_default_device():
    def draw(views):
        g = torch.Generator().manual_seed(0)
        semi_orthogonal_(views[0], g)
        rect_identity_(views[1], row_offset=4)
        return [*views, mimetic_target(16, 0.7, 0.7, 1, "uniform", g), mimetic_target(16, 0.4, 0.4, -1, "normal", g)]

    expected = draw([torch.empty(16, 4), torch.empty(16, 4)])
    views = [torch.empty(16, 4), torch.empty(16, 4)]  # CPU parameters, written inside a meta default-device context
    with torch.device("meta"):
        got = draw(views)
    for a, b in zip(expected, got):
        assert b.device.type == "cpu"
        assert torch.equal(a, b)


CASES = [(impl, init, spectral) for impl in ("sdpa", "affine_scaled", "attention_sink", "preconditioned")
         for init in ("default", "conditioned", "mimetic") for spectral in (None, "identity", "svd")]


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_meta_build_creates_nothing_off_meta(family):
    """Every variant × init × spectral mode builds under ``torch.device("meta")`` with every tensor on meta."""
    cls = AutoModel if family == "bert" else AutoModelForCausalLM
    for impl, init, spectral in CASES:
        condinit = {"method": init, "seed": 0}
        if spectral:
            condinit.update(spectral_lambda=10.0, spectral_mode=spectral)
        with torch.device("meta"):
            model = cls.from_config(mini_config(family), attn_implementation=impl, condinit=condinit)
        tensors = [*model.named_parameters(), *model.named_buffers()]
        off = [name for name, t in tensors if t.device.type != "meta"]
        assert not off, (impl, init, spectral, off)
        holders = [m for m in model.modules() if isinstance(m, CondInitHolder)]
        assert bool(holders) == (impl in ("affine_scaled", "attention_sink") or spectral is not None)


def test_apply_init_on_a_meta_model_runs_no_scheme(monkeypatch):
    """Nothing can be written into meta tensors: `apply_init` must not run the scheme (draws, D×D SVDs) at all.
    (HF's own init pass already skips meta builds, so this concerns the explicit call.)"""
    def boom(*args, **kwargs):
        raise AssertionError("init scheme ran")

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    monkeypatch.setitem(registry.INIT_SCHEMES, "mimetic", boom)
    report = apply_init(model, "mimetic", seed=0)
    assert [layer["written"] for layer in report.layers] == [[], []]
    with pytest.raises(AssertionError, match="init scheme ran"):
        apply_init(AutoModelForCausalLM.from_config(mini_config("gpt2")), "mimetic", seed=0)


@pytest.mark.parametrize("impl", ["affine_scaled", "attention_sink"])
def test_holders_follow_the_weights_dtype(impl):
    model = AutoModelForCausalLM.from_config(
        mini_config("gpt2"), attn_implementation=impl, dtype=torch.bfloat16,
        condinit={"method": "conditioned", "seed": 0, "spectral_lambda": 10.0},
    )
    holders = [m for m in model.modules() if isinstance(m, CondInitHolder)]
    assert len(holders) == 4  # variant + spectral holder in each of the 2 layers
    for holder in holders:
        fp32 = {id(b) for name, b in holder.named_buffers(recurse=False) if name.startswith("alpha_ma")}
        for t in holder.condinit_tensors():
            # docs/methods.md §5: affine_scaled's α_ma EMA stays fp32 whatever the model dtype; all else follows it
            assert t.dtype == (torch.float32 if id(t) in fp32 else torch.bfloat16) and t.device.type == "cpu"


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
def test_attention_sink_gpu_padding_matches_reference(monkeypatch, padded):
    """The q/k/v padding used on GPUs (head dim 8 → 16) gives the reference's output and gradients, on CPU."""
    assert sink_module.extra_coordinates(64, torch.device("cuda")) == 8
    assert sink_module.extra_coordinates(60, torch.device("cuda")) == 4
    assert sink_module.extra_coordinates(8, torch.device("cpu")) == 1
    monkeypatch.setattr(sink_module, "extra_coordinates", lambda d, device: 8 - d % 8 if d % 8 else 8)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        mini_config("gpt2", attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0), attn_implementation="attention_sink")
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "logit"):
                m.logit.copy_(torch.randn(m.logit.shape))
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0
    results = []
    for impl in ("attention_sink", "attention_sink_reference"):
        model.config._attn_implementation = impl
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask if padded else None).logits * mask[..., None]
        logits.pow(2).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
