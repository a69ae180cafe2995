"""Inert unless asked: with the hooks installed and uninstalled, a fixed sample of model types builds the same way,
to bit-identical weights, saves the same files and reloads the same (`hf_condinit.inertness`; the full set of model
types: ``python benchmarks/inertness.py``)."""

import pytest
import torch

from hf_condinit import hooks
from hf_condinit.inertness import check_inert, same_state

# text decoders and encoders, an encoder-decoder, vision, a dual encoder and multimodal models, and hrm_text, whose
# override of _check_and_adjust_attn_implementation passes an extra positional argument (the hooks once refused it)
SAMPLE = ["hrm_text", "gpt2", "llama", "bert", "qwen3", "t5", "vit", "clip", "llava", "olmo3", "gemma2", "falcon",
          "gpt_neox", "bart", "roberta", "mistral", "deberta-v2", "funnel", "qwen2_vl", "modernbert"]


@pytest.mark.parametrize("model_type", SAMPLE)
def test_hooks_leave_a_model_that_did_not_ask_unchanged(model_type):
    result = check_inert(model_type)
    assert result.status == "identical", result
    assert result.round_trip, result  # these types reload exactly, with and without the hooks
    assert hooks.is_installed()


def test_a_model_that_fails_in_transformers_fails_the_same_way_with_the_hooks():
    """MusicGen's shrunk default config fails in transformers itself (AttributeError); the hooks once turned that into
    a ValueError by reading its ambiguous text config though no variant was asked (transformers 5.17's default
    config already fails its own validator: not built either)."""
    result = check_inert("musicgen")
    assert result.status == "not built", result


def test_a_wrapper_stricter_than_the_method_it_wraps_is_caught(monkeypatch):
    """The checker fails where it should: a wrapper with a fixed signature (as the hooks had) breaks HrmText."""
    name = "_check_and_adjust_attn_implementation"

    def strict(self, attn_implementation, is_init_check=False):
        return hooks._original(name)(self, attn_implementation, is_init_check)

    monkeypatch.setattr(hooks, name, strict)
    hooks.uninstall()
    hooks.install()
    try:
        result = check_inert("hrm_text")
    finally:
        monkeypatch.undo()
        hooks.uninstall()
        hooks.install()
    assert result.status == "different"
    assert result.detail == "build: TypeError with the hooks, ok without"


def test_same_state_compares_bits():
    a = {"w": torch.tensor([1.0, float("nan")]), "b": torch.zeros(2, dtype=torch.int64)}
    assert same_state(a, {k: v.clone() for k, v in a.items()}) is None  # NaN equals its own bits
    nudged = {**a, "w": torch.nextafter(a["w"], torch.tensor(2.0))}
    assert same_state(a, nudged) == "w: values differ"
    assert "keys differ" in same_state(a, {"w": a["w"]})
    assert same_state(a, {**a, "b": a["b"].float()}).startswith("b: torch.int64")


def test_uninstalled_restores_plain_transformers():
    from transformers import PreTrainedModel

    hooked = PreTrainedModel.post_init
    with hooks.uninstalled():
        assert not hooks.is_installed()
        assert PreTrainedModel.post_init is not hooked
    assert PreTrainedModel.post_init is hooked
