"""Trainer callback writing a run's report into its output folder when training ends: ``loss.png``, ``kappa.png``
(when ``condition_number.jsonl`` exists) and the model card ``README.md`` (:mod:`hf_condinit.reporting`).

Why a callback rather than a call after ``trainer.train``: the scripts evaluate *after* training (``run_clm.py``'s
perplexity, ``run_glue.py``'s MNLI mismatched set, ...), each in its own code. The callback writes everything at
``on_train_end`` and then refreshes the card (and ``loss.png``) on every later ``on_evaluate`` / ``on_log``, so the
final evaluation lands in the card whichever script ran it, with no call in each script. Only the world process
zero writes. A failure to draw or write is a logged warning, never a failed run.

    trainer = Trainer(...)
    RunReportCallback.attach(trainer)      # idempotent; train_and_save in scripts_common does it
    trainer.train()
"""

from __future__ import annotations

import logging
import os

from transformers import TrainerCallback

from ..reporting.model_card import write_model_card
from ..reporting.plots import TooFewPointsError, plot_kappa_layers, plot_loss
from ..reporting.runs import read_kappa_records

__all__ = ["RunReportCallback", "write_run_figures"]

logger = logging.getLogger(__name__)

LOSS_FIGURE = "loss.png"
KAPPA_FIGURE = "kappa.png"


def write_run_figures(output_dir: str, log_history: list[dict], *, kappa: bool = True) -> list[str]:
    """Draw ``loss.png`` from ``log_history`` and (with ``kappa``) ``kappa.png`` from
    ``<output_dir>/condition_number.jsonl`` when it exists. Each figure that cannot be drawn is a logged warning,
    except a loss curve with fewer than two points, which is left out with an info line. Returns the paths written."""
    written = []
    title = os.path.basename(os.path.abspath(output_dir))
    jobs = [(LOSS_FIGURE, lambda p: plot_loss(log_history, p, title=f"{title}: loss"))]
    jsonl = os.path.join(output_dir, "condition_number.jsonl")
    if kappa and os.path.isfile(jsonl):
        jobs.append((KAPPA_FIGURE, lambda p: plot_kappa_layers(read_kappa_records(jsonl), p, title=f"{title}: κ(J)")))
    for name, draw in jobs:
        path = os.path.join(output_dir, name)
        try:
            os.makedirs(output_dir, exist_ok=True)
            written.append(draw(path))
        except TooFewPointsError as e:
            logger.info(f"{name} not drawn: {e}")
        except Exception as e:  # noqa: BLE001 - a figure must never fail a run
            logger.warning(f"could not write {path}: {type(e).__name__}: {e}")
    return written


class RunReportCallback(TrainerCallback):
    """Write ``loss.png``, ``kappa.png`` and ``README.md`` when training ends; refresh the card after later
    evaluations (module docstring). Bind it to its trainer (:meth:`attach`): the card is built from the trainer
    (HF's ``TrainingSummary.from_trainer``); unbound, only the figures are written.

    Args:
        trainer (`transformers.Trainer`, *optional*): same as :meth:`bind`.
        model_card (`bool`, *optional*, defaults to `True`): write ``README.md``.
        figures (`bool`, *optional*, defaults to `True`): write ``loss.png`` / ``kappa.png``.
    """

    def __init__(self, trainer=None, *, model_card: bool = True, figures: bool = True):
        self.trainer = trainer
        self.model_card = model_card
        self.figures = figures
        self.training_ended = False

    def bind(self, trainer) -> "RunReportCallback":
        self.trainer = trainer
        return self

    @classmethod
    def attach(cls, trainer, **kwargs) -> "RunReportCallback":
        """Add a bound callback to ``trainer`` unless it already has one; returns the callback in use."""
        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, cls):
                return cb.bind(trainer)
        callback = cls(trainer, **kwargs)
        trainer.add_callback(callback)
        return callback

    def _write_card(self, args) -> None:
        if not self.model_card:
            return
        if self.trainer is None:
            logger.warning("RunReportCallback is not bound to a Trainer: no model card (use RunReportCallback.attach)")
            self.model_card = False
            return
        try:
            write_model_card(self.trainer, output_dir=args.output_dir)
        except Exception as e:  # noqa: BLE001 - the card must never fail a finished run
            logger.warning(f"could not write the model card in {args.output_dir}: {type(e).__name__}: {e}")

    def on_train_begin(self, args, state, control, **kwargs):
        self.training_ended = False

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.training_ended = True
        if self.figures:
            write_run_figures(args.output_dir, state.log_history)
        self._write_card(args)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.training_ended and state.is_world_process_zero:
            if self.figures:  # the final evaluation adds a point to the eval-loss curve
                write_run_figures(args.output_dir, state.log_history, kappa=False)
            self._write_card(args)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_ended and state.is_world_process_zero:
            self._write_card(args)
