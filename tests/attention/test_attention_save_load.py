"""Saving and reloading models with attention variants and spectral conditioning.

``save_pretrained`` → ``from_pretrained`` (with no ``attn_implementation``) must rebuild the variant from the config
(``config.condinit_attention`` / ``config.condinit``) and restore W_a, α_ma, sink logits and spectral C bit-exactly;
a checkpoint without them initialises only the missing pieces; asking for another implementation than the one the
checkpoint was saved with fails loudly instead of dropping the saved parameters.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

import hf_condinit
from hf_condinit.attention.affine_scaled import AffineScaledHolder
from hf_condinit.attention.attention_sink import AttentionSinkHolder
from hf_condinit.attention.spectral import SpectralHolder
from utils import mini_config


def _cls(family):
    return AutoModel if family == "bert" else AutoModelForCausalLM


def _perturb(model, seed=0):
    """Non-default values in every holder tensor, so that a re-initialisation could not pass for a reload."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (AffineScaledHolder, AttentionSinkHolder, SpectralHolder)):
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)):
                    t.add_(torch.rand(t.shape, generator=gen))


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _ids(model):
    return torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize("variant", ["affine_scaled", "attention_sink", "preconditioned"])
def test_variant_roundtrip(tmp_path, family, variant):
    torch.manual_seed(0)
    model = _cls(family).from_config(mini_config(family), attn_implementation=variant)
    _perturb(model)
    model.save_pretrained(tmp_path)
    loaded = _cls(family).from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == variant
    _assert_same_state(model, loaded)
    if variant != "preconditioned":
        assert any("condinit_" in k for k in loaded.state_dict())
    model.eval(), loaded.eval()
    ids = _ids(model)
    out_a, out_b = model(ids), loaded(ids)
    key = "last_hidden_state" if family == "bert" else "logits"
    assert torch.equal(out_a[key], out_b[key])


def test_combined_condinit_and_variant_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        mini_config("llama"),
        condinit={"method": "conditioned", "spectral_lambda": 3.0},
        attn_implementation="affine_scaled",
    )
    names = {k for k in model.state_dict() if "condinit_" in k}
    assert any(k.endswith("condinit_affine.alpha_ma") for k in names)
    assert any(k.endswith("condinit_spectral_q.C") for k in names)
    _perturb(model)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == "affine_scaled"
    assert loaded.config.condinit["spectral_lambda"] == 3.0
    _assert_same_state(model, loaded)


@pytest.mark.parametrize("mode", ["identity", "svd"])
def test_apply_spectral_roundtrip(tmp_path, mode):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    hf_condinit.apply_spectral_conditioning(model, lam=5.0, mode=mode)
    assert model.config.condinit["spectral_lambda"] == 5.0 and model.config.condinit["spectral_mode"] == mode
    _perturb(model)  # C must come back from the checkpoint, not be recomputed
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    _assert_same_state(model, loaded)
    ids = _ids(model)
    assert torch.equal(model.eval()(ids).logits, loaded.eval()(ids).logits)


def test_alpha_ma_training_state_resumes(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="affine_scaled").train()
    ids = _ids(model)
    model(ids)  # one training forward moves α_ma away from 0
    ema = model.transformer.h[0].attn.condinit_affine.alpha_ma.clone()
    assert torch.count_nonzero(ema) > 0
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(loaded.transformer.h[0].attn.condinit_affine.alpha_ma, ema)
    loaded.train()(ids), model(ids)  # the next EMA step continues identically
    assert torch.equal(loaded.transformer.h[0].attn.condinit_affine.alpha_ma,
                       model.transformer.h[0].attn.condinit_affine.alpha_ma)


def test_vanilla_checkpoint_initialises_only_missing_holders(tmp_path):
    torch.manual_seed(0)
    vanilla = AutoModelForCausalLM.from_config(mini_config("llama"))
    vanilla.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="attention_sink")
    assert loaded.config._attn_implementation == "attention_sink"
    ref = vanilla.state_dict()
    for k, v in loaded.state_dict().items():
        if "condinit_" in k:
            assert torch.count_nonzero(v) == 0, k  # freshly initialised (sink logit 0)
        else:
            assert torch.equal(v, ref[k]), k  # loaded, untouched
    affine = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="affine_scaled")
    holder = affine.model.layers[0].self_attn.condinit_affine
    assert torch.count_nonzero(holder.weight) == 0 and torch.count_nonzero(holder.alpha_ma) == 0


def test_vanilla_checkpoint_with_spectral_config_computes_C_from_loaded_weights(tmp_path):
    torch.manual_seed(0)
    vanilla = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    vanilla.save_pretrained(tmp_path)
    config = vanilla.config
    config.condinit = {"method": "default", "spectral_lambda": 1.0, "spectral_mode": "svd"}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, config=config)
    holder = loaded.transformer.h[0].attn.condinit_spectral_qkv
    expected = holder.compute_C()  # from the loaded weights
    assert torch.count_nonzero(holder.C) > 0
    torch.testing.assert_close(holder.C, expected)
    assert torch.equal(loaded.transformer.h[0].attn.c_attn.weight, vanilla.transformer.h[0].attn.c_attn.weight)


def test_other_implementation_on_variant_checkpoint_fails_loudly(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="affine_scaled")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="affine_scaled"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")


def test_from_pretrained_condinit_keeps_the_spectral_recipe_or_refuses(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        mini_config("gpt2"), condinit={"method": "conditioned", "seed": 0, "spectral_lambda": 10.0}
    ).eval()
    model.save_pretrained(tmp_path)
    ids = _ids(model)
    expected = model(ids).logits
    kept = ({"method": "conditioned", "seed": 1}, "mimetic", True, {"method": "default", "spectral_lambda": 10.0})
    for condinit in kept:
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path, condinit=condinit).eval()
        assert loaded.config.condinit["spectral_lambda"] == 10.0, condinit
        torch.testing.assert_close(loaded(ids).logits, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"trained with condinit option spectral_lambda=10.0.*spectral_lambda=1.0"):
        AutoModelForCausalLM.from_pretrained(tmp_path, condinit={"method": "default", "spectral_lambda": 1.0})
    with pytest.raises(ValueError, match="spectral_mode"):
        AutoModelForCausalLM.from_pretrained(tmp_path, condinit={"method": "default", "spectral_mode": "svd"})
    with pytest.raises(ValueError, match="would drop the spectral conditioning"):
        AutoModelForCausalLM.from_pretrained(tmp_path, condinit=None)


def test_uninstall_unregisters_the_variants_and_install_registers_them_again():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from hf_condinit import hooks

    variants = ("affine_scaled", "attention_sink", "preconditioned")
    hooks.uninstall()  # the conftest fixture re-installs after the test
    assert not any(v in AttentionInterface._global_mapping for v in variants)
    assert not any(v in AttentionMaskInterface._global_mapping for v in variants)
    with pytest.raises(ValueError):
        AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="affine_scaled")
    hooks.install()
    assert all(v in AttentionInterface._global_mapping for v in variants)
    assert all(v in AttentionMaskInterface._global_mapping for v in variants)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"), attn_implementation="affine_scaled")
    assert model.config._attn_implementation == "affine_scaled"
