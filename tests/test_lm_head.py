"""The LM-head levers (hf_condinit.lm_head), against independent references on CPU:

- the chunked cross-entropy gives transformers' own ``ForCausalLMLoss`` on the full logits, and the same gradients
  for the hidden states, weight and bias, in fp32 and under bf16 autocast, with ``-100`` targets, the Trainer's
  ``num_items_in_batch``, chunks that do not divide the tokens, and a padded vocabulary;
- installed on a model (GPT-2: tied head; Llama: untied), a training forward gives the stock forward's loss and every
  parameter's gradient; evaluation and generation keep the stock forward and the signature the Trainer inspects;
- a padded vocabulary keeps the real rows, gives the unpadded model's logits and loss (padded columns -inf, no
  gradient into the padded rows), never generates a padded id, and saves a checkpoint that plain transformers
  (hf_condinit blocked) loads and samples from without ever producing a padded id.
"""

import copy
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss

import hf_condinit  # noqa: F401
from hf_condinit.attention.compile_guard import COMPILE_MIN_TORCH
from hf_condinit.lm_head import _MaskPaddedLogits, chunked_lm_head_loss, pad_vocabulary, use_chunked_lm_head_loss
from hf_condinit.scripts_common import with_causal_loss_type
from utils import mini_config

V, REAL, D = 50, 40, 16


def _case(seed=0, batch=3, seq=7):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, D, generator=gen, requires_grad=True)
    weight = torch.randn(V, D, generator=gen).mul_(0.5).requires_grad_()
    bias = torch.randn(V, generator=gen).requires_grad_()
    labels = torch.randint(0, REAL, (batch, seq), generator=gen)
    labels[0, :4] = -100  # a prompt-masked row start
    labels[2, 3] = -100
    return hidden, weight, bias, labels


def _reference(hidden, weight, bias, labels, num_items, real_vocab):
    logits = F.linear(hidden, weight, bias)
    if real_vocab is not None:
        logits = logits.masked_fill(torch.arange(V) >= real_vocab, float("-inf"))
    return ForCausalLMLoss(logits, labels, V, num_items_in_batch=num_items)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("num_items", [None, 11], ids=["mean", "num_items_in_batch"])
@pytest.mark.parametrize("real_vocab", [None, REAL], ids=["full", "padded"])
def test_chunked_loss_and_gradients_equal_the_full_logits(autocast, num_items, real_vocab):
    hidden, weight, bias, labels = _case()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ref = _reference(hidden, weight, bias, labels, num_items, real_vocab)
        ref_grads = torch.autograd.grad(ref, (hidden, weight, bias))
        out = chunked_lm_head_loss(hidden, weight, labels, bias, num_items_in_batch=num_items, real_vocab=real_vocab,
                                   chunk_tokens=4)  # 21 tokens: 5 full chunks and one of 1
        grads = torch.autograd.grad(out * 3.0, (hidden, weight, bias))  # the backward scales by its incoming grad
    assert out.dtype == torch.float32 and torch.isfinite(out)
    loss_tol, grad_tol = (dict(rtol=1e-3, atol=0), 2e-2) if autocast else (dict(rtol=1e-6, atol=1e-6), 1e-5)
    torch.testing.assert_close(out, ref.float(), **loss_tol)
    for name, g, r in zip(("hidden", "weight", "bias"), grads, ref_grads):
        assert g.dtype == r.dtype and g.shape == r.shape, name
        scale = r.abs().max()
        assert ((g - 3.0 * r).abs().max() / (3.0 * scale)) < grad_tol, name
    if real_vocab is not None:
        assert grads[1][real_vocab:].abs().max() == 0 and grads[2][real_vocab:].abs().max() == 0


