"""save_pretrained → from_pretrained keeps every tensor bit-identical; loaded weights are never re-initialised."""

import json

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

import hf_condinit
from utils import mini_config


@pytest.mark.parametrize("model_type, method", [("gpt2", "conditioned"), ("llama", "mimetic"), ("bert", "conditioned")])
def test_round_trip_is_bit_identical(tmp_path, model_type, method):
    model = AutoModel.from_config(mini_config(model_type), condinit={"method": method, "seed": 11})
    with torch.no_grad():  # make the weights differ from any init, as after training
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["condinit"]["method"] == method and saved["condinit"]["seed"] == 11
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert reloaded.config.condinit == model.config.condinit
    ref = model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, ref[name]), name


def test_from_pretrained_of_default_checkpoint_never_reinitialises(tmp_path):
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    model.save_pretrained(tmp_path)
    # a config that asks for conditioned init must not touch loaded weights
    config = json.loads((tmp_path / "config.json").read_text())
    config["condinit"] = {"method": "conditioned", "seed": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    with pytest.raises(ValueError, match="loaded from a checkpoint"):
        hf_condinit.apply_init(reloaded, "conditioned", seed=0)
    report = hf_condinit.apply_init(reloaded, "conditioned", seed=0, overwrite_loaded=True)
    assert report.layers[0]["written"] == ["q", "k", "v"]


def test_missing_attention_keys_get_the_scheme_and_loaded_ones_stay(tmp_path):
    """A checkpoint without layer 1's c_attn: only that tensor is initialised, with the recorded scheme."""
    from safetensors.torch import load_file, save_file

    model = AutoModelForCausalLM.from_config(mini_config("gpt2"), condinit={"method": "conditioned", "seed": 5})
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.bias.fill_(0.5)  # a loaded bias must survive the re-init of its weight
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["transformer.h.1.attn.c_attn.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
