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

from hf_condinit.coverage import _auto_class, check_conditioned
from hf_condinit.layouts.miniature import HEADS, LAYERS, WIDTH, shrink_config


def _default(model_type):
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not a model type of the installed transformers")
    return AutoConfig.for_model(model_type)


@pytest.mark.parametrize("model_type", ["xlnet", "bamba", "granitemoehybrid", "falcon_h1", "kolibri1_1", "neomme"])
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
    model = _auto_class(small).from_config(small, dtype=torch.float32, condinit=True)
    assert check_conditioned(model) >= 1