def test_chunked_loss_counts_only_real_targets():
    """Every target ignored but one: the loss is that one token's cross-entropy (the -100 rows add nothing)."""
    hidden, weight, bias, labels = _case()
    labels[:] = -100
    labels[1, 5] = 7  # predicted at position 4
    out = chunked_lm_head_loss(hidden, weight, labels, bias, chunk_tokens=3)
    expected = F.cross_entropy(F.linear(hidden[1, 4], weight, bias)[None], torch.tensor([7]))
    torch.testing.assert_close(out, expected)


def _mini(model_type, vocab=V):
    overrides = dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0) if model_type == "gpt2" else {}
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(mini_config(model_type, vocab_size=vocab, **overrides))


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_chunked_training_forward_equals_the_stock_forward(model_type):
    stock = _mini(model_type).train()
    chunked = use_chunked_lm_head_loss(copy.deepcopy(stock), chunk_tokens=5)
    assert inspect.signature(chunked.forward) == inspect.signature(stock.forward)  # what the Trainer inspects
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[1, :3] = -100
    for extra in ({}, {"num_items_in_batch": torch.tensor(13)}):
        batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, **extra)
        loss, grads = _loss_and_grads(chunked, batch)
        ref_loss, ref_grads = _loss_and_grads(stock, batch)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
        assert grads.keys() == ref_grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    assert chunked(input_ids=ids, labels=labels).logits is None  # training: no logits
    chunked.eval(), stock.eval()
    with torch.no_grad():
        out, ref = chunked(input_ids=ids, labels=labels), stock(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, ref.logits)  # evaluation: the stock forward
    torch.testing.assert_close(out.loss, ref.loss)


@pytest.mark.skipif(torch.__version__ < COMPILE_MIN_TORCH, reason="dynamo of torch < 2.7 cannot trace the forward")
def test_the_named_loss_keeps_a_whole_model_compile_in_one_graph():
    """GPT-2's class name (``GPT2LMHeadModel``) names no loss: transformers falls back to ``ForCausalLMLoss`` after a
    ``logger.warning_once`` inside the forward, which a whole-model ``torch.compile`` cannot trace (a graph break per
    traced forward). Named as the scripts and gpu_check build it (``with_causal_loss_type``), the same loss and
    gradients come out of one graph with no break; a ``*ForCausalLM`` class keeps its own name."""
    from torch._dynamo.utils import counters

    stock = _mini("gpt2").eval()
    assert stock.loss_type is None and _mini("llama").loss_type == "ForCausalLM"
    named = with_causal_loss_type(copy.deepcopy(stock))
    assert named.loss_type == "ForCausalLM" and with_causal_loss_type(_mini("llama")).loss_type == "ForCausalLM"
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = dict(input_ids=ids, labels=ids)
    ref_loss, ref_grads = _loss_and_grads(stock, batch)
    torch._dynamo.reset()
    counters.clear()
    try:
        loss, grads = _loss_and_grads(torch.compile(named, backend="eager"), batch)
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert {n.removeprefix("_orig_mod."): g for n, g in grads.items()}.keys() == ref_grads.keys()
    for (name, grad), ref in zip(grads.items(), ref_grads.values()):
        torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-6, msg=name)


