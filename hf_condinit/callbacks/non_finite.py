"""Stop a run whose loss becomes non-finite, with an error (never a success with ``"perplexity": NaN``)."""

from __future__ import annotations

import math

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
    rest. ``hf_condinit.scripts_common.CondInitTrainer`` adds this callback to every trainer."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key, value in (logs or {}).items():
            if not (key in ("loss", "grad_norm") or key.endswith("_loss")):
                continue
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{key} became {value} at step {state.global_step}: training diverged; check the init options "
                    f"for NaN/inf, lower --learning_rate, or use --max_grad_norm / fp32."
                )
        return control
