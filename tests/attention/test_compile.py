"""``torch.compile(model, fullgraph=True)`` works for every attention variant, in training and eval, with the outputs,
gradients and α_ma of eager mode, and ``torch._dynamo.explain`` finds no graph break (causal and padded batches).

CPU, ``aot_eager`` backend, tiny models: compiling is slow on 2 cores. ``inductor`` works too but costs ~50 s per
compiled training step of this 1-layer model on 2 cores (measured: the attention_sink case, 52.6 s vs 5.2 s with
aot_eager), too slow for the suite; aot_eager runs the same dynamo capture and autograd tracing (custom
autograd.Functions included), inductor only adds code generation. The version matrix runs this file once more with
``HF_CONDINIT_COMPILE_BACKEND=inductor`` on torch 2.11 (noxfile.py), whose compiled autograd.Functions once dropped
every gradient of the sink and affine_scaled (`hf_condinit.attention._common.cast_fresh`).

On torch older than `COMPILE_MIN_TORCH` (2.5, 2.6: their dynamo cannot trace transformers 5.17's forward wrappers,
whatever the attention) the library refuses: the first compiled forward fails with one line naming the torch needed."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

import hf_condinit  # noqa: F401
from hf_condinit.attention.compile_guard import COMPILE_MIN_TORCH, compile_refusal
from utils import assert_matches_eager

OLD_TORCH = torch.__version__ < COMPILE_MIN_TORCH
BACKEND = os.environ.get("HF_CONDINIT_COMPILE_BACKEND", "aot_eager")
# aot_eager runs eager's kernels; inductor generates its own, whose fp32 sums run in another order
TOL = dict(rtol=1e-5, atol=1e-6) if BACKEND == "aot_eager" else dict(rtol=1e-4, atol=1e-5)

CASES = {  # spectral conditioning combines with any implementation: one compile covers two variants
    "affine_scaled+spectral": dict(attn_implementation="affine_scaled",
                                   condinit={"method": "default", "spectral_lambda": 1.0}),
    "attention_sink": dict(attn_implementation="attention_sink"),
    "preconditioned": dict(attn_implementation="preconditioned"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fullgraph_compile_matches_eager_in_training_and_eval(case):
    torch.manual_seed(0)
    config = GPT2Config(n_embd=16, n_head=2, n_layer=1, vocab_size=32, n_positions=16, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0)
    model = AutoModelForCausalLM.from_config(config, **CASES[case])
    with torch.no_grad():  # non-trivial holder values
        for name, p in model.named_parameters():
            if "condinit_" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    refusal = compile_refusal(model.config)
    assert (refusal is not None) == (OLD_TORCH or (torch.__version__.startswith("2.11.") and "affine" in case))
    if refusal:
        _assert_refused(model, ids, refusal)
        return
    padding = torch.ones_like(ids)
    padding[0, :3] = 0
    probe = copy.deepcopy(model).train()  # explain runs the forward: a training forward updates α_ma
    for mask in (None, padding):  # the causal path and the masked path of every attention function
        explained = torch._dynamo.explain(probe)(ids, attention_mask=mask)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(model, backend=BACKEND, fullgraph=True)
    for train in (True, False):
        model.train(train), eager.train(train)
        out, ref = compiled(ids).logits, eager(ids).logits
        assert_matches_eager(model, eager, out, ref, TOL, backward=train)  # α_ma updated once, like eager


def _assert_refused(model, ids, refusal: str) -> None:
    """The compiled forward fails, and the first line of the error is the refusal (naming the torch needed, or the
    torch whose compiled gradients are wrong); the model still runs eagerly."""
    compiled = torch.compile(model, backend=BACKEND, fullgraph=True)
    with pytest.raises(Exception) as info:
        compiled(ids)
    first = str(info.value).splitlines()[0]
    assert first == f"RuntimeError: {refusal}", first
    assert "needs torch >= 2.7" in refusal if OLD_TORCH else "gives wrong gradients on torch 2.11" in refusal
    assert torch.isfinite(model(ids).logits).all()
