"""Part c: attention speed, memory and kernels of each implementation on 4 GPT-2 layers of the 472M shape.

Forward + backward of a ``GPT2Model`` with 4 layers, 1280 wide, 20 heads of 64, bf16, 32,768 tokens per step (batch
32 / 8 / 4 at sequence 1024 / 4096 / 8192), through ``benchmarks/attention_speed.py``: tokens/s and peak
``torch.cuda.max_memory_allocated``, as ratios to sdpa at the same length. Each implementation is measured on its
own (an out-of-memory or kernel error is that implementation's row; the others go on).

Kernels: for each implementation, one forward + backward under ``torch.profiler`` lists the SDPA operators that ran
(``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention``, ``..._attention_math``: the kernel family picked
by default), then one forward + backward per restriction ``torch.nn.attention.sdpa_kernel(...)`` — flash only,
memory-efficient only, cuDNN only, and every fused one (the math kernel disabled) — records whether it runs and
the families that ran (profiled again: a kernel called directly, as the sink's fast path calls its flash kernel,
runs whatever SDPA is restricted to). eager calls no SDPA operator and runs under any restriction. For the attention
sink, the row also says which path each call took and why (``sink_kernel``: the fused kernel returning lse, or the
virtual-key fallback through SDPA, with the condition that decided it), recorded from the calls of the profiled
step (`hf_condinit.attention.attention_sink.fast.lse_kernel_choice`), beside the operators the profiler saw.
"""

from __future__ import annotations

import argparse
import collections
import contextlib

from .common import free_memory, row_on_error, torch_setup

SPEED_IMPLS = ("sdpa", "eager", "affine_scaled", "attention_sink", "preconditioned", "spectral")
LAYERS = 4
TOKENS = 32768
KERNEL_SEQ = 1024
KERNEL_TOKENS = 4096
FAMILIES = ("flash", "efficient", "cudnn", "math")


def settings_for(ctx: dict) -> argparse.Namespace:
    smoke = ctx["smoke"]
    return argparse.Namespace(
        layers=2 if smoke else LAYERS, hidden=32 if smoke else 1280, heads=2 if smoke else 20, batch=1,
        tokens=128 if smoke else TOKENS, seqs=[32] if smoke else [1024, 4096, 8192], impls=list(SPEED_IMPLS),
        warmup=1 if smoke else 2, reps=1 if smoke else 5, threads=ctx["threads"], clock="wall",
        device=ctx["device"], dtype="fp32" if smoke else "bf16",
    )


def part_c(ctx: dict, record) -> None:
    import attention_speed

    torch = torch_setup(ctx)
    settings = settings_for(ctx)
    record(kind="settings", **vars(settings),
           memory=("torch.cuda.max_memory_allocated over the allocation before the step" if ctx["device"] != "cpu"
                   else "process peak RSS over the RSS before the step"))
    kernel_seq = settings.seqs[0] if ctx["smoke"] else KERNEL_SEQ
    for impl in SPEED_IMPLS:
        with row_on_error(record, ctx["device"], kind="kernels", impl=impl, seq=kernel_seq):
            record(kind="kernels", impl=impl, seq=kernel_seq, **kernel_families(torch, impl, kernel_seq, settings))
        free_memory(ctx["device"])
    for seq in settings.seqs:  # one length at a time, one implementation at a time: a failure costs one row
        base = None
        for impl in SPEED_IMPLS:
            with row_on_error(record, ctx["device"], kind="speed", impl=impl, seq=seq):
                (r,) = attention_speed.measure(argparse.Namespace(**{**vars(settings), "seqs": [seq],
                                                                     "impls": [impl]}))
                if impl == "sdpa":
                    base = r
                record(kind="speed", impl=impl, seq=seq, batch=r["batch"], tokens_per_s=r["tokens_per_s"],
                       seconds=r["seconds"], peak_mem_bytes=r["peak_mem_bytes"],
                       throughput_vs_sdpa=r["tokens_per_s"] / base["tokens_per_s"] if base else None,
                       memory_vs_sdpa=(r["peak_mem_bytes"] / base["peak_mem_bytes"]
                                       if base and base["peak_mem_bytes"] > 0 else None))
            free_memory(ctx["device"])


def _family(op_name: str) -> str | None:
    name = op_name.lower()
    if "_scaled_dot_product" not in name:  # the kernels' operators, not the dispatching scaled_dot_product_attention
        return None
    for family in ("flash", "efficient", "cudnn", "math"):
        if family in name:
            return family
    return "other"


def _profiled(step) -> list[str]:
    """The SDPA kernel operators (`_family`) that one call of ``step`` ran, from the profiler's operator names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sorted({e.key for e in prof.key_averages() if _family(e.key)})


@contextlib.contextmanager
def _sink_choices(calls: list):
    """Append each (kernel, why) of `lse_kernel_choice` that the attention sink's forward decides while inside."""
    from hf_condinit.attention.attention_sink import fast as attention_sink

    real = attention_sink.lse_kernel

    def spy(*args):
        calls.append(attention_sink.lse_kernel_choice(*args))
        return calls[-1][0]

    attention_sink.lse_kernel = spy
    try:
        yield
    finally:
        attention_sink.lse_kernel = real


def kernel_families(torch, impl: str, seq: int, settings) -> dict:
    """``ran``: the SDPA kernel families of one default forward + backward (from the profiler's operator names);
    ``runs_on``: family (or ``"fused (no math)"``) → whether a forward + backward runs under that restriction, and
    ``ran_under``: the families that ran there; ``why_not``: the first line of each refusal; for the attention sink,
    ``sink_kernel``: each path its calls took in the default step, with the reason and the number of calls."""
    import attention_speed
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = torch.device(settings.device)
    args = argparse.Namespace(**{**vars(settings), "seqs": [seq]})
    model = attention_speed.build(impl, seq, args)
    batch = max(1, (KERNEL_TOKENS if device.type == "cuda" else settings.tokens) // seq)
    ids = torch.randint(0, 1024, (batch, seq), device=device)

    def step():
        model(input_ids=ids).last_hidden_state.float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    choices = []
    with _sink_choices(choices):
        ops = _profiled(step)
    restrictions = {"flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                    "cudnn": [SDPBackend.CUDNN_ATTENTION],
                    "fused (no math)": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                        SDPBackend.CUDNN_ATTENTION]}
    runs_on, ran_under, why_not = {}, {}, {}
    for label, backends in restrictions.items():
        try:
            with sdpa_kernel(backends):
                ran_under[label] = _families(_profiled(step))
            runs_on[label] = True
        except Exception as e:  # noqa: BLE001 - "cannot run there" is the answer
            runs_on[label] = False
            why_not[label] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            model.zero_grad(set_to_none=True)
    row = dict(batch=batch, sdpa_ops=ops, ran=_families(ops), runs_on=runs_on, ran_under=ran_under, why_not=why_not)
    if choices:
        row["sink_kernel"] = [dict(kernel=kernel or "fallback (a virtual key through SDPA)", why=why, calls=n)
                              for (kernel, why), n in collections.Counter(choices).items()]
    return row


def _families(ops: list[str]) -> list[str]:
    return sorted({_family(op) for op in ops}) or ["none (no SDPA call)"]
