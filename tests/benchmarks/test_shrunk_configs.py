"""Never stricter than transformers: a config shrunk by attribute, the way a researcher does it by hand
(``cfg.num_hidden_layers = 2; cfg.hidden_size = 64; ...``, per-layer lists such as ``layer_types`` left at full
length), takes ``condinit=True`` wherever transformers builds it and the type is supported; conditioned init is
checked on the built model's weights (per-head W_Qᵀ W_Q = W_Kᵀ W_K = I, V the identity block). Funnel, whose base
model class is a pair of classes, is supported or refused with a LayoutError naming it, never an internal error.
The full set of causal / masked LM types: ``python benchmarks/shrunk_configs.py``."""

import pytest
import torch
from transformers import AutoConfig

from hf_condinit.coverage import auto_class, check_conditioned
from hf_condinit.layouts import LayoutError
from hf_condinit.layouts.miniature import shrink_by_attribute

# types the plugin used to refuse when shrunk by attribute: a validator of the miniature's config (layer_types
# longer than the layer count; the architecture validators), not the layout proof
SAMPLE = ["olmo3", "cohere2", "exaone4", "lfm2", "llama4_text", "vaultgemma", "modernbert-decoder", "minimax",
          "granite_swa"]


def _shrunk(model_type):
    config = shrink_by_attribute(AutoConfig.for_model(model_type))
    assert config.num_hidden_layers == 2
    return auto_class(config), config


@pytest.mark.parametrize("model_type", SAMPLE)
def test_a_config_shrunk_by_attribute_takes_condinit(model_type):
    auto, config = _shrunk(model_type)
    if getattr(config, "layer_types", None) is not None:
        assert len(config.layer_types) > config.num_hidden_layers  # what a validator would refuse
    torch.manual_seed(0)
    auto.from_config(config)  # transformers builds it
    model = auto.from_config(config, dtype=torch.float32, condinit=True)
    assert check_conditioned(model) >= 1


def test_funnel_is_supported_or_refused_by_name():
    config = shrink_by_attribute(AutoConfig.for_model("funnel"))  # Funnel refuses num_hidden_layers: left as is
    auto = auto_class(config)
    auto.from_config(config)
    try:
        model = auto.from_config(config, dtype=torch.float32, condinit=True)
    except LayoutError as err:
        assert "funnel" in str(err)
        assert "'tuple' object" not in str(err)
    else:
        assert check_conditioned(model) >= 1
