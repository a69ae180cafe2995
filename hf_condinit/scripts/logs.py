"""Quiet, HF-example logging for the scripts (:func:`setup_logging`)."""

from __future__ import annotations

import logging
import sys
import warnings

logger = logging.getLogger(__name__)


def setup_logging(training_args, logger_: logging.Logger | None = None) -> None:
    """HF-example logging: one stdout handler, per-process level (main process: info, others: warning), and quiet:
    torch's and DeepSpeed's warnings that say nothing to act on are silenced (:func:`_silence_noise`)."""
    import datasets
    import transformers

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    (logger_ or logger).setLevel(log_level)
    datasets.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    transformers.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    if training_args.disable_tqdm:  # no progress bars asked for: none from the data pipeline or saving either
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    _silence_noise()


def _silence_noise() -> None:
    """Warnings runs printed although nothing was wrong: pinned memory without an accelerator (the scripts also
    default ``--dataloader_pin_memory`` off there), DeepSpeed's deprecated-collective warnings, and DeepSpeed's
    import in runs without ``--deepspeed``."""
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
    # DeepSpeed's own collectives call torch.distributed functions torch has deprecated: nothing a user can change
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    _defer_deepspeed_import()


def _defer_deepspeed_import() -> None:
    """Do not import DeepSpeed in a run without ``--deepspeed`` (seconds of start-up and its "Setting accelerator"
    lines): accelerate's ``unwrap_model`` imports it whenever it is installed, only to test whether the model is a
    ``DeepSpeedEngine``. A model can only be one once DeepSpeed is imported (``--deepspeed`` imports it while
    parsing), so that test is asked first."""
    try:
        import accelerate.utils.other as accelerate_other
    except ImportError:  # pragma: no cover
        return
    available = accelerate_other.is_deepspeed_available
    if getattr(available, "deferred", False):
        return

    def imported_and_available() -> bool:
        return "deepspeed" in sys.modules and available()

    imported_and_available.deferred = True
    accelerate_other.is_deepspeed_available = imported_and_available
