#!/usr/bin/env python
"""GLUE finetuning (Crammed BERT or any HF encoder) with offline metrics, in the style of HF's ``run_glue.py``.

- ``--task_name rte`` alone loads ``nyu-mll/glue`` from the hub (needs network or a local datasets cache);
  ``--task_name rte --train_file train.tsv --validation_file dev.tsv`` reads local files instead: GLUE TSV as
  distributed (CoLA without header, MRPC ``#1 String``/``#2 String``, MNLI ``gold_label``, STS-B ``score``, ...), CSV
  or JSON, with the columns and label set of the task (``hf_condinit.glue``). MNLI evaluates matched
  (``--validation_file``) and mismatched (``--validation_mismatched_file``).
- Metrics through the GLUE ``evaluate`` module shipped in the package, loaded by path (no hub): Matthews for CoLA,
  Pearson + Spearman for STS-B, F1 + accuracy for MRPC / QQP, accuracy otherwise; they land in
  ``<output_dir>/eval_results.json`` (``trainer.save_metrics``), MNLI-mm keys with the suffix ``_mm``.
- ``--model_name_or_path``: a pretrained checkpoint (``from_pretrained``, never re-initialised; the new classification
  head gets the model's default init). Without it a Crammed BERT is built from config (``--config_overrides``,
  ``--init``, ``--attention``) and, without ``--tokenizer_name``, a WordPiece tokenizer is trained on the task's
  training text — a no-pretraining baseline. ``--init`` / ``--attention`` and the method options come from
  ``hf_condinit.scripts_common.CondInitArguments`` (shared with ``run_clm.py`` / ``run_mlm.py``); with
  ``--model_name_or_path`` the attention implementation changes only when ``--attention`` is given.
  ``CondInitTrainer`` keeps ``condinit_`` holders, biases and norms out of weight decay.
- Crammed finetuning recipe as defaults: lr 4e-5, batch 16, 5 epochs, cosine schedule with 10 % warm-up
  (``warmup_steps=0.1``, a fraction in transformers 5), AdamW weight decay 0.01.
- ``--glue_suite``: run the 8 tasks (no WNLI; or ``--suite_tasks``) one after the other from the same checkpoint, each
  in ``<output_dir>/<task>``, and write ``<output_dir>/glue_suite.json`` and ``glue_suite.md`` (the papers' GLUE table:
  a column per task and the average). Local files come from ``--glue_data_dir`` (GLUE layout: ``RTE/train.tsv``,
  ``RTE/dev.tsv``, ``MNLI/dev_matched.tsv``, ...) or per task from ``--suite_files files.json``
  (``{"qnli": {"train": ..., "validation": ...}, ...}``); a task with no local files is loaded from the hub.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np

import datasets
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

import hf_condinit  # noqa: F401  (installs the hooks, registers attention variants and Crammed BERT)
from hf_condinit.glue import GLUE_TASKS, SUITE_TASKS, format_glue_table, get_task, glue_average, glue_task_score
from hf_condinit.glue import custom_task, load_custom_files, load_glue_metric, read_glue_file, suite_task_files
from hf_condinit.models.crammed_bert import CrammedBertConfig, train_wordpiece_tokenizer
from hf_condinit.scripts_common import (
    CondInitArguments,
    CondInitTrainer,
    TokenizerHubArguments,
    check_attention_usable,
    check_loaded_model_flags,
    claim_output_dir,
    find_last_checkpoint,
    make_periodic_checkpoint_callback,
    make_throughput_callback,
    model_class,
    parse_and_set_up,
    parse_config_overrides,
    run_main,
    train_and_save,
    user_errors,
)

logger = logging.getLogger(__name__)

GLUE_HUB_DATASET = "nyu-mll/glue"



@dataclass
class ModelArguments(TokenizerHubArguments):
    """HF's ``run_glue.py`` model fields (the hub fields of :class:`TokenizerHubArguments` included) plus the
    WordPiece trained when no tokenizer is given."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Pretrained checkpoint (path or hub id). Default: a new Crammed BERT."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config name or path if not the model's."})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "For a model built from config: 'num_hidden_layers=2,hidden_size=128,...'."},
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer name or path if not the model's."})
    tokenizer_vocab_size: int = field(
        default=8192, metadata={"help": "Vocabulary of the WordPiece trained when there is no tokenizer."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Allow a checkpoint whose head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    task_name: str | None = field(
        default=None,
        metadata={"help": "GLUE task: " + ", ".join(GLUE_TASKS) + ". Without it: --glue_suite, or one's own csv / "
                          "json --train_file / --validation_file (or --dataset_name) with a label column."},
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Without --task_name: a hub dataset with a label column (needs network)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Local training file (.tsv/.csv/.json)."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Local validation file (MNLI: matched) (.tsv/.csv/.json)."}
    )
    validation_mismatched_file: str | None = field(
        default=None, metadata={"help": "MNLI only: local mismatched validation file."}
    )
    test_file: str | None = field(default=None, metadata={"help": "Local test file (labels optional): predictions."})
    max_seq_length: int = field(default=128, metadata={"help": "Maximum tokens per example (truncation)."})
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every example to max_seq_length (default: dynamic padding per batch)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test examples."})
    bad_lines: str = field(
        default="error",
        metadata={"help": "Malformed rows in local files: 'error' (default) or 'skip' (with a warning).",
                  "choices": ["error", "skip"]},
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute cached preprocessing."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for preprocessing."})
    glue_suite: bool = field(default=False, metadata={"help": "Run the GLUE suite and write the GLUE table."})
    suite_tasks: str | None = field(
        default=None, metadata={"help": "Comma-separated tasks for --glue_suite (default: the 8 tasks, no WNLI)."}
    )
    glue_data_dir: str | None = field(
        default=None, metadata={"help": "--glue_suite: directory in the GLUE layout (RTE/train.tsv, RTE/dev.tsv, ...)."}
    )
    suite_files: str | None = field(
        default=None, metadata={"help": "--glue_suite: JSON file {task: {train, validation, ...}} overriding files."}
    )
    suite_label: str | None = field(default=None, metadata={"help": "--glue_suite: row label in the table."})

    def __post_init__(self):
        if self.glue_suite:
            return
        if self.task_name is None:
            if self.dataset_name is None and self.train_file is None:
                raise ValueError("run_glue.py needs --task_name (one of " + ", ".join(GLUE_TASKS) + "), "
                                 "--glue_suite, or one's own data: --train_file (csv / json with a label column) "
                                 "or --dataset_name.")
            if self.dataset_name is not None and self.train_file is not None:
                raise ValueError("pass either --dataset_name or --train_file, not both")
            if self.validation_mismatched_file is not None:
                raise ValueError("--validation_mismatched_file is for --task_name mnli only.")
            return
        if self.dataset_name is not None:
            raise ValueError("--dataset_name is for one's own data; --task_name loads GLUE itself.")
        self.task_name = get_task(self.task_name).name
        if self.validation_mismatched_file is not None and self.task_name != "mnli":
            raise ValueError("--validation_mismatched_file is for --task_name mnli only.")


