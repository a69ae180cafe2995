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


#: Variables (or prefixes) a library sets for itself once per process: pytest's current test, the imports of DeepSpeed,
#: scikit-learn and lm-eval, torch inductor's cache folders on the first compile. Not a test's doing, and the same for
#: every later test.
PROCESS_OWN_VARIABLES = ("PYTEST_CURRENT_TEST", "PYTORCH_NVML_BASED_CUDA_CHECK", "KMP_DUPLICATE_LIB_OK",
                         "HF_XET_HIGH_PERFORMANCE", "TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_")


def _process_state() -> dict:
    """What one test could leave behind for the next in this process: environment variables, signal handlers,
    torch.distributed's default process group, the working directory."""
    import signal

    import torch.distributed as dist

    return {
        "environment variables": {k: v for k, v in os.environ.items() if not k.startswith(PROCESS_OWN_VARIABLES)},
        "signal handlers": {s.name: signal.getsignal(s) for s in signal.valid_signals()
                            if isinstance(s, signal.Signals)},
        "a process group": dist.is_available() and dist.is_initialized(),
        "the working directory": os.getcwd(),
    }


def _restore(before: dict, after: dict) -> list[str]:
    """Put back what changed between ``before`` and ``after`` (both :func:`_process_state`); returns what changed."""
    import signal

    import torch.distributed as dist

    leaks = []
    env0, env1 = before["environment variables"], after["environment variables"]
    changed = sorted(k for k in env0.keys() | env1.keys() if env0.get(k) != env1.get(k))
    if changed:
        leaks.append(f"environment variables {changed}")
        for k in changed:
            if k in env0:
                os.environ[k] = env0[k]
            else:
                os.environ.pop(k, None)
    handlers = [n for n, h in before["signal handlers"].items() if after["signal handlers"][n] != h]
    if handlers:
        leaks.append(f"signal handlers {handlers}")
        for n in handlers:
            if before["signal handlers"][n] is not None:
                signal.signal(signal.Signals[n], before["signal handlers"][n])
    if after["a process group"] and not before["a process group"]:
        leaks.append("torch.distributed's default process group")
        dist.destroy_process_group()
    if after["the working directory"] != before["the working directory"]:
        leaks.append(f"the working directory {after['the working directory']}")
        os.chdir(before["the working directory"])
    return leaks


@pytest.fixture(autouse=True)
def _no_leaked_process_state():
    """A test must leave the process as it found it: a process group left initialised makes a later
    ``init_process_group`` fail; a launcher variable (``LOCAL_RANK`` & co., which an in-process DeepSpeed set-up
    writes) makes a later test's script subprocess start as a rank of a distributed job; a signal handler left
    installed takes a later Ctrl-C. What a test left is put back, and the test errors at teardown naming it, so the
    leak shows where it happens instead of in whichever test runs next. The first fixture of every test: what the
    test's own fixtures restore (``monkeypatch``) is restored before this looks."""
    before = _process_state()
    yield
    leaks = _restore(before, _process_state())
    if leaks:
        pytest.fail("the test left process-wide state behind: " + "; ".join(leaks), pytrace=False)


@pytest.fixture(autouse=True)
def _ctrl_c_stops_the_tests():
    """Under pytest, a run trained in this process leaves SIGINT alone: the preemption callback takes SIGTERM and
    SIGUSR1 only, so a user's Ctrl-C stops the test session (pytest's KeyboardInterrupt: a summary, exit code 2)
    instead of saving the test's run and going on with the next test. A script's or notebook's own Ctrl-C (SIGINT
    included) is tested in a subprocess, where this fixture does not reach."""
    import signal

    from hf_condinit.callbacks import preemption

    signals = preemption.SIGNALS
    preemption.SIGNALS = tuple(s for s in signals if s != signal.SIGINT)
    yield
    preemption.SIGNALS = signals


@pytest.fixture(autouse=True)
def _hooks_installed():
    """Tests that uninstall the hooks must not leak that state to the next test."""
    yield
    hf_condinit.hooks.install()


@pytest.fixture
def deepspeed_in_process():
    """For a test that builds ``TrainingArguments(deepspeed=...)`` in this process, without a launcher: what that
    leaves behind is undone afterwards: the launcher variables it writes (``RANK``, ``WORLD_SIZE``, ...), the global
    DeepSpeed config that switches ``from_config`` to ``zero.Init``, and its one-process gloo group."""
    import torch.distributed as dist
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    saved = dict(os.environ)
    yield
    unset_hf_deepspeed_config()
    os.environ.clear()
    os.environ.update(saved)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ts_file(tmp_path_factory):
    """The first 1500 lines of the TinyStories sample (about 190 kB), written to a temporary file."""
    path = tmp_path_factory.mktemp("ts") / "tinystories-head.txt"
    with open(require(TINYSTORIES), encoding="utf-8") as f:
        path.write_text("".join(f.readline() for _ in range(1500)), encoding="utf-8")
    return str(path)
