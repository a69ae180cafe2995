"""The attention variants compile the way training compiles them: each decoder / encoder block on its own
(accelerate's regional compilation, Trainer ``torch_compile`` with ``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1``:
the mask is built outside the graph), with ``fullgraph=True``, i.e. one graph per block and no graph break, and with
eager's outputs, gradients and α_ma; ``output_attentions=True`` under compilation gives eager's weights.

Before every variant broke a compiled block's graph 4 times (GPT-2, Llama, BERT, GPT-NeoX: 5 graphs):
``wants_attentions`` read transformers' output collector, a ContextVar dynamo cannot trace. Now the model's forward
pre-hook passes a request for the weights to the blocks as a keyword argument
(`hf_condinit.attention._common.pass_attention_request`), and the collector is read only where that needs no graph
break.

CPU, ``aot_eager`` (dynamo capture and AOTAutograd, custom autograd.Functions included;
tests/attention/test_compile.py says why not inductor), 1-layer miniatures of tests/utils.py (dropout off, holders
randomised), the block compiled in place. One compiled model per (family, variant, spectral) and one (mode, mask) case
each, rotated over the families (`MATRIX`), keeps the file at about a minute of CPU time (2 cores).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

import hf_condinit  # noqa: F401
from hf_condinit.attention._common import ATTENTIONS_KWARG
from hf_condinit.attention.compile_guard import compile_refusal
from hf_condinit.attention.reference import randomise_holders
from utils import assert_matches_eager, mini_config

FAMILIES = {  # model_type -> (Auto class, path of the block list, no-dropout overrides)
    "gpt2": (AutoModelForCausalLM, "transformer.h", dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)),
    "llama": (AutoModelForCausalLM, "model.layers", {}),  # GQA (4 query heads, 2 key/value heads), rotary
    "bert": (AutoModelForMaskedLM, "bert.encoder.layer", dict(hidden_dropout_prob=0.0,
                                                              attention_probs_dropout_prob=0.0)),
    "gpt_neox": (AutoModelForCausalLM, "gpt_neox.layers", {}),  # fused interleaved qkv, partial rotary
}
VARIANTS = ("affine_scaled", "attention_sink", "preconditioned")
CASES = ((True, True), (False, False), (True, False), (False, True))  # (training, padded)
#: (family, variant, spectral, case): one compiled model each, the cases rotated (a Latin square over the 4 families)
#: so that every variant, with and without spectral conditioning, is compiled in all four (mode, mask) cases, and
#: every family with every variant in training and in eval
MATRIX = [(family, variant, spectral, CASES[(f + v + spectral) % 4])
          for f, family in enumerate(FAMILIES) for v, variant in enumerate(VARIANTS) for spectral in (False, True)]
#: (family, variant, how): each pair compiled one way; the families alternate, so each variant and each family is
#: compiled both ways
ATTENTIONS_MATRIX = [(family, variant, ("whole", "per block")[(f + v) % 2])
                     for f, family in enumerate(FAMILIES) for v, variant in enumerate(VARIANTS)]
TOL = dict(rtol=1e-5, atol=1e-6)


def build(family: str, variant: str, spectral: bool = False):
    """A 1-layer miniature with ``variant`` (and spectral conditioning, λ = 1), holders randomised; skips where the
    running torch refuses to compile it (`compile_refusal`: below torch 2.7, and affine_scaled or spectral on 2.11;
    the refusal itself is tested in tests/attention/test_compile.py)."""
    auto, _, overrides = FAMILIES[family]
    condinit = {"method": "default", "spectral_lambda": 1.0} if spectral else None
    torch.manual_seed(0)
    model = auto.from_config(mini_config(family, num_hidden_layers=1, **overrides), attn_implementation=variant,
                             condinit=condinit)
    refusal = compile_refusal(model.config)
    if refusal:
        pytest.skip(refusal)
    randomise_holders(model)
    return model


def blocks(model, family: str):
    return model.get_submodule(FAMILIES[family][1])


def batch(config, padded: bool) -> dict:
    """2 × 8 token ids; padded: the first sequence left-padded by 3."""
    ids = torch.randint(3, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return {"input_ids": ids, "attention_mask": mask} if padded else {"input_ids": ids}


def compile_blocks(model, family: str, fullgraph: bool = True) -> None:
    """Compile every block in place, as accelerate's regional compilation does."""
    for block in blocks(model, family):
        block.compile(backend="aot_eager", fullgraph=fullgraph)


def _case_id(item) -> str:
    family, variant, spectral, (training, padded) = item
    return "-".join([family, variant + ("+spectral" if spectral else ""), "train" if training else "eval",
                     "padded" if padded else "no_mask"])


@pytest.mark.parametrize("family, variant, spectral, case", MATRIX, ids=[_case_id(m) for m in MATRIX])
def test_block_compiles_as_one_graph_with_eager_outputs_and_gradients(family, variant, spectral, case):
    training, padded = case
    model = build(family, variant, spectral).train(training)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    counters.clear()
    compile_blocks(model, family)
    inputs = batch(model.config, padded)
    with torch.set_grad_enabled(training):  # eval as the Trainer evaluates: without gradients
        out, ref = model(**inputs).logits, eager(**inputs).logits
    assert_matches_eager(model, eager, out, ref, TOL, backward=training)  # α_ma updated once (training), like eager
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("family, variant, how", ATTENTIONS_MATRIX, ids=["-".join(m) for m in ATTENTIONS_MATRIX])
def test_output_attentions_under_compilation_equal_eager(family, variant, how):
    """The whole model (``fullgraph=True``) or its blocks (accelerate's default, ``fullgraph=False``: transformers'
    own output-capturing hook on each attention module reads its ContextVar, a graph break for every implementation,
    eager included) return eager's weights, one tensor per layer, and eager's logits (inference, no gradients).

    The model asks for the weights eagerly first, as transformers needs for every implementation under
    ``fullgraph=True``: its first such call installs the capturing hooks under a lock, which dynamo cannot enter."""
    eager = build(family, variant).eval()
    inputs = batch(eager.config, padded=True)
    with torch.no_grad():
        ref = eager(**inputs, output_attentions=True)
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    if how == "whole":
        model = torch.compile(model, backend="aot_eager", fullgraph=True)
    else:
        compile_blocks(model, family, fullgraph=False)
    with torch.no_grad():
        got = model(**inputs, output_attentions=True)
    assert len(got.attentions) == len(ref.attentions) == 1
    torch.testing.assert_close(got.attentions[0], ref.attentions[0], **TOL)
    torch.testing.assert_close(got.logits, ref.logits, **TOL)


def test_a_request_that_cannot_reach_the_compiled_blocks_raises():
    """A model whose forward drops keyword arguments before its blocks (planted: a pre-hook on each block removes the
    request) would return no weights from compiled blocks: one error saying what to do instead of an empty tuple.
    Eagerly the same model still returns the weights (the collector is read there)."""
    model = build("gpt2", "attention_sink").eval()
    for block in blocks(model, "gpt2"):
        block.register_forward_pre_hook(lambda m, a, k: (a, {n: v for n, v in k.items() if n != ATTENTIONS_KWARG}),
                                        with_kwargs=True)
    ids = batch(model.config, padded=False)
    assert len(model(**ids, output_attentions=True).attentions) == 1
    torch._dynamo.reset()
    compile_blocks(model, "gpt2", fullgraph=False)
    with pytest.raises(RuntimeError, match="output_attentions=True returned no attention weights.*Call the model "
                                           "uncompiled"):
        model(**ids, output_attentions=True)
