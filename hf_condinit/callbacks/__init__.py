"""Every ``transformers.TrainerCallback`` of hf_condinit, one module each.

- :mod:`.init`: :class:`ConditionedInitCallback`, apply an init scheme when training starts from scratch;
- :mod:`.condition_number`: :class:`ConditionNumberCallback`, log the attention-Jacobian condition number;
- :mod:`.report`: :class:`RunReportCallback`, write ``loss.png``, ``kappa.png`` and the model card when training ends.
"""

from .condition_number import (
    DEFAULT_EVERY_N_STEPS,
    DEFAULT_PROBE_LENGTH,
    DEFAULT_PROBE_SIZE,
    ConditionNumberCallback,
    build_probe,
)
from .init import ConditionedInitCallback
from .report import RunReportCallback

__all__ = [
    "DEFAULT_EVERY_N_STEPS",
    "DEFAULT_PROBE_LENGTH",
    "DEFAULT_PROBE_SIZE",
    "ConditionNumberCallback",
    "ConditionedInitCallback",
    "RunReportCallback",
    "build_probe",
]
