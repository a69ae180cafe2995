"""Stop a run whose loss becomes non-finite, with an error (never a success with ``"perplexity": NaN``)."""

from __future__ import annotations

import math
import os

from transformers import TrainerCallback

__all__ = ["NonFiniteLossCallback", "NonFiniteLossError"]


class NonFiniteLossError(RuntimeError):
    """Training diverged: a logged loss or gradient norm is NaN or ±inf."""


class NonFiniteLossCallback(TrainerCallback):
    """Raise :class:`NonFiniteLossError` when a logged ``loss``, ``grad_norm`` or ``*_loss`` (``eval_loss``,
    ``train_loss``) is NaN or ±inf, naming the key, the step and what to try.

    It sees what ``trainer.log`` sees, i.e. every ``--logging_steps`` steps and at each evaluation. HF's
    ``logging_nan_inf_filter`` (on by default) replaces a non-finite step loss by the running mean before logging,
    so the scripts turn it off by default (``SCRIPT_DEFAULTS``); ``grad_norm`` is never filtered and catches the
    rest. ``hf_condinit.scripts_common.CondInitTrainer`` adds this callback to every trainer.

    ``resumed_from``: the checkpoint this segment resumed from (set by ``CondInitTrainer.train``), until the segment's
    first save. A non-finite value in those steps names it, and the previous complete checkpoint to resume from
    instead (a checkpoint damaged in a way its checks cannot see), rather than the init."""

    def __init__(self):
        self.resumed_from: str | None = None

    def on_save(self, args, state, control, **kwargs):
        self.resumed_from = None
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key, value in (logs or {}).items():
            if not (key in ("loss", "grad_norm") or key.endswith("_loss")):
                continue
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise NonFiniteLossError(f"{key} became {value} at step {state.global_step}: {self._advice()}")
        return control

    def _advice(self) -> str:
        if self.resumed_from is None:
            return ("training diverged; check the init options for NaN/inf, lower --learning_rate, or use "
                    "--max_grad_norm / fp32.")
        from ..checkpoints import checkpoint_step, newest_complete_checkpoint

        step = checkpoint_step(self.resumed_from)
        folder = os.path.dirname(os.path.normpath(self.resumed_from))
        previous = newest_complete_checkpoint(folder, below=step) if step is not None else None
        instead = (f"rerun with --resume_from_checkpoint {previous}" if previous
                   else "no earlier complete checkpoint exists: start over with a new --output_dir")
        return (f"the first steps after resuming from {self.resumed_from}, which may be damaged; {instead} (if that "
                f"diverges too, lower --learning_rate or use --max_grad_norm / fp32).")
