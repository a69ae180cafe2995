"""Layouts: per-head views alias the real parameters, in math orientation, checked against the model's own forward.

The reference is independent of the layout code: an attention function registered with HF records the query/key/
value tensors (B, H, N, d) the model itself produced, and a forward pre-hook records the input X; then
X·W_q^h + b_q^h must equal the model's head-h query (at position 0 for q/k, where rotary embeddings are the
identity; at every position for v).
"""

import pytest
import torch
from transformers import AttentionInterface, AutoModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import hf_condinit
from hf_condinit.layouts import LayoutError, get_layout
from hf_condinit.layouts.table import MODEL_TYPE_TO_LAYOUT
from utils import MINI_CONFIGS, example_inputs, mini_config

RECORDS = []


def _recording_sdpa(module, query, key, value, attention_mask, **kwargs):
    RECORDS.append((module, query.detach(), key.detach(), value.detach()))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("condinit_test_record", _recording_sdpa)
AttentionMaskInterface.register("condinit_test_record", sdpa_mask)


def test_every_registered_layout_has_a_mini_config():
    assert set(MODEL_TYPE_TO_LAYOUT) <= set(MINI_CONFIGS)


@pytest.mark.parametrize("model_type", sorted(MINI_CONFIGS))
def test_head_views_match_the_models_own_projections(model_type):
    torch.manual_seed(0)
    config = mini_config(model_type)
    model = AutoModel.from_config(config, attn_implementation="condinit_test_record").eval()
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    assert len(blocks) == 2
    inputs_x = {}
    handles = [
        layout.core_module(block).register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: inputs_x.__setitem__(i, (args[0] if args else kwargs["hidden_states"])),
            with_kwargs=True,
        )
        for i, (_, block) in enumerate(blocks)
    ]
    RECORDS.clear()
    with torch.no_grad():
        model(**example_inputs(model_type, config))
    for h in handles:
        h.remove()
    assert len(RECORDS) == len(blocks)
    for i, (_, block) in enumerate(blocks):
        _, q_states, k_states, v_states = RECORDS[i]
        projs = layout.projections(block)
        x = inputs_x[i]
        for role, states in (("q", q_states), ("k", k_states), ("v", v_states)):
            proj = projs[role]
            heads = proj.heads(proj.weight)
            biases = proj.bias_heads(proj.bias) if proj.bias is not None else [0.0] * len(heads)
            assert len(heads) == states.shape[1], (role, len(heads), states.shape)
            positions = slice(0, 1) if role in ("q", "k") else slice(None)
            for h, (w, b) in enumerate(zip(heads, biases)):
                ours = (x @ w + b)[:, positions]
                torch.testing.assert_close(ours, states[:, h, positions], rtol=1e-5, atol=1e-5)
        o = projs["o"]
        z = torch.randn(3, o.n_heads * o.head_dim)
        ours = sum(z[:, h * o.head_dim : (h + 1) * o.head_dim] @ w for h, w in enumerate(o.heads(o.weight)))
        ours = ours + (o.bias if o.bias is not None else 0.0)
        torch.testing.assert_close(ours, o.module(z), rtol=1e-5, atol=1e-5)


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


def test_unknown_model_type_names_class_and_registration():
    from transformers import T5Config, T5Model

    model = T5Model(T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=32))
    with pytest.raises(LayoutError, match=r"(?s)T5Model.*model_type=.t5.*register_layout"):
        get_layout(model)
    with pytest.raises(LayoutError, match="register_layout"):
        hf_condinit.apply_init(model, "conditioned", seed=0)


def test_from_config_on_unsupported_model_fails_before_training():
    from transformers import AutoModel, T5Config

    with pytest.raises(LayoutError, match="no attention layout"):
        AutoModel.from_config(T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=32),
                              condinit=True)


def test_head_dim_mismatch_is_reported():
    model = AutoModel.from_config(mini_config("llama"))
    layout = get_layout(model)
    _, block = layout.attention_modules(model)[0]
    wrong = mini_config("llama", num_attention_heads=8, num_key_value_heads=2, head_dim=8)
    with pytest.raises(LayoutError, match="does not hold 8 heads of dimension 8"):
        layout.geometry(block, wrong)
    not_divisible = mini_config("gpt2")
    not_divisible.n_head = 5
    _, gblock = get_layout(not_divisible).attention_modules(AutoModel.from_config(mini_config("gpt2")))[0]
    with pytest.raises(LayoutError, match="not divisible by 5 heads"):
        get_layout(not_divisible).geometry(gblock, not_divisible)


def test_register_layout_refuses_silent_overwrite():
    with pytest.raises(ValueError, match="already registered"):
        hf_condinit.register_layout("gpt2", MODEL_TYPE_TO_LAYOUT["bert"])
