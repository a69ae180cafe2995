"""Families whose default configs carry sizes tied together by validators, hybrids and gated attention.

The miniature the layout proof builds (`hf_condinit.layouts.miniature.shrink_config`) must pass each config's own
validators: sizes derived from the shrunk ones (XLNet's ``d_head = d_model / n_head``, a Mamba mixer's head
dimension, an attention indexer's heads) and what names layers renumbered with the kept layers (Kolibri's
``index_layers`` / ``kv_source_layers``, NeoMME's ``per_layer_config``). The reference is the config class itself
(``from_dict`` runs its validators) and, where the type is supported, the conditioned weights of a model built from
the miniature (per-head W_Qᵀ W_Q = W_Kᵀ W_K = I, V the identity block; `hf_condinit.coverage.check_conditioned`).
Types the installed transformers lacks are skipped.
"""

import pytest
import torch
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from hf_condinit.coverage import auto_class, check_conditioned
from hf_condinit.layouts.miniature import HEADS, LAYERS, WIDTH, shrink_config


def _default(model_type):
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not a model type of the installed transformers")
    return AutoConfig.for_model(model_type)


@pytest.mark.parametrize("model_type", ["xlnet", "bamba", "granitemoehybrid", "falcon_h1", "kolibri1_1", "neomme",
                                        "dory", "zamba", "zamba2"])
def test_the_miniature_passes_the_configs_own_validators(model_type):
    config = _default(model_type)
    small = shrink_config(config)  # from_dict runs the config class's validators
    again = type(config).from_dict(small.to_dict())  # and the miniature reads back as it is
    assert again.to_dict() == small.to_dict()


def test_dependent_sizes_are_derived_from_the_shrunk_ones():
    xlnet = shrink_config(_default("xlnet"))
    assert (xlnet.d_model, xlnet.n_head, xlnet.d_head) == (WIDTH, HEADS, WIDTH // HEADS)
    bamba = shrink_config(_default("bamba"))
    assert bamba.mamba_n_heads * bamba.mamba_d_head == bamba.mamba_expand * bamba.hidden_size
    falcon_h1 = _default("falcon_h1")
    small = shrink_config(falcon_h1)
    assert small.mamba_d_ssm < falcon_h1.mamba_d_ssm and small.mamba_n_heads * small.mamba_d_head == small.mamba_d_ssm


def test_sizes_computed_once_from_the_width_and_doubled_layer_lists_are_kept_consistent():
    """Zamba2 stores the sizes its config computes from the width (the shared attention reads ``[h; embeddings]``,
    2·D wide); Dory's dict lists each layer as attention then ``"mlp"`` with doubled section counts; Zamba ties its
    shared block across its hybrid layers, so the miniature keeps two of them. Each model builds."""
    from transformers import AutoModel

    zamba2 = shrink_config(_default("zamba2"))
    assert zamba2.attention_hidden_size == 2 * zamba2.hidden_size
    assert zamba2.attention_head_dim == zamba2.attention_hidden_size // zamba2.num_attention_heads
    assert zamba2.mamba_headdim == zamba2.mamba_expand * zamba2.hidden_size // zamba2.n_mamba_heads
    dory = shrink_config(_default("dory"))
    assert dory.num_hidden_layers == LAYERS == dory.n_input_layers + dory.n_recurrent_layers + dory.n_output_layers
    assert dory.layer_types == ["sliding_attention", "full_attention"]  # the first layer and one of the other kind
    zamba = shrink_config(_default("zamba"))
    assert zamba.layers_block_type == ["hybrid", "hybrid"]
    for small in (zamba2, dory, zamba):
        AutoModel.from_config(small)


@pytest.mark.parametrize("model_type", ["esmc", "neomme", "dory", "zamba", "zamba2", "xlnet"])
def test_attention_no_layout_can_write_is_refused_with_the_architectures_reason(model_type, monkeypatch):
    """Refused up front with the reason; without that entry, every candidate layout fails the proof on the
    miniature, or none is found (the reason describes the architecture, which detection confirms)."""
    from hf_condinit.layouts import LayoutError, detect

    small = shrink_config(_default(model_type))
    auto = auto_class(small)
    with pytest.raises(LayoutError, match="not one whose heads hf_condinit's layouts can write"):
        auto.from_config(small, condinit=True)
    monkeypatch.delitem(detect.NO_LAYOUT, model_type)
    monkeypatch.setattr(detect, "_CACHE", {})
    with pytest.raises(LayoutError, match="could not prove any attention layout|found no attention projections"):
        auto.from_config(small, condinit=True)


def test_layer_indices_follow_the_kept_layers():
    config = _default("kolibri1_1")
    small = shrink_config(config)
    first_indexed = config.layer_types.index("indexed_attention")
    assert small.layer_types == [config.layer_types[0], "indexed_attention"]  # layers 0 and first_indexed kept
    assert first_indexed in config.index_layers and small.index_layers == [1]
    assert small.kv_source_layers == [0, 1]
    assert small.index_num_heads <= small.num_attention_heads // small.num_key_value_heads
    neomme = _default("neomme")
    small = shrink_config(neomme)
    assert small.num_hidden_layers == LAYERS
    kept = [0, neomme.layer_types.index(next(t for t in neomme.layer_types if t != neomme.layer_types[0]))]
    assert small.layer_types == [neomme.layer_types[i] for i in kept]
    per_layer = {int(k): v for k, v in neomme.to_dict()["per_layer_config"].items()}  # layer 5: a full window
    assert {int(k): v for k, v in small.to_dict()["per_layer_config"].items()} == {
        j: per_layer[i] for j, i in enumerate(kept) if i in per_layer}


@pytest.mark.parametrize("model_type", ["falcon_h1", "kolibri1_1"])
def test_families_under_strict_configs_take_conditioned_init(model_type):
    small = shrink_config(_default(model_type))
    torch.manual_seed(0)
    model = auto_class(small).from_config(small, dtype=torch.float32, condinit=True)
    assert check_conditioned(model) >= 1


# ---------------------------------------------------------------------------------------------- gated attention
GATED = ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"]


def _gated_miniature(model_type):
    from hf_condinit.layouts.miniature import build_miniature, miniature_inputs

    config = _default(model_type)
    model = build_miniature(auto_class(config)._model_mapping[type(config)], config)
    return config, model, miniature_inputs(model)


@pytest.mark.parametrize("model_type", GATED)
def test_gated_attention_layout_reads_query_and_gate_from_the_models_forward(model_type):
    from hf_condinit.layouts import LayoutError, get_layout
    from hf_condinit.layouts.proof import prove_layout
    from hf_condinit.layouts.separate import GATE_ORDERS, GatedQuerySeparateLayout

    config, model, inputs = _gated_miniature(model_type)
    layout = get_layout(model)
    assert isinstance(layout, GatedQuerySeparateLayout) and layout.gate_order == "per_head"  # view(H, 2d).chunk(2)
    assert "linear_attention" in model.config.layer_types  # the Gated DeltaNet layers are not attention blocks
    assert len(layout.attention_modules(model)) == model.config.layer_types.count("full_attention")
    for order in GATE_ORDERS[1:]:  # every other reading of q_proj fails the proof
        wrong = GatedQuerySeparateLayout("q_proj", "k_proj", "v_proj", "o_proj", gate_order=order, name=order)
        with pytest.raises(LayoutError, match="layout proof failed"):
            prove_layout(model, wrong, inputs)


# hybrids: softmax attention among linear-attention (Gated DeltaNet), state-space (Mamba) or convolution mixers; a
# config that places attention layers explicitly where the default places none
HYBRIDS = {"olmo_hybrid": {}, "jamba": {}, "lfm3": {}, "bamba": {"attn_layer_indices": [3, 9]},
           "granitemoehybrid": {"layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 28},
           # gated attention with a QSA token indexer among Gated DeltaNet layers; the default config leaves the
           # indexer's sizes unset, which transformers does not build
           "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 256,
                              "indexer_budget": 8, "indexer_compress_ratio": 4}}


def _skip_unless_transformers_runs_it(model, model_type):
    """Skip where transformers' own model fails its forward with the installed torch (Qwen4-Exp's indexer scatters
    with an int32 index, which torch 2.5 refuses): the layout proof cannot run there, and it is not the plugin's."""
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 8, dtype=torch.long))
    except RuntimeError as err:
        pytest.skip(f"transformers' {model_type} does not run with torch {torch.__version__}: {err}")


