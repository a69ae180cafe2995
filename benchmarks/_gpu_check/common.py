"""Helpers of the parts (run inside the forked children): torch set-up, one row per failure, the model shapes."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def torch_setup(ctx: dict):
    import torch
    import transformers

    import hf_condinit  # noqa: F401  (hooks, variants)

    transformers.logging.set_verbosity_error()
    if ctx["threads"]:
        torch.set_num_threads(ctx["threads"])
    return torch


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dtype_of(torch, name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def warm_up(torch, device) -> None:
    """One-time costs kept out of the timings: the CUDA context, LAPACK's first SVD (used by the init schemes)."""
    torch.zeros(1, device=device)
    torch.linalg.svd(torch.randn(8, 4))
    sync(torch, device)


def free_memory(device) -> None:
    """Return what a finished (or failed) measurement held to the allocator, so the next one starts clean."""
    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 1500 else text[:1500] + " …"


@contextlib.contextmanager
def row_on_error(record, device, **fields):
    """Run the block; an ``Exception`` in it becomes one row (``fields`` + ``error`` + ``traceback``) and the part
    goes on with its next implementation, arm or build. The failed block's memory is released first."""
    failure = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - one failure costs one row
        failure = error_text(e), traceback.format_exc()[-2000:]
    if failure is not None:  # outside the except block: the traceback's frames (and their tensors) are gone
        free_memory(device)
        record(**fields, error=failure[0], traceback=failure[1])


class ArmTimeout(Exception):
    """Raised in the part's main thread when a measurement outlives its :func:`time_limit`."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "arm"):
    """Raise :class:`ArmTimeout` in the block once ``seconds`` have passed (``SIGALRM``, main thread only), and again
    every 5 s after that until the block ends (a library that catches the first one, e.g. a compiler falling back,
    does not keep the block running): a slow compile or a slower-than-planned arm costs its own row (with
    :func:`row_on_error`), not the rest of the part."""
    import signal

    def fire(signum, frame):
        raise ArmTimeout(f"{what} cut at its {seconds:.3g} s limit (a compile or its steps took longer than planned)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3), 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def shape_of(config) -> str:
    return f"{config.n_layer}×{config.n_embd} ({config.n_head} heads)"


def gpt2_json(size: str, smoke: bool) -> dict:
    """The assumed 472M / 1.72B GPT-2 shape (configs/), or its tiny smoke stand-in."""
    path = os.path.join(REPO, "configs", {"472m": "gpt2-472m.json", "1.72b": "gpt2-1.72b.json"}[size])
    with open(path) as f:
        raw = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    if smoke:
        raw.update({"472m": dict(n_layer=2, n_embd=64, n_head=4), "1.72b": dict(n_layer=2, n_embd=96, n_head=6)}[size],
                   vocab_size=250, n_positions=64)  # 250: padding to a multiple of 64 adds rows, as at 50,257
    return raw
