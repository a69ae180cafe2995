"""The model card (``README.md``) of a run's output folder: Hugging Face's trainer card, extended.

The base is what ``Trainer.create_model_card`` writes (``transformers.modelcard.TrainingSummary.from_trainer``:
YAML metadata with ``model-index``, the evaluation results, hyper-parameters, the evaluation table, framework
versions). :func:`write_model_card` adds, in place of HF's "More information needed" placeholders:

- *Model description*: the init recipe of ``config.condinit`` (method, options, seed, layout, hf_condinit version)
  and the attention implementation;
- *Training and evaluation data*: the data flags of the command line that launched the script (when it is a
  ``run_*.py`` script), the dataset builder / name and the split sizes;
- *How to load*: whether the checkpoint is plain transformers weights or needs hf_condinit's code (attention
  variant, unmerged spectral conditioning: shipped as ``condinit_modeling.py``, ``trust_remote_code=True``), with
  the lines that load it (`hf_condinit.attention.portable.loading_instructions`);
- after the results: the final metrics (every entry logged from the end of training on, so the evaluations that
  follow ``trainer.train`` are included), the zero-shot BLiMP accuracy (overall, per field, per paradigm; from
  ``eval_results.json``, written by ``run_clm.py --blimp_dir`` / ``hf_condinit.zero_shot``), κ(J) at the first and
  last measurement (``condition_number.jsonl``) and the figures, linked by relative path (``loss.png``,
  ``kappa.png``), when they exist.

Tags ``hf_condinit`` and ``hf_condinit-<method>`` join HF's ``generated_from_trainer``. The card is parsed with
``huggingface_hub.ModelCard`` before it is written (so its YAML is valid) and loads with ``ModelCard.load``.

A ``README.md`` already in the folder is replaced only when it is a trainer card (tag ``generated_from_trainer``):
a user's own README is kept, with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import sys
from typing import Any

from .runs import read_json, read_kappa_records, recipe_summary
from ..attention.portable import loading_instructions

logger = logging.getLogger(__name__)

__all__ = ["write_model_card", "build_model_card", "script_command", "describe_data", "final_metrics_from_log"]

CARD_NAME = "README.md"
FIGURES = (("loss.png", "training and evaluation loss"), ("kappa.png", "κ(J) per layer"))
_DATA_FLAGS = ("dataset_name", "dataset_config_name", "train_file", "validation_file", "test_file", "task_name",
               "glue_data_dir", "suite_files", "image_column_name", "label_column_name")  # fmt: skip
_PLACEHOLDER = "\n\nMore information needed\n"


def script_command(argv: list[str] | None = None) -> str | None:
    """``python run_xxx.py <flags>`` when ``argv`` (default ``sys.argv``) is a ``run_*.py`` script's command
    line, else ``None`` (e.g. a script's ``main(argv)`` called from Python)."""
    argv = sys.argv if argv is None else argv
    if not argv or not os.path.basename(argv[0]).startswith("run_") or not argv[0].endswith(".py"):
        return None
    return "python " + shlex.join([os.path.basename(argv[0]), *argv[1:]])


def _data_flags(argv: list[str]) -> dict[str, str]:
    """The data flags of a command line (``--name value`` or ``--name=value``), or of its single ``.json`` args
    file."""
    args = argv[1:]
    if len(args) == 1 and args[0].endswith(".json") and os.path.isfile(args[0]):
        with open(args[0], encoding="utf-8") as f:
            given = json.load(f)
        return {k: str(given[k]) for k in _DATA_FLAGS if given.get(k) is not None}
    found = {}
    for i, a in enumerate(args):
        for name in _DATA_FLAGS:
            for spelling in (name, name.replace("_", "-")):
                if a == f"--{spelling}" and i + 1 < len(args):
                    found[name] = args[i + 1]
                elif a.startswith(f"--{spelling}="):
                    found[name] = a.split("=", 1)[1]
    return found


def _dataset_line(split: str, dataset) -> str | None:
    if dataset is None:
        return None
    try:
        n = len(dataset)
    except TypeError:
        return f"- {split}: {type(dataset).__name__}"
    parts = [f"{n:,} example" + ("" if n == 1 else "s")]
    name = getattr(dataset, "builder_name", None) or getattr(getattr(dataset, "info", None), "dataset_name", None)
    if name:
        parts.append(f"builder `{name}`")
    config = getattr(dataset, "config_name", None)
    if config and config != "default":
        parts.append(f"config `{config}`")
    try:
        first = dataset[0]
        if isinstance(first, dict) and "input_ids" in first:
            parts.append(f"{len(first['input_ids'])} tokens per example (first)")
    except Exception:  # noqa: BLE001 - a description must not fail on an exotic dataset
        pass
    return f"- {split}: " + ", ".join(parts)


def _dataset_name(argv: list[str] | None) -> str | None:
    """The data's name for HF's card sentence "trained ... on the X dataset": ``--dataset_name``, the GLUE task,
    or the training file's name (``None`` when the command line is not a script's)."""
    argv = sys.argv if argv is None else argv
    if script_command(argv) is None:
        return None
    flags = _data_flags(argv)
    if "dataset_name" in flags:
        return flags["dataset_name"] + (f" ({flags['dataset_config_name']})" if "dataset_config_name" in flags else "")
    if "task_name" in flags:
        return f"GLUE {flags['task_name'].upper()}"
    if "train_file" in flags:
        return os.path.basename(flags["train_file"])
    return f"{os.path.basename(argv[0])} default"  # the script's embedded data


def describe_data(trainer, argv: list[str] | None = None) -> str:
    """Markdown lines describing the data: the command line's data flags (when :func:`script_command` recognises
    the script; "none" means the script's embedded default) and the trainer's train / eval datasets."""
    argv = sys.argv if argv is None else argv
    lines = []
    if script_command(argv) is not None:
        flags = _data_flags(argv)
        if flags:
            lines += [f"- `--{k} {v}`" for k, v in flags.items()]
        else:
            lines.append(f"- no data flags: the embedded default data of `{os.path.basename(argv[0])}`")
    splits = [("train", trainer.train_dataset)]
    if isinstance(trainer.eval_dataset, dict):  # several named evaluation sets
        splits += [(f"eval ({name})", ds) for name, ds in trainer.eval_dataset.items()]
    else:
        splits.append(("eval", trainer.eval_dataset))
    for split, ds in splits:
        line = _dataset_line(split, ds)
        if line:
            lines.append(line)
    return "\n".join(lines) if lines else "Not recorded."


def final_metrics_from_log(log_history: list[dict]) -> dict[str, Any]:
    """The metrics logged from the end of training on (the entry with ``train_runtime`` and every later one: the
    evaluations after ``trainer.train``, perplexity), later keys winning; the last evaluation when the log has no
    training summary. ``step`` / ``epoch`` are left out."""
    start = max((i for i, e in enumerate(log_history) if "train_runtime" in e), default=None)
    if start is None:
        start = max((i for i, e in enumerate(log_history) if any(k.startswith("eval_") for k in e)), default=None)
    out: dict[str, Any] = {}
    for entry in log_history[start:] if start is not None else []:
        out.update({k: v for k, v in entry.items() if k not in ("step", "epoch") and not k.startswith("kappa/")})
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _listify(value) -> list:
    return value if isinstance(value, list) else [value]


def _warmup_named(hyperparameters: dict | None) -> dict | None:
    """HF's card lists ``--warmup_steps`` as ``lr_scheduler_warmup_steps`` even below 1, where transformers reads it
    as a fraction of the training steps: name that case ``lr_scheduler_warmup_ratio`` (same position)."""
    if not hyperparameters:
        return hyperparameters
    value = hyperparameters.get("lr_scheduler_warmup_steps")
    if value is None or not 0 < value < 1:
        return hyperparameters
    return {("lr_scheduler_warmup_ratio" if k == "lr_scheduler_warmup_steps" else k): v
            for k, v in hyperparameters.items()}


def _recipe_section(condinit: dict | None, attention: str | None, source: str | None = None) -> str:
    if not condinit:
        body = "No hf_condinit recipe: the model keeps its architecture's own initialisation.\n"
    else:
        rows = [("method", condinit.get("method")), ("recipe", recipe_summary(condinit)),
                ("seed", condinit.get("seed")), ("layout", condinit.get("layout")),
                ("hf_condinit version", condinit.get("hf_condinit_version"))]
        body = "| | |\n|---|---|\n" + "".join(f"| {k} | `{v}` |\n" for k, v in rows)
        body += "\nFull recipe (`config.condinit`, every option):\n\n```json\n"
        body += json.dumps(condinit, indent=2, sort_keys=True) + "\n```\n"
    body += f"\nAttention implementation: `{attention or 'not recorded'}`.\n"
    if source:
        body += f"\nBuilt from the local config / model `{source}`.\n"
    return "\n\nAttention weights initialised by hf_condinit (`config.condinit`).\n\n" + body


def _kappa_value(value: float, lower_bound: bool) -> str:
    """κ for the card: ``≥1e+06`` when it is only a lower bound."""
    return ("≥" if lower_bound else "") + _fmt(value)


def _kappa_section(records) -> str:
    first, last = records[0], records[-1]
    layers = sorted(set(first.layers) | set(last.layers))
    lines = [
        f"\n## Attention-Jacobian condition number κ(J)\n\n{len(records)} measurement(s) in "
        "`condition_number.jsonl`; mean / max over heads.\n",
        f"| layer | first (step {first.step}) | last (step {last.step}) |",
        "|---|---:|---:|",
    ]
    for lay in layers:
        cells = [f"{_kappa_value(r.layers[lay]['mean'], r.layer_is_lower_bound(lay))} / "
                 f"{_kappa_value(r.layers[lay]['max'], r.layer_is_lower_bound(lay))}" if lay in r.layers else "—"
                 for r in (first, last)]
        lines.append(f"| {lay} | {cells[0]} | {cells[1]} |")
    overall = [f"{_kappa_value(r.mean, r.is_lower_bound)} / {_kappa_value(r.max, r.is_lower_bound)}"
               for r in (first, last)]
    lines.append(f"| all layers | {overall[0]} | {overall[1]} |")
    if first.is_lower_bound or last.is_lower_bound:
        lines += ["", "≥: a lower bound — some head's κ hit the float64 resolution (`n_lower_bound` in "
                      "`condition_number.jsonl`), so the true value is larger; a mean over heads that includes such "
                      "a head is a lower bound too."]
    return "\n".join(lines) + "\n"


def _percent(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f} %"


def _blimp_section(results: dict) -> str:
    """The BLiMP accuracies of ``eval_results.json`` (:func:`hf_condinit.zero_shot.evaluate_blimp`'s keys): overall
    and per field in a table, per paradigm in a collapsed list. ``""`` without ``blimp_accuracy``."""
    if "blimp_accuracy" not in results:
        return ""
    lines = [f"\n## Zero-shot BLiMP\n\n{results.get('blimp_n_pairs', '?')} minimal pairs; a pair is right when the "
             f"grammatical sentence has the higher total log-probability (prefix token: "
             f"`{results.get('blimp_prefix', '?')}`; chance 50 %; `hf_condinit.zero_shot`).\n",
             "| BLiMP | accuracy |", "|---|---:|", f"| all | {_percent(results['blimp_accuracy'])} |"]
    lines += [f"| {field} | {_percent(acc)} |" for field, acc in (results.get("blimp_field_accuracy") or {}).items()]
    paradigms = results.get("blimp_paradigm_accuracy") or {}
    if paradigms:
        lines += ["", "<details><summary>per paradigm</summary>", "", "| paradigm | accuracy |", "|---|---:|"]
        lines += [f"| {p} | {_percent(acc)} |" for p, acc in paradigms.items()]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def build_model_card(trainer, *, output_dir: str | None = None, argv: list[str] | None = None) -> str:
    """The card text (YAML metadata + Markdown) for ``trainer``'s run; see the module docstring."""
    from huggingface_hub import ModelCard
    from transformers.modelcard import TrainingSummary

    output_dir = output_dir or trainer.args.output_dir
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    config = model.config
    condinit = getattr(config, "condinit", None)
    if condinit is not None and not isinstance(condinit, dict):
        condinit = condinit.to_dict()
    method = (condinit or {}).get("method")
    tags = ["hf_condinit"] + ([f"hf_condinit-{method}"] if method else [])
    summary = TrainingSummary.from_trainer(trainer, tags=tags, model_name=os.path.basename(os.path.abspath(output_dir)),
                                           dataset=_dataset_name(argv))
    # HF takes config._name_or_path as the base model unless it is a folder: "" for a model built from a config
    # object, a config file's path for run_clm.py. Only a hub id is a base model; a local source is named below.
    source = summary.finetuned_from
    if not source or os.path.exists(source):
        summary.finetuned_from = None
    # HF tags an in-memory dataset (no builder) as [None]: "trained on the None dataset".
    if summary.dataset_tags is not None and None in _listify(summary.dataset_tags):
        summary.dataset_tags = summary.dataset_args = summary.dataset_metadata = None
        summary.dataset = _dataset_name(argv)
    summary.hyperparameters = _warmup_named(summary.hyperparameters)
    if not summary.eval_lines:  # no evaluation during training: no empty "Training results" table
        summary.eval_lines = None
    text = summary.to_model_card()
    local_source = source if source and os.path.exists(source) else None

    attention = getattr(config, "_attn_implementation", None)
    text = text.replace("## Model description" + _PLACEHOLDER,
                        "## Model description" + _recipe_section(condinit, attention, local_source), 1)
    text = text.replace("## Training and evaluation data" + _PLACEHOLDER,
                        "## Training and evaluation data\n\n" + describe_data(trainer, argv) + "\n", 1)
    extra = ["\n## How to load\n\n" + loading_instructions(model)]
    command = script_command(argv)
    if command:
        extra.append(f"\n## Command\n\n```bash\n{command}\n```\n")
    metrics = {k: v for k, v in final_metrics_from_log(trainer.state.log_history).items()
               if not k.startswith("blimp_")}  # BLiMP has its own section
    if metrics:
        extra.append("\n## Final metrics\n\n| metric | value |\n|---|---:|\n"
                     + "".join(f"| {k} | {_fmt(v)} |\n" for k, v in sorted(metrics.items())))
    eval_results = read_json(os.path.join(output_dir, "eval_results.json"))
    extra.append(_blimp_section(eval_results if isinstance(eval_results, dict) else {}))
    records = read_kappa_records(os.path.join(output_dir, "condition_number.jsonl"))
    if records:
        extra.append(_kappa_section(records))
    figures = [(f, what) for f, what in FIGURES if os.path.isfile(os.path.join(output_dir, f))]
    if figures:
        extra.append("\n## Plots\n\n" + "".join(f"![{what}]({f})\n\n" for f, what in figures))
    marker = "\n### Framework versions"
    head, sep, tail = text.partition(marker)
    text = head.rstrip("\n") + "\n" + "".join(extra) + sep + tail
    ModelCard(text, ignore_metadata_errors=False)  # raises on invalid YAML metadata
    return text


def write_model_card(trainer, *, output_dir: str | None = None, argv: list[str] | None = None) -> str | None:
    """Write :func:`build_model_card` to ``<output_dir>/README.md`` on the world-process-zero; returns the path
    (``None`` on other processes, or when a README.md that is not a trainer card is kept)."""
    if not trainer.is_world_process_zero():
        return None
    from huggingface_hub import ModelCard

    output_dir = output_dir or trainer.args.output_dir
    path = os.path.join(output_dir, CARD_NAME)
    if os.path.isfile(path):
        try:
            tags = ModelCard.load(path).data.tags or []
        except Exception:  # noqa: BLE001 - an unparsable README is the user's: keep it
            tags = []
        if "generated_from_trainer" not in tags:
            logger.warning(f"{path} exists and is not a trainer model card: kept, no model card written.")
            return None
    text = build_model_card(trainer, output_dir=output_dir, argv=argv)
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
