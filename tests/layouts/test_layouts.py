"""Layouts: every registered layout proved against the model's own forward; detection, refusals, geometry.

The reference is independent of the layout code (`hf_condinit.layouts.proof`): the model's own q/k/v/output as it
passes them to its attention function (recorded at HF's attention interface, or from the block's batched products
for models that compute attention inline) must change exactly in the head whose layout view was written.
"""

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import hf_condinit
from hf_condinit.coverage import auto_class, check_conditioned
from hf_condinit.layouts import FusedQKVLayout, HeadGeometry, LayoutError, SeparateQKVLayout, get_layout
from hf_condinit.layouts import detect
from hf_condinit.layouts.fused import fused_starts
from hf_condinit.layouts.miniature import build_miniature, miniature_inputs, shrink_config
from hf_condinit.layouts.proof import prove_layout
from hf_condinit.layouts.table import MODEL_TYPE_TO_LAYOUT
from utils import MINI_CONFIGS, example_inputs, mini_config

_MINIS = {}


def miniature(model_type):
    """(model, inputs) for a model type: the test config of MINI_CONFIGS, else its shrunk default config (cached)."""
    if model_type not in _MINIS:
        torch.manual_seed(0)
        if model_type in MINI_CONFIGS:
            config = mini_config(model_type)
            model = AutoModel.from_config(config).eval()
            inputs = example_inputs(model_type, config)
        else:
            config = AutoConfig.for_model(model_type)
            model = build_miniature(auto_class(config)._model_mapping[type(config)], config)
            inputs = miniature_inputs(model)
        _MINIS[model_type] = (model, inputs)
    return _MINIS[model_type]


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPE_TO_LAYOUT))
def test_every_registered_layout_is_proved_on_its_model(model_type):
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not a model type of the installed transformers {transformers.__version__}")
    model, inputs = miniature(model_type)
    layout = get_layout(model)
    assert layout is MODEL_TYPE_TO_LAYOUT[model_type]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    proof = prove_layout(model, layout, inputs)
    assert proof.n_blocks == 2
    if proof.via == "interface":  # variant holders attach where the model calls the attention function
        assert proof.core == layout.core
    # families whose attention is inline, or passes terms the variants lack, refuse the variants
    assert (layout.refuse_variant(model.config) is not None) == (proof.via != "interface" or bool(proof.extra))
    for n, p in model.named_parameters():  # the proof leaves the model exactly as it was
        assert torch.equal(p, before[n]), n


def test_wrong_layouts_fail_the_proof():
    model, inputs = miniature("llama")
    swapped = SeparateQKVLayout(q="q_proj", k="v_proj", v="k_proj", o="o_proj", name="kv_swapped")
    with pytest.raises(LayoutError, match="does not change the model's k head 0"):
        prove_layout(model, swapped, inputs)
    model, inputs = miniature("gpt_neox")  # per-head interleaved storage read as [Q | K | V]
    with pytest.raises(LayoutError, match="layout proof failed"):
        prove_layout(model, FusedQKVLayout("query_key_value", "dense", storage="linear", name="w"), inputs)
    model, inputs = miniature("codegen")  # CodeGen's [Q_c | V_c | K_c] chunks read as one [Q | K | V]
    with pytest.raises(LayoutError, match="layout proof failed"):
        prove_layout(model, FusedQKVLayout("qkv_proj", "out_proj", storage="linear", name="w"), inputs)


def test_fused_starts_match_hand_written_orderings():
    g = HeadGeometry(hidden=8, n_heads=4, n_kv_heads=2, head_dim=2)
    assert fused_starts(g, "concat") == {"q": (0, 2, 4, 6), "k": (8, 10), "v": (12, 14)}
    # Falcon's new decoder architecture: per KV group [q q k v]
    assert fused_starts(g, "grouped") == {"q": (0, 2, 8, 10), "k": (4, 12), "v": (6, 14)}
    h = HeadGeometry(hidden=8, n_heads=4, n_kv_heads=4, head_dim=2)
    assert fused_starts(h, "grouped") == {"q": (0, 6, 12, 18), "k": (2, 8, 14, 20), "v": (4, 10, 16, 22)}
    # CodeGen, 2 chunks: [q0 q1 v0 v1 k0 k1 | q2 q3 v2 v3 k2 k3]
    assert fused_starts(h, "concat", "qvk", 2) == {"q": (0, 2, 12, 14), "v": (4, 6, 16, 18), "k": (8, 10, 20, 22)}


@pytest.mark.parametrize("model_type", ["gpt2", "bert", "llama", "gpt_neox"])
def test_views_alias_the_parameters(model_type):
    model = AutoModel.from_config(mini_config(model_type))
    layout = get_layout(model)
    _, block = layout.attention_modules(model)[1]
    for role, proj in layout.projections(block).items():
        before = proj.weight.detach().clone()
        with torch.no_grad():
            proj.heads(proj.weight)[-1].fill_(7.0)
        changed = (proj.weight.detach() != before).sum().item()
        assert changed == proj.head_dim * proj.weight.shape[1 - proj.head_axis], role
        with torch.no_grad():
            proj.weight.copy_(before)


