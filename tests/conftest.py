"""Test settings: no hub access, deterministic seeds, quiet logs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest  # noqa: E402
import transformers  # noqa: E402

import hf_condinit  # noqa: E402,F401  (installs the hooks for every test)

transformers.logging.set_verbosity_error()


@pytest.fixture(autouse=True)
def _hooks_installed():
    """Tests that uninstall the hooks must not leak that state to the next test."""
    yield
    hf_condinit.hooks.install()