def _attention_layers(config):
    kinds = getattr(config, "layer_types", None) or config.layers_block_type
    return sum(kind not in ("linear_attention", "mamba", "conv", "mlp") for kind in kinds)


@pytest.mark.parametrize("model_type, overrides", [(t, {}) for t in GATED] + list(HYBRIDS.items()),
                         ids=GATED + list(HYBRIDS))
def test_attention_layers_are_conditioned_and_every_other_mixer_is_built_as_hf_builds_it(model_type, overrides):
    from hf_condinit.layouts import get_layout

    small = shrink_config(_default(model_type).__class__(**{**_default(model_type).to_dict(), **overrides}))
    auto = auto_class(small)
    torch.manual_seed(0)
    plain = auto.from_config(small, dtype=torch.float32)
    _skip_unless_transformers_runs_it(plain, model_type)
    torch.manual_seed(0)
    model = auto.from_config(small, dtype=torch.float32, condinit={"method": "conditioned", "seed": 0})
    assert 1 <= _attention_layers(small) < small.num_hidden_layers or model_type in GATED
    assert check_conditioned(model) == _attention_layers(small)
    layout = get_layout(model)
    written = set()
    for name, block in layout.attention_modules(model):
        q = layout.projections(block)["q"]
        plain_q = plain.get_submodule(name).get_submodule(layout.paths["q"]).weight
        for gate, plain_gate in zip(q.gate_heads(q.weight), q.gate_heads(plain_q)):
            assert torch.equal(gate, plain_gate)  # a gate in q_proj keeps HF's init
        assert not torch.equal(q.weight, plain_q)  # the query part was written
        written |= {f"{name}.{layout.paths[r]}.weight" for r in "qkv"}
    plain_params = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        if name not in written:  # linear / state-space / conv mixers, MLP / experts, norms, embeddings
            assert torch.equal(p, plain_params[name]), name


