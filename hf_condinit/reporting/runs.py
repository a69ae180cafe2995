"""Read what a finished run left in its output folder (any of the scripts: ``run_clm.py``, ``run_mlm.py``,
``run_glue.py``, ``run_image_classification.py``, or any ``Trainer`` run).

Files read, every one optional except that at least one of the first three must exist:

- ``trainer_state.json``: ``log_history``, a list of dicts each with ``step``; training entries carry ``loss``,
  evaluation entries ``eval_*``, κ entries ``kappa/...`` (``hf_condinit.callbacks.ConditionNumberCallback``);
- ``all_results.json`` / ``eval_results.json`` / ``train_results.json``: ``Trainer.save_metrics`` output (final
  metrics; ``train_tokens_per_second`` when the script knows its tokens per sample);
- ``config.json``: the model config, with the init recipe under ``condinit`` (``hf_condinit.CondInitConfig.to_dict``)
  and the attention implementation;
- ``condition_number.jsonl``: one κ measurement per line, ``{"step", "epoch", "log": {...}, "layers": [{"layer",
  "mean", "max", "bound", ...}, ...]}``.

:func:`read_log_history`, :func:`read_kappa_records` and :func:`recipe_summary` are shared by the model card, the
plots and ``hf_condinit.compare``; :class:`RunSummary` is what ``hf_condinit.compare.load_run`` returns.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RUN_MARKER_FILES",
    "NotARunFolderError",
    "KappaRecord",
    "RunSummary",
    "read_json",
    "read_log_history",
    "read_kappa_records",
    "read_final_metrics",
    "train_loss_curve",
    "eval_curve",
    "tokens_per_second",
    "recipe_summary",
    "primary_metric",
    "lower_is_better",
    "summarize_run",
]

# A folder holding none of these is not the output folder of a run.
RUN_MARKER_FILES = ("trainer_state.json", "all_results.json", "eval_results.json", "train_results.json")

# Primary metric of a run, first present wins (LM runs on text, which report a perplexity, use eval_loss instead;
# the synthetic recall task reports a perplexity too, but is judged by its recall accuracy).
_METRIC_PREFERENCE = (
    "eval_recall_accuracy", "eval_accuracy", "eval_matthews_correlation", "eval_pearson", "eval_spearmanr",
    "eval_f1", "eval_loss",
)  # fmt: skip

# condinit keys that are not options of the method (shown separately or not at all).
_RECIPE_META = ("method", "seed", "layout", "hf_condinit_version")


class NotARunFolderError(ValueError):
    """``path`` is missing, not a folder, or holds none of :data:`RUN_MARKER_FILES`."""


@dataclass
class KappaRecord:
    """One κ(J) measurement (one line of ``condition_number.jsonl``).

    ``layers`` maps the layer ordinal to ``{"mean", "max", "bound", "n_lower_bound"}`` (over the measured heads;
    NaN when absent; ``n_lower_bound``: heads whose κ hit the float64 resolution, so that the layer's mean and max
    are lower bounds); ``mean`` is the mean of the layer means and ``max`` the max over all heads (the
    ``kappa/mean`` and ``kappa/max`` log keys); ``n_lower_bound`` the heads of every layer whose κ is only a lower
    bound (then ``mean`` and ``max`` are lower bounds too: :attr:`is_lower_bound`)."""

    step: int
    mean: float
    max: float
    layers: dict[int, dict[str, float]] = field(default_factory=dict)
    n_lower_bound: int = 0

    @property
    def is_lower_bound(self) -> bool:
        """Whether ``mean`` and ``max`` are lower bounds (some head's κ is; the true values may be larger)."""
        return self.n_lower_bound > 0

    def layer_is_lower_bound(self, layer: int) -> bool:
        """Whether layer ``layer``'s mean and max over heads are lower bounds."""
        return self.layers.get(layer, {}).get("n_lower_bound", 0) > 0


@dataclass
class RunSummary:
    """Everything ``hf_condinit.compare`` needs from one run folder (:func:`summarize_run`).

    Attributes:
        path (`str`): the folder. name (`str`): its label (the folder name unless given).
        condinit (`dict`): ``config.json``'s ``condinit`` (``{}`` for a model without one).
        attention (`str | None`): the attention variant recorded in ``config.json`` (``condinit_attention``).
        recipe (`str`): :func:`recipe_summary` of the two.
        log_history (`list[dict]`): ``trainer_state.json``'s, ``[]`` when absent.
        final_metrics (`dict`): :func:`read_final_metrics`.
        kappa (`list[KappaRecord]`): the κ measurements in step order (``[]`` when none were logged).
        tokens_per_second (`float | None`): :func:`tokens_per_second`.
        global_step (`int | None`): the last step of ``trainer_state.json``.
    """

    path: str
    name: str
    condinit: dict
    attention: str | None
    recipe: str
    log_history: list[dict]
    final_metrics: dict
    kappa: list[KappaRecord]
    tokens_per_second: float | None
    global_step: int | None

    def eval_curve(self, metric: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of ``metric`` over the run (:func:`eval_curve`)."""
        return eval_curve(self.log_history, metric, self.final_metrics, self.global_step)


def read_json(path: str) -> Any:
    """``json.load`` of ``path``, or ``None`` when the file does not exist. Raises ``ValueError`` naming the file
    when it is not valid JSON."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None


def read_log_history(run_dir: str) -> tuple[list[dict], int | None]:
    """``(log_history, global_step)`` from ``<run_dir>/trainer_state.json`` (``([], None)`` when absent)."""
    state = read_json(os.path.join(run_dir, "trainer_state.json"))
    if state is None:
        return [], None
    if not isinstance(state, dict):
        raise ValueError(f"{os.path.join(run_dir, 'trainer_state.json')} is not a trainer state (not an object)")
    return list(state.get("log_history") or []), state.get("global_step")


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_kappa_records(path: str) -> list[KappaRecord]:
    """The κ measurements of a ``condition_number.jsonl`` (``[]`` when the file does not exist), sorted by step;
    a step measured twice (a resumed run) keeps its last line. A last line that has no newline and does not parse is
    a write in progress (a run being read while it trains) or one a kill cut short: skipped.

    Raises ``ValueError`` naming the file and line for any other line that is not a JSON object with ``step``."""
    if not os.path.isfile(path):
        return []
    by_step: dict[int, KappaRecord] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step = int(rec["step"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                if not line.endswith("\n") and isinstance(e, json.JSONDecodeError):
                    break  # the unfinished last line (docstring)
                raise ValueError(f"{path}:{lineno}: not a condition-number record ({e})") from None
            layers = {
                int(lay["layer"]): {**{k: _float(lay.get(k)) for k in ("mean", "max", "bound")},
                                    "n_lower_bound": int(lay.get("n_lower_bound") or 0)}
                for lay in rec.get("layers") or []
            }
            log = rec.get("log") or {}
            means = [v["mean"] for v in layers.values() if not math.isnan(v["mean"])]
            maxes = [v["max"] for v in layers.values() if not math.isnan(v["max"])]
            mean = _float(log["kappa/mean"]) if "kappa/mean" in log else (sum(means) / len(means) if means else math.nan)
            mx = _float(log["kappa/max"]) if "kappa/max" in log else (max(maxes) if maxes else math.nan)
            n_lower = sum(v["n_lower_bound"] for v in layers.values())
            by_step[step] = KappaRecord(step=step, mean=mean, max=mx, layers=layers, n_lower_bound=n_lower)
    return [by_step[s] for s in sorted(by_step)]


def read_final_metrics(run_dir: str) -> dict:
    """The final metrics of a run: ``all_results.json``, updated with ``train_results.json`` and
    ``eval_results.json`` (the newer files of one ``save_metrics`` call each). ``{}`` when none exists."""
    out: dict = {}
    for name in ("all_results.json", "train_results.json", "eval_results.json"):
        data = read_json(os.path.join(run_dir, name))
        if isinstance(data, dict):
            out.update(data)
    return out


def train_loss_curve(log_history: list[dict]) -> tuple[list[int], list[float]]:
    """``(steps, losses)`` of the training-loss log entries (key ``loss``)."""
    pts = [(e["step"], float(e["loss"])) for e in log_history if "loss" in e and "step" in e]
    return [p[0] for p in pts], [p[1] for p in pts]


def eval_curve(log_history: list[dict], metric: str, final_metrics: dict | None = None,
               final_step: int | None = None) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of an evaluation metric: every ``log_history`` entry holding ``metric``, plus the final
    evaluation (``final_metrics[metric]``, saved after ``trainer_state.json``) at ``final_step`` when given. One
    value per step: the final evaluation replaces a logged one at the same step."""
    points = {int(e["step"]): float(e[metric]) for e in log_history if metric in e and "step" in e}
    if final_metrics and metric in final_metrics and final_step is not None:
        points[int(final_step)] = float(final_metrics[metric])
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def tokens_per_second(final_metrics: dict, log_history: list[dict]) -> float | None:
    """Training throughput in tokens/s: ``train_tokens_per_second`` of the results files, else the last log entry
    with a key ending in ``tokens_per_second`` (throughput callbacks), else ``None``."""
    if final_metrics.get("train_tokens_per_second") is not None:
        return float(final_metrics["train_tokens_per_second"])
    for entry in reversed(log_history):
        keys = sorted(k for k in entry if k.endswith("tokens_per_second"))
        if keys:
            return _float(entry["train_tokens_per_second" if "train_tokens_per_second" in entry else keys[0]])
    return None


def recipe_summary(condinit: dict | None, attention: str | None = None) -> str:
    """One line naming an init recipe: ``"conditioned qk_gain=2.0 (seed 0), attention affine_scaled"``.

    Options are listed when they differ from ``CondInitConfig``'s defaults; a model without ``condinit`` is
    ``"model default"``; the attention is named unless it is HF's ``sdpa`` / ``eager``."""
    if not condinit:
        text = "model default"
    else:
        from ..config import CondInitConfig

        defaults = CondInitConfig(method="default").to_dict()
        options = [f"{k}={v}" for k, v in condinit.items() if k not in _RECIPE_META and defaults.get(k, v) != v]
        text = " ".join([str(condinit.get("method", "?")), *options])
        if condinit.get("seed") is not None:
            text += f" (seed {condinit['seed']})"
    if attention and attention not in ("sdpa", "eager"):
        text += f", attention {attention}"
    return text


def lower_is_better(metric: str) -> bool:
    """Losses and perplexities decrease as a model improves; every other metric increases."""
    return "loss" in metric or "perplexity" in metric


def primary_metric(final_metrics: dict, log_history: list[dict]) -> str | None:
    """The metric a run is judged by: the synthetic task's recall accuracy, ``eval_loss`` for LM runs on text (they
    report a ``perplexity``), else the first of accuracy, Matthews correlation, Pearson, Spearman, F1, loss that
    the run evaluated."""
    available = set(final_metrics) | {k for e in log_history for k in e}
    if "perplexity" in final_metrics and "eval_loss" in available and "eval_recall_accuracy" not in available:
        return "eval_loss"
    return next((m for m in _METRIC_PREFERENCE if m in available), None)


def summarize_run(path: str, name: str | None = None) -> RunSummary:
    """Read one run folder into a :class:`RunSummary`.

    Raises :class:`NotARunFolderError` when ``path`` is missing, not a folder, or holds none of
    :data:`RUN_MARKER_FILES`, and ``ValueError`` naming the file for a file that cannot be parsed."""
    if not os.path.exists(path):
        raise NotARunFolderError(f"{path}: no such folder")
    if not os.path.isdir(path):
        raise NotARunFolderError(f"{path}: not a folder")
    if not any(os.path.isfile(os.path.join(path, f)) for f in RUN_MARKER_FILES):
        raise NotARunFolderError(
            f"{path}: not a run folder (none of {', '.join(RUN_MARKER_FILES)}); pass the --output_dir of a finished run"
        )
    log_history, global_step = read_log_history(path)
    final_metrics = read_final_metrics(path)
    config = read_json(os.path.join(path, "config.json"))
    config = config if isinstance(config, dict) else {}
    condinit = config.get("condinit") or {}
    # hf_condinit records its attention variants as condinit_attention (transformers does not save the choice)
    attention = config.get("condinit_attention") or config.get("_attn_implementation")
    return RunSummary(
        path=path,
        name=name or os.path.basename(os.path.normpath(os.path.abspath(path))),
        condinit=condinit,
        attention=attention,
        recipe=recipe_summary(condinit, attention),
        log_history=log_history,
        final_metrics=final_metrics,
        kappa=read_kappa_records(os.path.join(path, "condition_number.jsonl")),
        tokens_per_second=tokens_per_second(final_metrics, log_history),
        global_step=global_step,
    )