def test_unregistered_type_gets_a_detected_proved_layout_and_variants_are_refused_with_the_reason():
    assert "t5" not in MODEL_TYPE_TO_LAYOUT
    small = shrink_config(AutoConfig.for_model("t5"))
    model = AutoModel.from_config(small, condinit={"method": "conditioned", "seed": 0})
    layout = get_layout(model)
    assert layout.paths == {"q": "q", "k": "k", "v": "v", "o": "o"}
    assert check_conditioned(model) == 6  # encoder self, decoder self and cross attention
    # T5 passes its relative position bias to HF's attention interface (transformers 5.25), or computes attention
    # inline (5.17): the refusal names what the proof recorded on the installed version
    mini = build_miniature(AutoModel._model_mapping[type(small)], small)
    via = prove_layout(mini, layout, miniature_inputs(mini)).via
    reason = "position_bias" if via == "interface" else "computed inline"
    assert reason in layout.refuse_variant(small)
    with pytest.raises(LayoutError, match=rf"attn_implementation='attention_sink' is not available.*{reason}"):
        AutoModel.from_config(small, attn_implementation="attention_sink")


@pytest.mark.parametrize("model_type, reason", [("mamba", "no softmax attention"),
                                                ("deepseek_v3", "multi-head latent attention")])
def test_refused_types_say_why_before_any_weight_is_written(model_type, reason):
    from transformers import AutoModelForCausalLM

    small = shrink_config(AutoConfig.for_model(model_type))
    with pytest.raises(LayoutError, match=rf"(?s)model_type='{model_type}'.*{reason}"):
        AutoModelForCausalLM.from_config(small, condinit=True)


def test_unprovable_layout_is_refused_naming_type_and_registration(monkeypatch):
    model, inputs = miniature("llama")
    wrong = SeparateQKVLayout(q="q_proj", k="v_proj", v="k_proj", o="o_proj", name="kv_swapped")
    monkeypatch.setattr(detect, "candidate_layouts", lambda m: [wrong])
    with pytest.raises(LayoutError, match=r"(?s)could not prove.*model_type='llama'.*kv_swapped.*register_layout"):
        detect.detect_layout(model, inputs)


def test_geometry_is_read_from_the_attention_module():
    model = AutoModel.from_config(mini_config("llama"))
    layout = get_layout(model)
    _, block = layout.attention_modules(model)[0]
    g = layout.geometry(block, model.config)
    assert (g.hidden, g.n_heads, g.n_kv_heads, g.head_dim) == (32, 4, 2, 8)
    block.head_dim = 4  # the module's own value wins over the config's, and is checked against the weights
    with pytest.raises(LayoutError, match="does not hold 4 heads of dimension 4"):
        layout.geometry(block, model.config)
    gpt2 = AutoModel.from_config(mini_config("gpt2"))
    _, gblock = get_layout(gpt2).attention_modules(gpt2)[0]
    gblock.num_heads, gblock.head_dim = 5, None
    with pytest.raises(LayoutError, match="not divisible by 5 heads"):
        get_layout(gpt2).geometry(gblock, gpt2.config)


def test_register_layout_refuses_silent_overwrite():
    with pytest.raises(ValueError, match="already registered"):
        hf_condinit.register_layout("gpt2", MODEL_TYPE_TO_LAYOUT["bert"])


@pytest.mark.parametrize("flags", [dict(new_decoder_architecture=True, num_kv_heads=2),
                                   dict(multi_query=False), dict(alibi=True)], ids=str)
def test_falcon_layout_follows_each_blocks_flags(flags):
    from transformers import FalconConfig, FalconModel

    model = build_miniature(FalconModel, FalconConfig(**flags))
    layout = get_layout(model)
    proof = prove_layout(model, layout, miniature_inputs(model))
    assert proof.n_blocks == 2
    # Falcon calls HF's attention interface in transformers 5.25 and computes attention inline in 5.17
    assert proof.via == "interface" or layout.refuse_variant(model.config) is not None


@pytest.mark.parametrize("model_type", ["gptj", "codegen", "falcon", "llama"])
def test_variants_follow_the_installed_models_attention_route(model_type):
    """Whether a family takes the variants is read from the installed transformers (the proof's recording), not a
    static table: GPT-J / CodeGen / Falcon compute attention inline in some versions."""
    model, inputs = miniature(model_type)
    layout = get_layout(model)
    inline = prove_layout(model, layout, inputs).via != "interface"
    small = shrink_config(model.config)
    if inline:
        assert "computed inline" in layout.refuse_variant(small)
        with pytest.raises(LayoutError, match="attn_implementation='attention_sink' is not available"):
            AutoModel.from_config(small, attn_implementation="attention_sink")
    else:
        assert layout.refuse_variant(small) is None
        AutoModel.from_config(small, attn_implementation="attention_sink")