@dataclass
class GlueTrainingArguments(TrainingArguments):
    """TrainingArguments with the crammed GLUE finetuning recipe as defaults (docs/methods.md §7)."""

    learning_rate: float = field(default=4e-5, metadata={"help": "Peak learning rate (crammed: 4e-5)."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Batch size (crammed: 16)."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch size."})
    num_train_epochs: float = field(default=5.0, metadata={"help": "Epochs (crammed: 5)."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Schedule (crammed: cosine)."})
    warmup_steps: float = field(default=0.1, metadata={"help": "Warm-up: fraction (< 1) or steps (crammed: 10 %%)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (AdamW)."})


# ---------------------------------------------------------------------------------------------------------------------


def load_custom_datasets(data_args: DataTrainingArguments, model_args: ModelArguments):
    """``(raw, task)`` of one's own data (no ``--task_name``): the csv / json files, or ``--dataset_name``, with the
    labels and text columns found as HF's ``run_glue.py`` finds them (:mod:`hf_condinit.glue.custom`)."""
    if data_args.dataset_name is not None:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                    cache_dir=model_args.cache_dir, token=model_args.token)
        return custom_task(raw, where={split: f"--dataset_name {data_args.dataset_name!r} ({split})" for split in raw})
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    return load_custom_files({k: v for k, v in files.items() if v is not None}, cache_dir=model_args.cache_dir)


def load_task_datasets(task, data_args: DataTrainingArguments, model_args: ModelArguments):
    """A ``DatasetDict`` for the task: local files when given, else the hub's ``nyu-mll/glue``."""
    local = {
        "train": data_args.train_file,
        "validation": data_args.validation_file,
        "validation_mismatched": data_args.validation_mismatched_file,
        "test": data_args.test_file,
    }
    if any(v is not None for v in local.values()):
        splits = {}
        for split, path in local.items():
            if path is None:
                continue
            splits[split] = read_glue_file(
                path, task, require_label=(split != "test"), bad_lines=data_args.bad_lines
            )
        raw = datasets.DatasetDict(splits)
        if task.name == "mnli" and "validation" in raw:
            raw["validation_matched"] = raw.pop("validation")
        return raw
    logger.info(f"Loading GLUE {task.name} from the hub ({GLUE_HUB_DATASET})")
    return datasets.load_dataset(
        GLUE_HUB_DATASET, task.name, cache_dir=model_args.cache_dir, token=model_args.token
    )


def make_compute_metrics(task, metric):
    def compute_metrics(p):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        preds = np.squeeze(preds, axis=-1) if task.is_regression else np.argmax(preds, axis=-1)
        return metric.compute(predictions=preds, references=p.label_ids)

    return compute_metrics


def check_task(model_args, cond_args, training_args, attention_given: bool) -> str | None:
    """The checks of one task before any work (``--attention`` against the model class, the ``--output_dir``
    policy); returns the checkpoint to resume from (``find_last_checkpoint``)."""
    with user_errors():
        if attention_given or not model_args.model_name_or_path:
            if model_args.model_name_or_path or model_args.config_name:
                config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                                    **model_args.hub_kwargs())
            else:
                config = CrammedBertConfig(**parse_config_overrides(model_args.config_overrides, CrammedBertConfig()))
            check_attention_usable(cond_args.attention, model_class(AutoModelForSequenceClassification, config,
                                                                    model_args.model_name_or_path,
                                                                    model_args.hub_kwargs()),
                                   config, training_args.use_cpu)
        return find_last_checkpoint(training_args, logger)


