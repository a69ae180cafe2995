"""`ConditionedInitCallback`: apply an init scheme when training starts from scratch, never on resume."""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from ..api import apply_init
from ..config import resolve_condinit

__all__ = ["ConditionedInitCallback"]

logger = logging.getLogger(__name__)


class ConditionedInitCallback(TrainerCallback):
    """Apply ``condinit`` to the model in ``on_train_begin`` of a run that starts at step 0.

    Args:
        condinit (`bool`, `str`, `dict` or `CondInitConfig`, defaults to `True`): as ``condinit=`` on
            ``from_config``.
        overwrite_loaded (`bool`, defaults to `False`): by default a model whose attention weights were loaded
            by ``from_pretrained`` raises instead of being re-initialised; set True to re-initialise on purpose.

    When the Trainer resumes from a checkpoint (``state.global_step > 0`` at ``on_train_begin``) it does nothing,
    so resumed weights are never touched. (A Trainer resume needs torch >= 2.6: below it transformers refuses to
    torch.load the checkpoint's optimizer, scheduler and RNG state, CVE-2025-32434, before ``on_train_begin``.)
    The `InitReport` of the last application is kept in ``self.report``.
    Under DeepSpeed ZeRO-3 every rank runs it and parameters are gathered per block.
    """

    def __init__(self, condinit: Any = True, overwrite_loaded: bool = False):
        self.condinit = resolve_condinit(condinit)
        if self.condinit is None:
            raise ValueError("ConditionedInitCallback needs an init to apply; got condinit=False/None.")
        self.overwrite_loaded = overwrite_loaded
        self.report = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step > 0:
            logger.info("hf_condinit: resuming at step %d, init left untouched.", state.global_step)
            return
        if model is None:
            raise ValueError("ConditionedInitCallback needs the Trainer to pass `model` to on_train_begin.")
        self.report = apply_init(model, self.condinit, overwrite_loaded=self.overwrite_loaded)
        if state.is_world_process_zero:
            logger.info("%s", self.report)
