"""Attention sink from the fused kernel's own log-sum-exp (`hf_condinit.attention.attention_sink.fast.SinkAttention`).

out = σ(lse − s)·O with O, lse from one kernel call over the real keys, and a hand-written backward (the kernel's
own backward with the sink's log-normaliser, plus ∂L/∂s). Checked against autograd of the naive formula in float64
(`torch.autograd.gradcheck`, causal / padded with a fully masked row / GQA), against the naive N×N reference in a
model in bf16 (per tensor, against the reference's own bf16 error: `benchmarks/_gpu_check/judge.py`), and that the
fast path really runs (no widened head) where it should, and the fallback where it must (attention dropout). GQA: the
CPU kernel reads fewer KV heads than query heads only from torch 2.9 (`kernel_takes_gqa`); before, the KV heads are
repeated first, and a GQA model's fast path equals the reference whichever way the version check sends it.
The CUDA branch, which no CPU test could run, runs with the CUDA ops served by the CPU kernel after binding each call
to the running torch's own schema (`_CudaFlashOnTheCpu`): CI runs it on its torch, the floors' and the GPU machine's.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

import hf_condinit  # noqa: F401
from hf_condinit.attention.attention_sink import fast as sink_module
from hf_condinit.attention.attention_sink.fast import (
    SinkAttention,
    _additive_mask,
    lse_kernel,
    lse_kernel_choice,
    sink_attention,
)
from hf_condinit.attention.reference import randomise_holders, register_references
from utils import REPO, mini_config

sys.path.insert(0, str(REPO / "benchmarks"))
from _gpu_check import correctness  # noqa: E402

register_references()


def _naive(q, k, v, s, vis, scale):
    """p_ij = e^{l_ij} / (e^{s_h} + Σ_visible e^{l_ij}), out = p·v; float64 autograd reference."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    logits = (q @ k.transpose(-1, -2) * scale).masked_fill(~vis, float("-inf"))
    full = torch.cat([s.view(1, -1, 1, 1).expand(*logits.shape[:3], 1), logits], dim=-1)
    return torch.softmax(full, dim=-1)[..., 1:] @ v


@pytest.mark.parametrize("case", ["causal", "padded", "gqa"])
def test_sink_attention_forward_and_gradcheck_float64(case):
    gen = torch.Generator().manual_seed(0)
    B, H, Q, d = 2, 2, 4, 3
    Hkv = 1 if case == "gqa" else H
    q = torch.randn(B, H, Q, d, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, Hkv, Q, d, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    s = torch.randn(H, generator=gen, dtype=torch.float64, requires_grad=True)
    vis = torch.ones(Q, Q, dtype=torch.bool).tril().expand(B, 1, Q, Q)
    mask, causal = None, True
    if case == "padded":
        vis = vis.clone()
        vis[0, :, :, :2] = False  # left padding: rows 0 and 1 of sequence 0 see no key at all
        mask, causal = _additive_mask(vis, torch.float64), False
    scale = 0.7
    fast = sink_attention(q, k, v, s, mask, causal, scale, 0.0, "cpu")
    torch.testing.assert_close(fast, _naive(q, k, v, s, vis, scale), rtol=1e-10, atol=1e-12)
    if case == "padded":
        assert torch.equal(fast[0, :, :2], torch.zeros_like(fast[0, :, :2]))  # fully masked rows output 0
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: sink_attention(q, k, v, s, mask, causal, scale, 0.0, "cpu"), (q, k, v, s))


def test_gqa_without_kernel_support_is_refused_not_run(monkeypatch):
    """Fewer KV heads than query heads straight into `SinkAttention` where the kernel cannot take them: an error,
    never the kernel (before torch 2.9 it reads and writes out of bounds)."""
    monkeypatch.setattr(sink_module, "CPU_KERNEL_TAKES_GQA", False)
    q, kv = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="2 key/value heads for 4 query heads"):
        SinkAttention.apply(q, kv, kv, torch.zeros(4), None, True, 1.0, 0.0, "cpu")