def run_task(
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    cond_args: CondInitArguments,
    training_args: TrainingArguments,
    attention_given: bool = True,
    resume: str | None = None,
) -> dict:
    """Finetune / evaluate one GLUE task, or one's own data without ``--task_name``; returns the evaluation metrics
    (MNLI: matched and ``*_mm``).

    ``attention_given``: whether ``--attention`` was on the command line (a loaded checkpoint keeps its attention
    implementation otherwise). ``resume``: the checkpoint from :func:`check_task`."""
    set_seed(training_args.seed)

    with user_errors(training_args.output_dir):
        claim_output_dir(training_args)
        if data_args.task_name is None:
            raw, task = load_custom_datasets(data_args, model_args)
        else:
            task = get_task(data_args.task_name)
            raw = load_task_datasets(task, data_args, model_args)
        if training_args.do_train and "train" not in raw:
            raise ValueError(f"--do_train needs a training split for {task.name}: pass --train_file.")
        eval_split = "validation_matched" if task.name == "mnli" else "validation"
        if training_args.do_eval and eval_split not in raw:
            raise ValueError(f"--do_eval needs a validation split for {task.name}: pass --validation_file.")
        if training_args.do_predict and "test" not in raw:
            raise ValueError("--do_predict needs --test_file.")

    num_labels = task.num_labels
    label_kwargs = {"num_labels": num_labels, "finetuning_task": task.name}
    if task.is_regression:
        label_kwargs["problem_type"] = "regression"
    else:
        label_kwargs["id2label"] = dict(enumerate(task.label_list))
        label_kwargs["label2id"] = {name: i for i, name in enumerate(task.label_list)}

    # ---- tokenizer ----
    if model_args.tokenizer_name or model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                                  **model_args.tokenizer_kwargs())
    else:
        if "train" not in raw:
            raise ValueError("Without --model_name_or_path / --tokenizer_name a training split is needed to train a "
                             "tokenizer.")
        keys = [k for k in task.keys if k is not None]

        def texts():
            for i in range(0, len(raw["train"]), 1000):
                batch = raw["train"][i : i + 1000]
                for k in keys:
                    yield batch[k]

        logger.info(f"Training a WordPiece tokenizer (vocab {model_args.tokenizer_vocab_size}) on {task.name} train")
        tokenizer = train_wordpiece_tokenizer(
            texts(), vocab_size=model_args.tokenizer_vocab_size, model_max_length=data_args.max_seq_length
        )

    # ---- model ----
    if model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                            **model_args.hub_kwargs(), **label_kwargs)
        kwargs = {"config": config, "ignore_mismatched_sizes": model_args.ignore_mismatched_sizes,
                  **model_args.hub_kwargs()}
        if attention_given:
            kwargs["attn_implementation"] = cond_args.attn_implementation
        model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, **kwargs)
    else:
        reference = CrammedBertConfig()
        overrides = parse_config_overrides(model_args.config_overrides, reference)
        config = CrammedBertConfig(
            **{**overrides, **label_kwargs, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
        )
        model = AutoModelForSequenceClassification.from_config(
            config,
            condinit=cond_args.condinit_dict(training_args.seed),
            attn_implementation=cond_args.attn_implementation,
            trust_remote_code=model_args.trust_remote_code,
        )
    logger.info(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
                f"attention={model.config._attn_implementation}")

    # ---- preprocessing ----
    max_positions = getattr(model.config, "max_position_embeddings", None) or 10**9
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length, max_positions)
    if data_args.max_seq_length > max_seq_length:
        logger.warning(f"--max_seq_length {data_args.max_seq_length} reduced to {max_seq_length} (model/tokenizer).")
    padding = "max_length" if data_args.pad_to_max_length else False
    key1, key2 = task.keys

    def preprocess(examples):
        args = (examples[key1],) if key2 is None else (examples[key1], examples[key2])
        return tokenizer(*args, padding=padding, max_length=max_seq_length, truncation=True)

    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
              "validation_matched": data_args.max_eval_samples, "validation_mismatched": data_args.max_eval_samples,
              "test": data_args.max_predict_samples}
    for split in list(raw):  # truncate before tokenizing (cheap on CPU)
        n = limits.get(split)
        if n is not None and len(raw[split]) > n:
            raw[split] = raw[split].select(range(n))

    with training_args.main_process_first(desc="tokenizing"):
        raw = raw.map(
            preprocess,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            remove_columns=[c for c in (key1, key2, "idx") if c is not None and c in next(iter(raw.values())).column_names],
            desc="tokenizing",
        )

    train_dataset = raw["train"] if training_args.do_train else None
    eval_dataset = raw[eval_split] if training_args.do_eval else None

    metric = load_glue_metric(task.name)
    if data_args.pad_to_max_length:
        data_collator = default_data_collator
    else:
        data_collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)

    trainer = CondInitTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=make_compute_metrics(task, metric),
        processing_class=tokenizer,
        data_collator=data_collator,
    )

    make_throughput_callback(cond_args, trainer)
    make_periodic_checkpoint_callback(cond_args, trainer)
    if training_args.do_train:
        train_and_save(trainer, train_dataset, resume)

    combined: dict = {}
    if training_args.do_eval:
        evals = [(task.name, eval_dataset)]
        if task.name == "mnli":
            if "validation_mismatched" in raw:
                evals.append(("mnli-mm", raw["validation_mismatched"]))
            else:
                logger.warning("MNLI: no mismatched validation set (--validation_mismatched_file); matched only.")
        for name, dataset in evals:
            metrics = trainer.evaluate(eval_dataset=dataset)
            metrics["eval_samples"] = len(dataset)
            if name == "mnli-mm":
                metrics = {k + "_mm": v for k, v in metrics.items()}
            combined.update(metrics)
            trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", combined)

    if training_args.do_predict:
        predict_dataset = raw["test"]
        if "label" in predict_dataset.column_names:
            predict_dataset = predict_dataset.remove_columns("label")
        predictions = trainer.predict(predict_dataset, metric_key_prefix="predict").predictions
        predictions = np.squeeze(predictions) if task.is_regression else np.argmax(predictions, axis=1)
        if trainer.is_world_process_zero():
            path = os.path.join(training_args.output_dir, f"predict_results_{task.name}.txt")
            with open(path, "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    value = f"{item:3.3f}" if task.is_regression else task.label_list[int(item)]
                    writer.write(f"{index}\t{value}\n")
    return combined


def run_suite(model_args, data_args, cond_args, training_args, attention_given: bool = True) -> dict:
    """Run the GLUE tasks and write ``glue_suite.json`` / ``glue_suite.md`` into ``output_dir``."""
    tasks = SUITE_TASKS if not data_args.suite_tasks else tuple(
        get_task(t).name for t in data_args.suite_tasks.split(",") if t.strip()
    )
    label = data_args.suite_label or model_args.model_name_or_path or f"scratch-{cond_args.init}"
    plan = []  # every task checked (files, output folder) before the first one starts
    for task in tasks:
        with user_errors():
            files = suite_task_files(task, data_args.suite_files, data_args.glue_data_dir)
            if training_args.do_train and files and "train" not in files:
                raise ValueError(f"--glue_suite: no training file for {task} (looked in {data_args.glue_data_dir}).")
            if training_args.do_eval and files and "validation" not in files:
                raise ValueError(f"--glue_suite: no validation file for {task} (looked in {data_args.glue_data_dir}).")
        task_training = copy.deepcopy(training_args)
        task_training.output_dir = os.path.join(training_args.output_dir, task)
        task_training.do_predict = False
        resume = check_task(model_args, cond_args, task_training, attention_given)
        plan.append((task, files, task_training, resume))
    per_task: dict[str, dict] = {}
    for task, files, task_training, resume in plan:
        task_data = dataclasses.replace(
            data_args,
            glue_suite=False,
            task_name=task,
            train_file=files.get("train"),
            validation_file=files.get("validation"),
            validation_mismatched_file=files.get("validation_mismatched"),
            test_file=None,
        )
        logger.info(f"===== GLUE suite: {task} ({files or 'hub'}) =====")
        per_task[task] = run_task(model_args, task_data, cond_args, task_training, attention_given, resume)
    average, n_tasks = glue_average(per_task, tasks)
    result = {
        "label": label,
        "tasks": {t: {"metrics": per_task[t], "score": glue_task_score(t, per_task[t])} for t in tasks},
        "average": average,
        "n_tasks": n_tasks,
    }
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "glue_suite.json"), "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
    with open(os.path.join(training_args.output_dir, "glue_suite.md"), "w") as handle:
        handle.write(format_glue_table([(label, per_task)], tasks))
    logger.info("\n" + format_glue_table([(label, per_task)], tasks))
    return result


