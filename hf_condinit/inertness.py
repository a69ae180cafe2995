"""Inertness: ``import hf_condinit`` must not change a model that did not ask for it, for any model type.

`check_inert(model_type)` builds the model type's miniature (`hf_condinit.layouts.miniature.shrink_config` of its
default config, no recipe; class as in the coverage table: masked LM, causal LM, else base model) twice with the same
seed, once with the plugin's hooks installed and once with them uninstalled (`hf_condinit.hooks.uninstalled`), and
requires

- the same outcome: both build, or both raise the same exception type;
- bit-identical state dicts (same keys, dtypes, shapes and bytes);
- the same save: ``save_pretrained`` writes the same files with the same bytes in both modes;
- the same reload: ``from_pretrained`` of that folder gives the same outcome and bit-identical state dicts in both
  modes (``round_trip``: the reloaded weights also equal the saved ones, recorded, not required: transformers itself
  re-draws what a checkpoint does not hold for a few types).

A type whose uninstalled build is not reproducible (weights left uninitialised: two plain builds differ) is reported
as ``"nondeterministic"``, not as a difference. ``python benchmarks/inertness.py`` runs it over every model type.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import tempfile
from dataclasses import dataclass

import torch

from . import hooks

__all__ = ["Inertness", "check_inert", "cpu_time_limit", "same_state", "all_model_types", "meta_parameter_count",
           "MAX_PARAMETERS"]

SEED = 0
MAX_PARAMETERS = 200_000_000  # a larger miniature is not built (24 GiB machines: one type once took 23 GB)


def meta_parameter_count(build) -> int:
    """Parameters of the model ``build()`` returns, built on the ``meta`` device (no memory, no init)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


@dataclass
class Inertness:
    """One model type's result. ``status``: ``"identical"``, ``"different"`` (``detail`` says what),
    ``"nondeterministic"`` (two plain builds differ), ``"not built"`` (neither mode builds, the same way: ``detail``
    is the exception type), ``"too large"`` (over :data:`MAX_PARAMETERS` when shrunk: not built) or
    ``"no model class"``. ``round_trip``: the reloaded weights equal the saved ones."""

    model_type: str
    status: str
    model_class: str = ""
    detail: str = ""
    round_trip: bool | None = None


def all_model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(CONFIG_MAPPING_NAMES)


class CpuTimeout(BaseException):
    """Raised inside `cpu_time_limit` when its CPU time runs out (a BaseException: model code's ``except Exception``
    does not swallow it)."""


@contextlib.contextmanager
def cpu_time_limit(seconds: float):
    """Raise `CpuTimeout` after ``seconds`` of this process's CPU time (so a loaded machine does not stop it early);
    main thread on POSIX only, no limit elsewhere or for ``seconds <= 0``."""
    if seconds <= 0 or not hasattr(signal, "SIGPROF"):
        yield
        return

    def stop(signum, frame):
        raise CpuTimeout(f"took more than {seconds} s of CPU time")

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same_state(a: dict, b: dict) -> str | None:
    """None when state dicts ``a`` and ``b`` are bit-identical (keys, dtypes, shapes, bytes; NaNs compare by their
    bits), else the first difference."""
    if a.keys() != b.keys():
        return f"keys differ: {sorted(a.keys() ^ b.keys())[:3]}"
    for key in a:
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{key}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}"
        if not torch.equal(_bytes(x), _bytes(y)):
            return f"{key}: values differ"
    return None


def _attempt(build):
    """(outcome, state dict, model): outcome ``"ok"`` or the exception type's name."""
    torch.manual_seed(SEED)
    try:
        model = build()
    except Exception as err:
        return type(err).__name__, None, None
    return "ok", {k: v.detach().clone() for k, v in model.state_dict().items()}, model


def _mode(installed: bool):
    return contextlib.nullcontext() if installed else hooks.uninstalled()