@pytest.mark.parametrize("capability", ["native", "forced_off"])
@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
def test_gqa_model_fast_path_matches_the_naive_formula(monkeypatch, capability, padded):
    """Llama with 4 query heads over 2 KV heads, training forward + backward: the fast path's output and every
    gradient (the sink logits' included) equal the naive formula's (`attention_sink_reference`, fp32 scores: the
    tolerance of tests/attention/test_attention_variants.py), and the kernel got
    the KV heads the capability check decided: 2 where the running torch's CPU kernel takes GQA (torch >= 2.9),
    else 4 (repeated before the call); 4 with the capability forced off on any torch."""
    if capability == "forced_off":
        monkeypatch.setattr(sink_module, "CPU_KERNEL_TAKES_GQA", False)
    expected_kv_heads = 2 if sink_module.CPU_KERNEL_TAKES_GQA else 4
    assert sink_module.CPU_KERNEL_TAKES_GQA == (capability == "native" and torch.__version__ >= (2, 9))
    seen = []
    real = SinkAttention.forward

    def spy(ctx, query, key, value, *args):
        seen.append((query.shape[1], key.shape[1], value.shape[1]))
        return real(ctx, query, key, value, *args)

    monkeypatch.setattr(SinkAttention, "forward", staticmethod(spy))
    monkeypatch.setattr(sink_module, "_virtual_key_attention", lambda *a, **k: pytest.fail("fallback used"))
    torch.manual_seed(0)
    config = mini_config("llama", attention_dropout=0.0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attention_sink").train()
    randomise_holders(model)
    assert config.num_attention_heads == 4 and config.num_key_value_heads == 2
    ids = torch.randint(3, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0
    results = {}
    for impl in ("attention_sink", "attention_sink_reference"):
        model.config._attn_implementation = impl
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask if padded else None).logits
        logits.square().sum().backward()
        results[impl] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (fast, fast_grads), (ref, ref_grads) = results["attention_sink"], results["attention_sink_reference"]
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    assert fast_grads.keys() == ref_grads.keys() and any("condinit_sink" in n for n in fast_grads)
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)
    assert seen == [(4, expected_kv_heads, expected_kv_heads)] * config.num_hidden_layers


def _gpt2(**kwargs):
    torch.manual_seed(0)
    config = mini_config("gpt2", resid_pdrop=0.0, embd_pdrop=0.0, **kwargs)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attention_sink")
    randomise_holders(model)
    return model


def test_fast_path_runs_with_the_head_dim_unchanged(monkeypatch):
    """CPU, no attention dropout: one kernel call on the real q/k/v (head dim 8), never the widened fallback."""
    model = _gpt2(attn_pdrop=0.0)
    seen = []
    real = SinkAttention.forward

    def spy(ctx, query, key, value, *args):
        seen.append((query.shape[-1], key.shape[-1], value.shape[-1]))
        return real(ctx, query, key, value, *args)

    monkeypatch.setattr(SinkAttention, "forward", staticmethod(spy))
    monkeypatch.setattr(sink_module, "_virtual_key_attention", lambda *a, **k: pytest.fail("fallback used"))
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    for attention_mask in (None, mask):
        model(input_ids=ids, attention_mask=attention_mask).logits.square().sum().backward()
    assert seen == [(8, 8, 8)] * 4


