"""Every ``transformers.TrainerCallback`` of hf_condinit, one module each.

- :mod:`.init`: :class:`ConditionedInitCallback`, apply an init scheme when training starts from scratch;
- :mod:`.condition_number`: :class:`ConditionNumberCallback`, log the attention-Jacobian condition number;
- :mod:`.report`: :class:`RunReportCallback`, write ``loss.png``, ``kappa.png`` and the model card when training ends.
- :mod:`.throughput`: :class:`ThroughputCallback`, tokens/s, MFU and peak accelerator memory on every log line.
- :mod:`.non_finite`: :class:`NonFiniteLossCallback`, stop a run whose loss becomes NaN/inf with an error.
- :mod:`.preemption`: :class:`PreemptionCallback`, SIGTERM / SIGINT / SIGUSR1 save a checkpoint and stop cleanly.
- :mod:`.run_totals`: :class:`RunTotalsCallback`, the run's loss and wall time over every resumed segment.
- :mod:`.periodic_checkpoint`: :class:`PeriodicCheckpointCallback`, a checkpoint every so many minutes of training.
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
from .throughput import ThroughputCallback, add_throughput_callback
from .non_finite import NonFiniteLossCallback, NonFiniteLossError
from .periodic_checkpoint import PeriodicCheckpointCallback
from .preemption import PREEMPTED_EXIT_CODE, PreemptionCallback, TrainingPreempted
from .run_totals import RunTotalsCallback

__all__ = [
    "DEFAULT_EVERY_N_STEPS",
    "DEFAULT_PROBE_LENGTH",
    "DEFAULT_PROBE_SIZE",
    "ConditionNumberCallback",
    "ConditionedInitCallback",
    "RunReportCallback",
    "ThroughputCallback",
    "add_throughput_callback",
    "NonFiniteLossCallback",
    "NonFiniteLossError",
    "PREEMPTED_EXIT_CODE",
    "PeriodicCheckpointCallback",
    "PreemptionCallback",
    "RunTotalsCallback",
    "TrainingPreempted",
    "build_probe",
]