@pytest.mark.parametrize("model_type", ["olmo_hybrid", "lfm3"])
def test_a_hybrids_layout_leaves_the_mixers_with_the_same_names_out(model_type):
    """OLMo-Hybrid's Gated DeltaNet has q_proj/k_proj/v_proj/o_proj, LFM3's convolution in_proj/out_proj: the
    layout's blocks are the ones that call HF's attention interface."""
    from hf_condinit.layouts import get_layout

    config, model, _ = _gated_miniature(model_type)
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    assert len(blocks) == _attention_layers(model.config)
    assert all("Attention" in type(m).__name__ for _, m in blocks)


def test_a_config_without_attention_layers_is_refused_and_one_with_them_is_not():
    from transformers import AutoModelForCausalLM

    from hf_condinit.layouts import LayoutError

    default = shrink_config(_default("bamba"))  # attn_layer_indices=None: every layer a Mamba mixer
    with pytest.raises(LayoutError, match="no softmax-attention layer"):
        AutoModelForCausalLM.from_config(default, condinit=True)
    placed = shrink_config(type(default)(**{**_default("bamba").to_dict(), "attn_layer_indices": [3]}))
    model = AutoModelForCausalLM.from_config(placed, dtype=torch.float32, condinit=True)  # same process
    assert check_conditioned(model) == 1


def test_configs_shrunk_by_attribute_keep_their_verdict_for_the_layers_the_model_has():
    """``cfg.num_hidden_layers = 2`` by hand keeps the full ``layer_types`` / index lists: the model has the first 2
    layers only, so Kolibri's indexer list loses the layers past them, and a hybrid whose first 2 layers are all
    linear mixers has no softmax attention, said so (not a miniature that its validator refuses)."""
    from hf_condinit.layouts import LayoutError
    from hf_condinit.layouts.miniature import shrink_by_attribute

    config = shrink_by_attribute(_default("kolibri1_1"))
    assert max(config.index_layers) >= config.num_hidden_layers
    model = auto_class(config).from_config(config, dtype=torch.float32, condinit=True)
    assert check_conditioned(model) == 2
    config = shrink_by_attribute(_default("olmo_hybrid"))
    assert "full_attention" in config.layer_types
    assert "full_attention" not in config.layer_types[:config.num_hidden_layers]
    with pytest.raises(LayoutError, match="no softmax-attention layer"):
        auto_class(config).from_config(config, condinit=True)


def test_run_clm_conditions_a_tiny_qwen3_5s_attention_and_builds_its_gated_deltanet_as_hf_does(tmp_path):
    """``run_clm.py --init conditioned`` on a Qwen3.5 from a ``--model_config`` file (``--config_overrides`` cannot
    shorten ``layer_types``), at learning rate 0 so the saved weights are the built ones: the full-attention layers
    are conditioned, and every other weight (Gated DeltaNet layers, the gate half of q_proj, MLPs, embeddings)
    equals the ``--init default`` run's with the same seed, bit for bit."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from utils import load_script

    _default("qwen3_5_text")  # skipped where the installed transformers lacks it
    run_clm = load_script("run_clm.py")
    config = AutoConfig.for_model(
        "qwen3_5_text", num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"] * 2)
    config.to_json_file(tmp_path / "qwen3_5-tiny.json")
    runs = {}
    for init in ("default", "conditioned"):
        run_clm.main([
            "--output_dir", str(tmp_path / init), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none",
            "--cache_dir", str(tmp_path / "cache"), "--seed", "7",
            "--model_config", str(tmp_path / "qwen3_5-tiny.json"), "--init", init, "--learning_rate", "0",
            "--max_steps", "1", "--synthetic_train_examples", "16",
            "--synthetic_eval_examples", "8", "--per_device_train_batch_size", "4", "--do_train",
        ])  # fmt: skip
        runs[init] = load_file(tmp_path / init / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "conditioned", dtype=torch.float32)
    assert model.config.layer_types == config.layer_types and model.config.condinit["method"] == "conditioned"
    assert check_conditioned(model) == 2  # the two full-attention layers
    written = {f"model.layers.{i}.self_attn.{p}.weight" for i in (1, 3) for p in ("q_proj", "k_proj", "v_proj")}
    assert written <= set(runs["default"])
    for name, tensor in runs["default"].items():
        if name not in written:
            assert torch.equal(tensor, runs["conditioned"][name]), name
    for i in (1, 3):  # q_proj: per head [q_h; g_h]; the gate halves keep HF's init
        q = f"model.layers.{i}.self_attn.q_proj.weight"
        gates = [runs[init][q].view(4, 2, 16, 64)[:, 1] for init in runs]
        queries = [runs[init][q].view(4, 2, 16, 64)[:, 0] for init in runs]
        assert torch.equal(*gates) and not torch.equal(*queries)
    assert any(".linear_attn." in name for name in runs["default"])  # the Gated DeltaNet layers were compared
