"""``CondInitConfig.generator``: where each attention block's generator lives (docs/methods.md §1, ``generator``).

``"cpu"`` (the default) must keep today's weights: checked against a reference redrawn independently from a CPU
generator seeded ``seed · 1 000 003 + block`` and factorised per head. ``"device"`` puts the generator on the device
the weights are built on; on a CPU machine that device is the CPU, so the weights must equal the default mode's bit
for bit (the GPU side is measured and checked by benchmarks/gpu_check.py part e); on meta it falls back to the CPU.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, HfArgumentParser

from hf_condinit import CondInitConfig, apply_init
from hf_condinit.api import block_generator
from hf_condinit.init.functional import semi_orthogonality_error
from hf_condinit.layouts import get_layout
from hf_condinit.errors import UsageError
from hf_condinit.scripts_common import CondInitArguments
from hf_condinit.study.recipes import parse_recipe
from utils import mini_config

SEED_STRIDE = 1_000_003  # documented in hf_condinit.api


def build(family: str, **condinit):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(mini_config(family), condinit=condinit)


def _blocks(model):
    layout = get_layout(model)
    for ordinal, (_, block) in enumerate(layout.attention_modules(model)):
        yield ordinal, layout.projections(block, layout.geometry(block, model.config))


def _cpu_reference(model, seed: int) -> list[torch.Tensor]:
    """Every Q then K head of every block, redrawn from the block's CPU generator: U Vᵀ of each head's own draw."""
    out = []
    for ordinal, projs in _blocks(model):
        gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
        for role in ("q", "k"):
            for view in projs[role].heads(projs[role].weight):
                u, _, vh = torch.linalg.svd(torch.randn(*view.shape, generator=gen), full_matrices=False)
                out.append(u @ vh)
    return out


def _qk_heads(model) -> list[torch.Tensor]:
    return [w.detach() for _, projs in _blocks(model) for role in ("q", "k")
            for w in projs[role].heads(projs[role].weight)]


def _same_parameters(a, b) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[n], pb[n]) for n in pa)


@pytest.mark.parametrize("options", [{}, {"generator": "cpu"}], ids=["unset", "cpu"])
def test_default_generator_keeps_the_cpu_generator_weights(options):
    model = build("llama", method="conditioned", seed=3, **options)
    got, want = _qk_heads(model), _cpu_reference(model, 3)
    assert len(got) == len(want) > 0
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert model.config.condinit["generator"] == "cpu"


@pytest.mark.parametrize("method", ["conditioned", "mimetic"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_device_generator_on_the_cpu_is_the_cpu_generator(family, method):
    """On a CPU build the device's generator is a CPU one: the same weights as the default mode, bit for bit."""
    device = build(family, method=method, seed=7, generator="device")
    assert _same_parameters(device, build(family, method=method, seed=7))
    assert not _same_parameters(device, build(family, method=method, seed=8))  # the seed still matters
    assert device.config.condinit["generator"] == "device"


def test_device_generator_properties_and_determinism():
    first, second = (build("gpt2", method="conditioned", seed=1, generator="device") for _ in range(2))
    assert _same_parameters(first, second)
    for _, projs in _blocks(first):
        for role in ("q", "k"):
            for w in projs[role].heads(projs[role].weight):
                assert semi_orthogonality_error(w.detach().double()) <= 1e-6
        d = projs["v"].head_dim
        for j, w in enumerate(projs["v"].heads(projs["v"].weight)):
            expected = torch.zeros_like(w)
            expected[j * d + torch.arange(d), torch.arange(d)] = 1
            assert torch.equal(w, expected)


def test_block_generator_seeding_and_meta_fallback():
    cfg = CondInitConfig(seed=4, generator="device")
    want = torch.randn(5, generator=torch.Generator().manual_seed(4 * SEED_STRIDE + 2))
    for params in ([torch.empty(3, device="meta")], [torch.empty(3, device="meta"), torch.empty(3)], []):
        gen = block_generator(cfg, 2, params)
        assert gen.device.type == "cpu"
        assert torch.equal(torch.randn(5, generator=gen), want)


def test_device_generator_on_a_meta_model_falls_back():
    """`apply_init` on a meta model makes each block's generator before finding nothing to write: a meta generator
    does not exist, so it must be the CPU's."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(mini_config("gpt2"), condinit={"method": "mimetic",
                                                                                "generator": "device"})
    assert model.config.condinit["generator"] == "device"
    report = apply_init(model, "conditioned", seed=0, generator="device")
    assert [layer["written"] for layer in report.layers] == [[], []]
    assert report.options["generator"] == "device"


def test_a_bad_generator_is_one_clear_error():
    message = "Unknown condinit generator 'cuda'; accepted: 'cpu', 'device'."
    with pytest.raises(ValueError, match=message):
        CondInitConfig(generator="cuda")
    with pytest.raises(ValueError, match=message):
        build("gpt2", method="conditioned", generator="cuda")
    with pytest.raises(UsageError, match=message):
        CondInitArguments(init="conditioned", generator="cuda").condinit_dict(seed=0)


def test_generator_is_recorded_and_reaches_the_scripts(tmp_path):
    model = build("gpt2", method="conditioned", seed=2, generator="device")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["condinit"]["generator"] == "device"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.condinit["generator"] == "device" and _same_parameters(loaded, model)
    flags = parse_recipe("conditioned:generator=device").flags()  # a study arm becomes the scripts' flags
    assert flags == ["--init", "conditioned", "--generator", "device"]
    (args,) = HfArgumentParser(CondInitArguments).parse_args_into_dataclasses(flags)
    assert args.condinit_dict(seed=2) == {"method": "conditioned", "seed": 2, "generator": "device"}