def _files(folder: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def check_inert(model_type: str) -> Inertness:
    """Compare the hooks installed and uninstalled on ``model_type``'s miniature (see the module docstring).

    Call with the hooks installed (``import hf_condinit``); they are installed again when it returns."""
    from transformers import AutoConfig

    from .coverage import auto_class
    from .layouts.miniature import shrink_config

    try:
        config = AutoConfig.for_model(model_type)
    except Exception as err:  # the default config fails its own validators: nothing to build
        return Inertness(model_type, "not built", detail=f"default config: {type(err).__name__}")
    auto = auto_class(config)
    if auto is None:
        return Inertness(model_type, "no model class")
    try:
        model_class = auto._model_mapping[type(config)]
    except (KeyError, ValueError) as err:  # the auto mapping names a class this transformers does not ship
        return Inertness(model_type, "no model class", detail=f"{type(err).__name__}: {err}"[:200])
    try:
        small = shrink_config(config)
    except Exception as err:
        return Inertness(model_type, "not built", model_class.__name__, f"config: {type(err).__name__}")
    vars(small).pop("condinit", None)  # a plain config: no recipe attribute at all
    try:
        size = meta_parameter_count(lambda: model_class._from_config(copy.deepcopy(small)))
    except Exception:  # left to the real builds below, which compare how each mode fails
        size = 0
    if size > MAX_PARAMETERS:
        return Inertness(model_type, "too large", model_class.__name__, f"{size / 1e6:.0f}M parameters when shrunk")
    builds = {}
    for installed in (True, False):
        with _mode(installed):
            builds[installed] = _attempt(lambda: model_class._from_config(copy.deepcopy(small)))
    result = Inertness(model_type, "identical", model_class.__name__)
    (out_on, state_on, model_on), (out_off, state_off, model_off) = builds[True], builds[False]
    if out_on != out_off:
        return _differs(result, f"build: {out_on} with the hooks, {out_off} without")
    if out_on != "ok":
        result.status, result.detail = "not built", out_on
        return result
    diff = same_state(state_on, state_off)
    if diff:
        with hooks.uninstalled():
            again = _attempt(lambda: model_class._from_config(copy.deepcopy(small)))
        if again[0] == "ok" and same_state(state_off, again[1]):
            result.status, result.detail = "nondeterministic", f"two plain builds differ ({diff})"
            return result
        return _differs(result, f"state dict: {diff}")
    with tempfile.TemporaryDirectory() as on_dir, tempfile.TemporaryDirectory() as off_dir:
        saved = {}
        for installed, model, folder in ((True, model_on, on_dir), (False, model_off, off_dir)):
            with _mode(installed):
                try:
                    model.save_pretrained(folder)
                    saved[installed] = _files(folder)
                except Exception as err:
                    saved[installed] = type(err).__name__
        if saved[True] != saved[False]:
            written = [sorted(v) if isinstance(v, dict) else v for v in (saved[True], saved[False])]
            return _differs(result, f"save_pretrained: {written[0]} with the hooks, {written[1]} without")
        if not isinstance(saved[True], dict):
            result.detail = f"save_pretrained raises {saved[True]} in both modes"
            return result
        reloaded = {}
        for installed in (True, False):
            with _mode(installed):
                reloaded[installed] = _attempt(lambda: model_class.from_pretrained(on_dir))[:2]
        (rout_on, rstate_on), (rout_off, rstate_off) = reloaded[True], reloaded[False]
        if rout_on != rout_off:
            return _differs(result, f"reload: {rout_on} with the hooks, {rout_off} without")
        if rout_on != "ok":
            result.detail = f"from_pretrained raises {rout_on} in both modes"
            return result
        diff = same_state(rstate_on, rstate_off)
        if diff:
            return _differs(result, f"reloaded state dict: {diff}")
        result.round_trip = same_state(rstate_on, state_on) is None
    return result


def _differs(result: Inertness, detail: str) -> Inertness:
    result.status, result.detail = "different", detail
    return result
