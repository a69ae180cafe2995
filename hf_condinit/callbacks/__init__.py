"""Every ``transformers.TrainerCallback`` of hf_condinit, one module each.

- :mod:`.init`: :class:`ConditionedInitCallback`, apply an init scheme when training starts from scratch;
- :mod:`.condition_number`: :class:`ConditionNumberCallback`, log the attention-Jacobian condition number;
- :mod:`.non_finite`: :class:`NonFiniteLossCallback`, stop a run whose loss becomes NaN/inf with an error.
"""

from .condition_number import (
    DEFAULT_EVERY_N_STEPS,
    DEFAULT_PROBE_LENGTH,
    DEFAULT_PROBE_SIZE,
    ConditionNumberCallback,
    build_probe,
)
from .init import ConditionedInitCallback
from .non_finite import NonFiniteLossCallback, NonFiniteLossError

__all__ = [
    "DEFAULT_EVERY_N_STEPS",
    "DEFAULT_PROBE_LENGTH",
    "DEFAULT_PROBE_SIZE",
    "ConditionNumberCallback",
    "ConditionedInitCallback",
    "NonFiniteLossCallback",
    "NonFiniteLossError",
    "build_probe",
]
