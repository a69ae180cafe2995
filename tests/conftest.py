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
from utils import TINYSTORIES, require  # noqa: E402

transformers.logging.set_verbosity_error()


@pytest.fixture(autouse=True)
def _hooks_installed():
    """Tests that uninstall the hooks must not leak that state to the next test."""
    yield
    hf_condinit.hooks.install()


#: What a launcher (torchrun, deepspeed) sets; an in-process DeepSpeed set-up (``TrainingArguments(deepspeed=...)``)
#: writes them into ``os.environ`` for a one-process job.
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _launcher_env_restored():
    """A test that sets up DeepSpeed in-process must not leave ``LOCAL_RANK`` & co. behind: a later test's script
    subprocess would inherit them and start as a rank of a distributed job (accelerate then warns on stderr)."""
    before = {name: os.environ.get(name) for name in LAUNCHER_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def ts_file(tmp_path_factory):
    """The first 1500 lines of the TinyStories sample (about 190 kB), written to a temporary file."""
    path = tmp_path_factory.mktemp("ts") / "tinystories-head.txt"
    with open(require(TINYSTORIES), encoding="utf-8") as f:
        path.write_text("".join(f.readline() for _ in range(1500)), encoding="utf-8")
    return str(path)
