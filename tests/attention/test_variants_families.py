"""The attention variants on the newer decoder families: the guarantees the gpt2/llama tests give.

For each family (2-layer, 64-wide miniatures of the default config, `hf_condinit.layouts.miniature.shrink_config`;
gemma3_text keeps a sliding and a global layer, its window (4) shorter than the inputs) and each variant, in float32:

(i) KV-cache generation: greedy decoding with the cache gives the same tokens as the no-cache argmax chain, and
    the cached step logits equal the full forward's logits at those positions;
(ii) left padding: a left-padded batch gives each sequence's real-token logits as that sequence alone;
(iii) no leak across sequences: changing sequence 2 leaves sequence 1's logits unchanged (to float rounding: Mixtral
      with plain SDPA already differs by ~1e-7 there, its experts' matmuls batch the routed tokens);
(iv) save/load (hf_condinit imported): the reloaded model gives identical logits.

The references are the model's own outputs on other inputs (a sequence alone, no cache), so a variant that let a
future token, a padding position or another sequence in would fail (i)-(iii).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_condinit  # noqa: F401  (installs the hooks and registers the variants)
from hf_condinit.layouts.miniature import shrink_config
from hf_condinit.attention.affine_scaled import AffineScaledHolder
from hf_condinit.attention.attention_sink import AttentionSinkHolder
from hf_condinit.attention.spectral import SpectralHolder

FAMILIES = ["qwen3", "mixtral", "phi3", "olmo2", "starcoder2", "gemma3_text", "smollm3"]
VARIANTS = ["affine_scaled", "attention_sink", "preconditioned", "spectral"]
TOL = 1e-5


def _build(family: str, variant: str):
    config = shrink_config(AutoConfig.for_model(family))
    config.pad_token_id = 0
    torch.manual_seed(0)
    if variant == "spectral":
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 condinit={"method": "conditioned", "spectral_lambda": 3.0})
    else:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=variant)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-default holder values (a sink logit of 0, an all-zero W_a would hide mistakes)
        for m in model.modules():
            if isinstance(m, (AffineScaledHolder, AttentionSinkHolder)):
                for t in m.parameters(recurse=False):
                    t.add_(0.5 * torch.randn(t.shape, generator=gen))
    return model.eval()


def _ids(model, batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(3, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=[(f, v) for f in FAMILIES for v in VARIANTS], ids=lambda p: f"{p[0]}-{p[1]}")
def model(request):
    return _build(*request.param)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


@torch.no_grad()
def test_kv_cache_generation_matches_full_forward(model):
    prompt = _ids(model, 1, 5, seed=2)
    out = model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, min_new_tokens=5)
    seq = out.sequences
    full = model(seq, use_cache=False).logits  # (1, T, V)
    steps = torch.stack(out.logits, dim=1)  # (1, new, V): logits that chose each new token
    n_new = steps.shape[1]
    _close(steps, full[:, prompt.shape[1] - 1: prompt.shape[1] - 1 + n_new])
    assert torch.equal(full[:, prompt.shape[1] - 1:-1].argmax(-1), seq[:, prompt.shape[1]:])


@torch.no_grad()
def test_left_padding_matches_each_sequence_alone(model):
    long, short = _ids(model, 1, 7, seed=3), _ids(model, 1, 4, seed=4)
    pad = long.shape[1] - short.shape[1]
    ids = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = model(ids, attention_mask=mask, position_ids=position_ids).logits
    _close(batch[0], model(long).logits[0])
    _close(batch[1, pad:], model(short).logits[0])


@torch.no_grad()
def test_no_leak_across_sequences(model):
    ids = _ids(model, 2, 7, seed=5)
    other = ids.clone()
    other[1] = _ids(model, 1, 7, seed=6)[0]
    a, b = model(ids).logits, model(other).logits
    _close(a[0], b[0])  # not bit-equal on MoE families: the experts' batched matmuls change with the routed tokens
    assert not torch.allclose(a[1], b[1])


@torch.no_grad()
def test_save_load_roundtrip(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == model.config._attn_implementation
    ids = _ids(model, 2, 7, seed=7)
    assert torch.equal(model(ids).logits, loaded(ids).logits)