def test_chunked_loss_refuses_transformed_logits():
    model = _mini("gpt2")
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        use_chunked_lm_head_loss(model)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_padded_vocabulary_gives_the_unpadded_logits_loss_and_gradients(model_type):
    unpadded = _mini(model_type).train()
    padded = copy.deepcopy(unpadded)
    assert pad_vocabulary(padded, V, 64) == 64 and padded.config.vocab_size == 64
    for module in (padded.get_input_embeddings(), padded.get_output_embeddings()):
        assert module.weight.shape[0] == 64
    tied = padded.get_output_embeddings().weight is padded.get_input_embeddings().weight
    assert tied == (model_type == "gpt2")
    torch.testing.assert_close(padded.get_output_embeddings().weight[:V], unpadded.get_output_embeddings().weight)
    head = padded.get_output_embeddings()
    with torch.no_grad():  # padded rows that would dominate the softmax if they were counted
        head.weight[V:] = 40.0 * torch.randn(64 - V, head.in_features)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    batch = dict(input_ids=ids, labels=ids)
    out, ref = padded(**batch), unpadded(**batch)
    torch.testing.assert_close(out.logits[..., :V], ref.logits)
    assert torch.isneginf(out.logits[..., V:]).all()
    torch.testing.assert_close(out.loss, ref.loss)
    loss, grads = _loss_and_grads(padded, batch)
    _, ref_grads = _loss_and_grads(unpadded, batch)
    for name, g in grads.items():
        if g.shape[0] == 64 and ref_grads[name].shape[0] == V:  # the embedding / head rows
            torch.testing.assert_close(g[:V], ref_grads[name], msg=name)
            assert g[V:].abs().max() == 0, name  # no gradient reaches the padded rows through the loss
        else:
            torch.testing.assert_close(g, ref_grads[name], msg=name)
    both = use_chunked_lm_head_loss(copy.deepcopy(padded), real_vocab=V, chunk_tokens=4)
    torch.testing.assert_close(both(**batch).loss, ref.loss)  # the chunked loss masks the padded columns too


def _padded_gpt2_with_loud_padding():
    model = _mini("gpt2")
    pad_vocabulary(model, V, 64)
    with torch.no_grad():
        model.transformer.wte.weight[V:] = 50.0 * torch.randn(64 - V, model.config.n_embd,
                                                               generator=torch.Generator().manual_seed(3))
    return model.eval()


def test_padded_ids_are_never_generated():
    model = _padded_gpt2_with_loud_padding()
    assert model.generation_config.suppress_tokens == list(range(V, 64))
    prompt = torch.randint(0, V, (4, 3), generator=torch.Generator().manual_seed(4))
    # control: without the mask and the suppression, greedy decoding picks padded ids
    control = copy.deepcopy(model)
    control.lm_head._forward_hooks.clear()
    control.generation_config.suppress_tokens = None
    assert (control.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, 3:] >= V).any()
    for sample in (False, True):
        torch.manual_seed(5)
        out = model.generate(prompt, max_new_tokens=16, do_sample=sample, top_k=0, pad_token_id=0)
        assert out.shape[1] == 19 and (out < V).all()
    assert sum(isinstance(h, _MaskPaddedLogits) for h in model.lm_head._forward_hooks.values()) == 1
    pad_vocabulary(model, V, 64)  # idempotent: one mask, the same suppressed ids
    assert sum(isinstance(h, _MaskPaddedLogits) for h in model.lm_head._forward_hooks.values()) == 1
    assert model.generation_config.suppress_tokens == list(range(V, 64))


# Runs in a fresh interpreter where hf_condinit cannot be imported: loads the padded checkpoint with plain
# transformers, prints its vocab size, suppressed ids and the largest id sampled.
PLAIN_LOADER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "hf_condinit":
                raise ImportError("hf_condinit is blocked in this test")
    sys.meta_path.insert(0, Blocker())
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    torch.manual_seed(0)
    prompt = torch.randint(0, int(sys.argv[2]), (8, 3))
    out = model.generate(prompt, max_new_tokens=24, do_sample=True, top_k=0, pad_token_id=0)
    print(json.dumps({"vocab_size": model.config.vocab_size, "rows": model.lm_head.weight.shape[0],
                      "suppress": model.generation_config.suppress_tokens, "max_id": int(out[:, 3:].max())}))
    """
)


def test_padded_checkpoint_loads_and_never_samples_padding_without_the_plugin(tmp_path):
    model = _padded_gpt2_with_loud_padding()
    model.save_pretrained(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", PLAIN_LOADER, str(tmp_path), str(V)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["vocab_size"] == got["rows"] == 64 and got["suppress"] == list(range(V, 64))
    assert got["max_id"] < V