def test_attention_dropout_uses_the_fallback():
    q = torch.zeros(1, 2, 3, 8)
    assert lse_kernel(q, q, q, None, 0.1) is None and lse_kernel(q, q, q, None, 0.0) == "cpu"
    model = _gpt2(attn_pdrop=0.5).train()
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids).logits.square().sum().backward()  # runs, with a gradient for the sink logit
    assert model.transformer.h[0].attn.condinit_sink.logit.grad.abs().sum() > 0


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_gpt2_head_dim_64_matches_the_reference_per_tensor(dtype_name, padded):
    """GPT-2 with head dim 64 (4 × 256), training forward + backward: output and every gradient (the sink logit's
    included) against the fp32 reference, each tensor on its own scale; bf16 within the judge's limit relative to
    the bf16 reference's own error (`benchmarks/_gpu_check/judge.py`)."""
    verdict = correctness.train_case(torch, "gpt2", "attention_sink", dtype_name, padded, torch.device("cpu"),
                                     tiny=False)
    assert verdict["passed"], {k: verdict[k] for k in ("worst_tensor", "rel_err", "ref_rel_err", "limit")}
    names = [t[0] for t in verdict["tensors"]]
    assert any("condinit_sink" in n for n in names)


class _CudaFlashOnTheCpu(TorchDispatchMode):
    """Serves the CUDA flash kernel's two ops (`_scaled_dot_product_flash_attention` and its backward) with the CPU
    kernel, after binding the call to the running torch's own schema by argument name. The forward's bookkeeping
    outputs are sentinels (cum_seq 101 / 102, RNG state 11 / 22, debug mask); the backward records what it was given
    under the schema's names, so a test can check that each reached the argument the CUDA kernel reads it as."""

    FORWARD = torch.ops.aten._scaled_dot_product_flash_attention.default
    BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default

    def __init__(self):
        super().__init__()
        self.calls = {}

    @staticmethod
    def _bind(func, args, kwargs) -> dict:
        params = func._schema.arguments
        assert len(args) <= sum(not p.kwarg_only for p in params) and set(kwargs) <= {p.name for p in params}
        bound = {p.name: p.default_value if p.has_default_value() else None for p in params}
        bound.update({p.name: a for p, a in zip(params, args)}, **kwargs)
        return bound

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in (self.FORWARD, self.BACKWARD):
            return func(*args, **(kwargs or {}))
        a = self.calls[func] = self._bind(func, args, kwargs or {})
        q, k, v = a["query"], a["key"], a["value"]
        if func is self.FORWARD:
            assert a["dropout_p"] == 0.0 and a["return_debug_mask"] is False
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, a["is_causal"], scale=a["scale"])
            ints = (torch.tensor([101], dtype=torch.int32), torch.tensor([102], dtype=torch.int32),
                    torch.tensor(11), torch.tensor(22))
            return out, lse, ints[0], ints[1], q.shape[2], k.shape[2], ints[2], ints[3], torch.empty(0, dtype=q.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            a["grad_out"], q, k, v, a["out"], a["logsumexp"], a["dropout_p"], a["is_causal"], scale=a["scale"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
def test_the_cuda_kernel_branch_passes_each_value_where_the_running_torchs_schema_reads_it(dtype):
    """`SinkAttention`'s CUDA branch (never run by a CPU test otherwise) with the two CUDA ops served by the CPU
    kernel (`_CudaFlashOnTheCpu`): the call binds to this torch's schemas (the GPU machine's torch 2.11 in CI's
    GPU-stack pass, the floors' 2.5, CI's own), the forward's cum_seq / max / RNG outputs reach the backward's
    cum_seq_q/k, max_q/k and philox_seed/offset, the backward gets the sink's log-normaliser, and output and every
    gradient equal the CPU branch's and the naive formula's."""
    gen = torch.Generator().manual_seed(0)
    B, H, Q, d, scale = 2, 3, 5, 8, 0.4
    leaves = [torch.randn(B, H, Q, d, generator=gen, dtype=torch.float64) for _ in range(3)]
    leaves.append(torch.randn(H, generator=gen, dtype=torch.float64))  # the sink logits, fp32 beside bf16 q / k / v
    results = {}
    for kernel in ("cuda", "cpu"):
        q, k, v = (t.to(dtype, copy=True).requires_grad_() for t in leaves[:3])
        s = leaves[3].to(torch.promote_types(dtype, torch.float32), copy=True).requires_grad_()
        mode = _CudaFlashOnTheCpu()
        with mode:
            out = SinkAttention.apply(q, k, v, s, None, True, scale, 0.0, kernel)
            out.backward(torch.ones_like(out))
        results[kernel] = (out, q.grad, k.grad, v.grad, s.grad)
        if kernel == "cpu":
            assert not mode.calls
            continue
        fwd, bwd = mode.calls[mode.FORWARD], mode.calls[mode.BACKWARD]
        assert (fwd["is_causal"], fwd["scale"]) == (True, scale)
        assert [bwd[n].tolist() for n in ("cum_seq_q", "cum_seq_k", "philox_seed", "philox_offset")] == [
            [101], [102], 11, 22]
        assert (bwd["max_q"], bwd["max_k"], bwd["dropout_p"], bwd["is_causal"], bwd["scale"]) == (
            Q, Q, 0.0, True, scale)
        assert bwd["out"].dtype == dtype and bwd["logsumexp"].dtype == torch.promote_types(dtype, torch.float32)
        lse_plain = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) * scale + torch.full(
            (Q, Q), float("-inf"), dtype=torch.float64).triu(1), dim=-1)
        lse_tol = 1e-10 if dtype == torch.float64 else 1e-2
        torch.testing.assert_close(bwd["logsumexp"].double(), torch.logaddexp(lse_plain, s.double().view(1, H, 1)),
                                   rtol=lse_tol, atol=lse_tol)  # the sink's log-normaliser, not the kernel's
    for got, ref in zip(results["cuda"], results["cpu"]):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    q, k, v, s = (t.detach().clone().requires_grad_() for t in leaves)
    vis = torch.ones(Q, Q, dtype=torch.bool).tril().expand(B, 1, Q, Q)
    naive = _naive(q, k, v, s, vis, scale)
    naive.backward(torch.ones_like(naive))
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-2, "atol": 2e-2}
    for got, ref in zip(results["cuda"], (naive, q.grad, k.grad, v.grad, s.grad)):
        torch.testing.assert_close(got.double(), ref.double(), **tol)