def parse(argv: list[str] | None = None):
    """``((model_args, data_args, cond_args, training_args), attention_given)``; without ``--output_dir`` each arm
    gets ``runs/glue-<task or suite>-<init or from-model>-<attention>``. Raises ``UsageError`` for a bad flag."""
    parsed, attention_given = parse_and_set_up(
        (ModelArguments, DataTrainingArguments, CondInitArguments, GlueTrainingArguments), argv, logger,
        output_prefix=lambda parsed: "glue-" + ("suite" if parsed[1].glue_suite else parsed[1].task_name or "custom"),
        run_modes=("do_train", "do_eval", "do_predict"),
    )  # fmt: skip
    model_args, _, cond_args, _ = parsed
    check_loaded_model_flags(cond_args, argv, model_args.model_name_or_path)
    if not model_args.model_name_or_path:
        with user_errors():
            cond_args.condinit_dict(parsed[-1].seed)  # a bad or unused init option fails here
    return parsed, attention_given


def main(argv: list[str] | None = None):
    (model_args, data_args, cond_args, training_args), attention_given = parse(argv)

    if data_args.glue_suite:
        return run_suite(model_args, data_args, cond_args, training_args, attention_given)
    resume = check_task(model_args, cond_args, training_args, attention_given)
    return run_task(model_args, data_args, cond_args, training_args, attention_given, resume)


def _mp_fn(index):
    main()


if __name__ == "__main__":
    run_main(main)
