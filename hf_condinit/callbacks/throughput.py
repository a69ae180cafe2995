"""`ThroughputCallback`: tokens/s, MFU and peak accelerator memory on every training log line.

What it adds to each training log (the dict the Trainer hands to ``on_log``, hence to every ``report_to``
integration that runs after it, and to the same entry of ``state.log_history``, hence ``trainer_state.json``):

==================================  ============================================================================
key                                 value
==================================  ============================================================================
``throughput/tokens_per_second``    training tokens this process fed to the model per second of step time since
                                    the previous log (per device, like torchtitan's ``tps``)
``throughput/seconds_per_step``     mean step time of the same window
``throughput/tflops``               achieved model TFLOP/s per device (`hf_condinit.perf.training_flops`)
``throughput/mfu``                  achieved FLOP/s over the device's dense bf16 peak, 0–1 (only when the peak is
                                    known: `hf_condinit.perf.PEAK_BF16_TFLOPS`)
``throughput/peak_memory_gib``      ``max_memory_allocated`` of the window, GiB (accelerators only)
``throughput/peak_reserved_gib``    ``max_memory_reserved`` of the window, GiB (accelerators only)
==================================  ============================================================================

Tokens are counted by a forward pre-hook on the model (``input_ids`` or ``inputs_embeds``; training forwards only),
from shapes alone (padding included: the FLOPs are spent on it), so no device synchronisation is needed for
counting. Step time is the wall time from ``on_step_begin`` to ``on_step_end`` (the micro-batches of a step are
fetched before ``on_step_begin``), with the device synchronised at both ends; evaluation, checkpointing and other
callbacks' work between steps are excluded. Add the callback with `add_throughput_callback` so that it runs before
the ``report_to`` callbacks (they read the same ``logs`` dict after it).
"""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback

from ..perf import accelerator_memory, mfu, model_flops_shape, peak_bf16_flops, reset_accelerator_peak, training_flops
from ..parallel import unwrap_model

__all__ = ["ThroughputCallback", "add_throughput_callback", "PREFIX"]

PREFIX = "throughput/"


class ThroughputCallback(TrainerCallback):
    """Adds tokens/s, MFU and peak memory to every training log line (see the module docstring for the keys).

    Args:
        peak_flops (`float`, *optional*): the device's peak FLOP/s for MFU; default: looked up from the device name
            (`hf_condinit.perf.peak_bf16_flops`), no MFU when unknown.
    """

    def __init__(self, peak_flops: float | None = None):
        self.peak_flops = peak_flops
        self._handle = None
        self._shape = None  # (N, L, D) of training_flops
        self._device = None
        self._reset_window()

    def _reset_window(self) -> None:
        self._tokens = 0
        self._flops = 0.0
        self._seconds = 0.0
        self._steps = 0
        self._t0 = None

    # -- counting ---------------------------------------------------------------------------------------------------

    def _count(self, module, args, kwargs):
        if not module.training:
            return None
        x = kwargs.get("input_ids")
        if x is None and args:
            x = args[0] if isinstance(args[0], torch.Tensor) else None
        if x is None:
            emb = kwargs.get("inputs_embeds")
            x = emb[..., 0] if emb is not None else None
        if x is None or x.ndim < 2:
            return None
        batch, seq = int(x.shape[0]), int(x.shape[-1])
        self._tokens += batch * seq
        if self._shape is not None:
            self._flops += training_flops(*self._shape, batch, seq)
        return None

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    # -- events -----------------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model = unwrap_model(model)
        if self._handle is None and model is not None:
            self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)
        try:
            self._shape = model_flops_shape(model)
        except (AttributeError, TypeError):  # not a transformer config: tokens/s and memory only
            self._shape = None
        self._device = args.device
        if self.peak_flops is None:
            self.peak_flops = peak_bf16_flops(self._device)
        self._reset_window()
        reset_accelerator_peak(self._device)

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is None:
            return
        self._sync()
        self._seconds += time.perf_counter() - self._t0
        self._steps += 1
        self._t0 = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._steps == 0:
            return  # evaluation / final summary logs, or nothing trained since the last log
        metrics = {f"{PREFIX}seconds_per_step": self._seconds / self._steps}
        if self._tokens:
            metrics[f"{PREFIX}tokens_per_second"] = self._tokens / self._seconds
        if self._flops:
            metrics[f"{PREFIX}tflops"] = self._flops / self._seconds / 1e12
            value = mfu(self._flops, self._seconds, self.peak_flops)
            if value is not None:
                metrics[f"{PREFIX}mfu"] = value
        memory = accelerator_memory(self._device)
        if memory is not None:
            metrics[f"{PREFIX}peak_memory_gib"] = memory["peak_allocated"] / 2**30
            metrics[f"{PREFIX}peak_reserved_gib"] = memory["peak_reserved"] / 2**30
            reset_accelerator_peak(self._device)
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)  # the Trainer appended its copy before calling on_log
        self._reset_window()

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def add_throughput_callback(trainer, callback: ThroughputCallback | None = None) -> ThroughputCallback:
    """Add ``callback`` (default: a new `ThroughputCallback`) to ``trainer`` as its *first* callback.

    The ``report_to`` integrations are callbacks too and read the ``logs`` dict in ``on_log`` in list order;
    ``trainer.add_callback`` would append after them, so their records would miss the throughput keys.
    """
    callback = callback or ThroughputCallback()
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