def test_the_cuda_kernel_is_chosen_only_where_the_flash_kernel_takes_the_call():
    """`lse_kernel_choice` on CUDA inputs (stand-ins carrying the device, dtype and shape it reads): the CUDA flash
    kernel for fp16 / bf16, no mask, equal head counts, head dims a multiple of 8 up to 256; the fallback otherwise."""
    cuda = torch.device("cuda")

    def t(heads=4, head_dim=64, dtype=torch.bfloat16):
        return SimpleNamespace(device=cuda, dtype=dtype, shape=(2, heads, 16, head_dim))

    assert lse_kernel_choice(t(), t(), t(), None, 0.1)[0] == "cuda"  # dropout: the kernel's own RNG
    assert lse_kernel_choice(t(dtype=torch.float16), t(dtype=torch.float16), t(dtype=torch.float16), None, 0.0)[0] \
        == "cuda"
    assert lse_kernel_choice(t(head_dim=256), t(head_dim=256), t(head_dim=256), None, 0.0)[0] == "cuda"
    refused = {
        "a mask": (t(), t(), t(), object()),
        "fp32": (t(dtype=torch.float32), t(dtype=torch.float32), t(dtype=torch.float32), None),
        "GQA": (t(), t(heads=2), t(heads=2), None),
        "head dim 60": (t(head_dim=60), t(head_dim=60), t(head_dim=60), None),
        "head dim 264": (t(head_dim=264), t(head_dim=264), t(head_dim=264), None),
        "v's head dim differs": (t(), t(), t(head_dim=32), None),
    }
    for case, (q, k, v, mask) in refused.items():
        kernel, why = lse_kernel_choice(q, k, v, mask, 0.0)
        assert kernel is None and why, case
