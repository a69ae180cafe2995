"""Saved-activation bytes of one attention call per variant, against SDPA's.

Counted with ``torch.autograd.graph.saved_tensors_hooks``: the bytes of every distinct storage that autograd saves
during one training call of the attention function (GPT-2 attention module, B = 2, H = 4, T = 256, head dim 64),
except affine_scaled's input X, which the q/k/v projection saves anyway. Measured on CPU (torch 2.13; ratio to SDPA):

| dtype, mask | attention_sink | preconditioned | affine_scaled |
|---|---|---|---|
| fp32, causal | 1.000 | 1.004 | 1.010 |
| fp32, padded | 1.000 | 1.003 | 1.058 |
| bf16, causal | 1.000 | 1.004 | 1.015 |
| bf16, padded | 1.000 | 1.003 | 1.112 |

affine_scaled with a mask keeps the boolean mask (1 byte per query-key pair; SDPA keeps only its own float copy) to
recompute the visible mean in the backward. In a model that mask is one tensor shared by every layer, so the
overhead per layer is this divided by the depth; per call it exceeds 1.05: marked xfail (strict: it fails once fixed).

What a training step holds is the model's saved activations, where that mask is one tensor for all layers:
`test_model_saved_activations_within_5_percent_of_sdpa` counts them over a whole 4-layer GPT-2 forward with the loss
(parameters excluded; same widths, vocabulary 512, left padding through ``attention_mask``). Ratio to SDPA, CPU, torch
2.13, the same four cases in the same order: attention_sink 1.000 throughout; preconditioned 1.033 / 1.032 / 1.032 /
1.031; affine_scaled 1.033 / 1.034 / 1.033 / 1.036 (both keep one more (B, T, D) tensor per layer than SDPA: their
output is a new tensor, while SDPA's output is also what it saves); spectral conditioning (SDPA with
``spectral_lambda=10``) 1.001 / 1.001 / 1.001 / 1.001 (``pytest -s`` prints them). A real vocabulary (GPT-2's
50,257) makes the logits a larger share, and every ratio smaller.
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM

import hf_condinit  # noqa: F401
from hf_condinit.attention.affine_scaled import AFFINE_INPUT_KWARG
from utils import mini_config

B, H, T, d = 2, 4, 256, 64
LIMIT = 1.05


def saved_bytes(impl: str, dtype: torch.dtype, padded: bool) -> int:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2", n_embd=H * d, n_head=H, attn_pdrop=0.0),
                                             attn_implementation=impl).to(dtype).train()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, d, generator=gen).to(dtype).transpose(1, 2).requires_grad_() for _ in range(3))
    x = torch.randn(B, T, H * d, generator=gen).to(dtype).requires_grad_()
    mask = None
    if padded:
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T).clone()
        mask[0, :, :, :5] = False  # left padding
    kwargs = {AFFINE_INPUT_KWARG: x} if impl == "affine_scaled" else {}
    sizes = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr != x.untyped_storage().data_ptr():
            sizes[ptr] = t.untyped_storage().nbytes()
        return t

    fn = AttentionInterface._global_mapping[impl]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = fn(model.transformer.h[0].attn, q, k, v, mask, dropout=0.0, scaling=d**-0.5, is_causal=True,
                    **kwargs)
    assert out.requires_grad
    return sum(sizes.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant, padded", [
    ("attention_sink", False), ("attention_sink", True), ("preconditioned", False), ("preconditioned", True),
    ("affine_scaled", False),
    pytest.param("affine_scaled", True, marks=pytest.mark.xfail(strict=True, reason="keeps the bool mask (doc)")),
])
def test_saved_activations_within_5_percent_of_sdpa(variant, padded, dtype):
    ratio = saved_bytes(variant, dtype, padded) / saved_bytes("sdpa", dtype, padded)
    assert ratio <= LIMIT, f"{variant}: {ratio:.3f}× SDPA's saved bytes"


@functools.cache
def model_saved_bytes(impl: str, dtype: torch.dtype, padded: bool, spectral_lambda: float | None = None) -> int:
    """Bytes of the distinct storages autograd saves in one training forward (with the loss) of a 4-layer GPT-2,
    parameters excluded; ``padded``: left padding of sequence 0 through ``attention_mask``."""
    torch.manual_seed(0)
    config = mini_config("gpt2", n_embd=H * d, n_head=H, n_layer=4, n_positions=T, vocab_size=512, attn_pdrop=0.0,
                         resid_pdrop=0.0, embd_pdrop=0.0)
    extra = {"condinit": {"spectral_lambda": spectral_lambda}} if spectral_lambda else {}
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, **extra).to(dtype).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, 512, (B, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :5] = 0
    sizes = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, attention_mask=mask if padded else None, labels=ids).loss
    assert loss.requires_grad
    return sum(sizes.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
@pytest.mark.parametrize("impl, spectral_lambda", [("attention_sink", None), ("preconditioned", None),
                                                   ("affine_scaled", None), ("sdpa", 10.0)],
                         ids=["attention_sink", "preconditioned", "affine_scaled", "spectral"])
def test_model_saved_activations_within_5_percent_of_sdpa(impl, spectral_lambda, padded, dtype):
    ratio = model_saved_bytes(impl, dtype, padded, spectral_lambda) / model_saved_bytes("sdpa", dtype, padded)
    print(f"{impl} {spectral_lambda or ''} {'padded' if padded else 'causal'} {dtype}: {ratio:.4f}")
    assert ratio <= LIMIT, f"{impl}: {ratio:.3f}× SDPA's saved activation bytes in a model"
