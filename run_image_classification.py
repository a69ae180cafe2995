#!/usr/bin/env python
"""Image classification from scratch (ViT, DeiT, Swin) with conditioned / mimetic init, in the style of HF's
``examples/pytorch/image-classification/run_image_classification.py``.

    python run_image_classification.py --init mimetic --model_config vit-cpu-cifar \\
        --train_file ../shared/data/cifar10/train.parquet --validation_file ../shared/data/cifar10/test_dev.parquet \\
        --do_train --do_eval --max_steps 300 --per_device_train_batch_size 64 --output_dir out/vit-mimetic

- Data: ``--dataset_name`` (hub; needs network or a local datasets cache) or local ``--train_file`` /
  ``--validation_file``, each a ``datasets`` parquet file (an ``Image`` column and a ``ClassLabel`` column) or an
  imagefolder directory (``<dir>/<class name>/<image>``). Without validation data, ``--train_val_split`` of the
  training rows become the validation split (as in HF's example). Columns are found from the features unless
  ``--image_column_name`` / ``--label_column_name`` are given (``hf_condinit.vision``).
- Model: built from config (``--model_config``: a name in ``configs/`` such as ``vit-cpu-cifar`` / ``vit-tiny-cifar``,
  a path or a hub id, resolved as in ``run_clm.py`` by ``scripts_common.resolve_model_config``;
  ``--config_overrides``), the number of labels and their names taken from the data, with ``--init``, ``--attention``
  and the method options of ``hf_condinit.scripts_common.CondInitArguments`` (shared with ``run_clm.py`` /
  ``run_mlm.py`` / ``run_glue.py``). ``--model_name_or_path`` loads a checkpoint instead (never re-initialised;
  ``--init``, its options, ``--model_config`` and ``--config_overrides`` are refused with it). The image processor is
  a ``ViTImageProcessor`` built locally from the config (size, mean / std 0.5), or ``--image_processor_name``; it is
  saved with the model.
- Transforms (``hf_condinit.vision.ImageTransform``): training images get a random crop with zero padding
  (``--random_crop_padding``, 4) and a random horizontal flip (``--no_horizontal_flip`` to disable), the usual
  CIFAR augmentation; every image is scaled to [0, 1] and normalised with the processor's mean / std.
- Training recipe as defaults (small-data ViT): AdamW lr 1e-3, weight decay 0.05 (not on biases, norms and
  ``condinit_`` holders: ``CondInitTrainer``), cosine schedule with 5 % warm-up, gradient clipping 1.0, batch 128.
- Metrics: top-1 accuracy through the ``evaluate`` module shipped in the package (loaded by path, no hub), in
  ``<output_dir>/eval_results.json`` as ``eval_accuracy``. ``--log_condition_number_every N`` logs κ(J) of every
  attention head on a fixed probe of ``--condition_number_probe_size`` validation images (whole images: every patch
  token; an encoder has no mask, so κ is the unmasked one).
- Script policy shared with ``run_clm.py`` / ``run_mlm.py`` / ``run_glue.py`` (``hf_condinit.scripts_common``): a user
  error (bad flag, unreadable file, an ``--attention`` this machine cannot run, an init option the method never
  reads, ``--init`` with ``--model_name_or_path``) is one line ``run_image_classification.py: error: ...`` and exit
  code 2, before any model work, leaving no output folder; without ``--output_dir`` each arm gets
  ``runs/image-<init>-<attention>``; a finished ``--output_dir`` is refused, an unfinished one (checkpoints, killed in
  training or in its final writes) resumes; ``--log_throughput`` logs seconds per step.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    TrainingArguments,
    ViTImageProcessorPil,
    set_seed,
)

import hf_condinit  # noqa: F401  (installs the hooks, registers the attention variants)
from hf_condinit.scripts_common import (
    CondInitArguments,
    CondInitTrainer,
    HubArguments,
    UsageError,
    check_attention_usable,
    check_loaded_model_flags,
    claim_output_dir,
    config_for_model_type,
    find_last_checkpoint,
    make_condition_number_callback,
    make_periodic_checkpoint_callback,
    make_throughput_callback,
    model_class,
    parse_and_set_up,
    recipe_applies,
    resolve_model_config,
    run_main,
    train_and_save,
    user_errors,
)
from hf_condinit.vision import (
    ImageTransform,
    check_image_source,
    collate_fn,
    image_and_label_columns,
    load_accuracy_metric,
    load_image_datasets,
)

logger = logging.getLogger(__name__)

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
DEFAULT_MODEL_CONFIG = "vit-cpu-cifar"


@dataclass
class ModelArguments(HubArguments):
    """HF's ``run_image_classification.py`` model fields (``--model_type``, ``--config_name`` = ``--model_config``,
    the hub fields of :class:`HubArguments`) plus the project's ``--model_config`` names."""

    model_config: str | None = field(
        default=None,
        metadata={"help": "Model shape: a name in configs/ (vit-cpu-cifar, vit-tiny-cifar), a path to a config.json "
                          "or a directory holding one, or a hub id. Default: vit-cpu-cifar. Trained from scratch.",
                  "aliases": ["--config_name"]},
    )
    model_type: str | None = field(
        default=None,
        metadata={"help": "Train a new model from this model type's default config (e.g. vit, deit, swin), "
                          "adjusted with --config_overrides. Default: --model_config."},
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A checkpoint to finetune instead (from_pretrained; never re-initialised)."}
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Override config values, e.g. 'num_hidden_layers=4,hidden_size=96'."}
    )
    image_processor_name: str | None = field(
        default=None, metadata={"help": "Image processor path or hub id. Default: a ViTImageProcessor from the config."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Allow a checkpoint whose head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset, e.g. uoft-cs/cifar10 (network)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration."})
    train_file: str | None = field(
        default=None, metadata={"help": "Local training data: a .parquet file or an imagefolder directory.",
                                "aliases": ["--train_dir"]}
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "Local validation data: a .parquet file or an imagefolder directory.",
                                "aliases": ["--validation_dir"]}
    )
    train_val_split: float = field(
        default=0.15, metadata={"help": "Without validation data: this fraction of the training rows becomes it."}
    )
    image_column_name: str | None = field(
        default=None, metadata={"help": "Image column (default: the only Image feature, or 'image' / 'img')."}
    )
    label_column_name: str | None = field(
        default=None, metadata={"help": "Label column (default: the only ClassLabel feature, or 'label' / 'labels')."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use N training images, drawn at random (--seed) as in HF's example."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use N validation images, drawn at random (--seed) as in HF's example."}
    )
    random_crop_padding: int = field(
        default=4, metadata={"help": "Training augmentation: zero padding before the random crop (0: no crop)."}
    )
    horizontal_flip: bool = field(
        default=True, metadata={"help": "Training augmentation: random horizontal flip (--no_horizontal_flip)."}
    )

    def __post_init__(self):
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("run_image_classification.py needs data: --dataset_name, or --train_file / "
                             "--validation_file (.parquet or an imagefolder directory)")
        if self.dataset_name is not None and (self.train_file or self.validation_file):
            raise ValueError("pass either --dataset_name or --train_file / --validation_file, not both")
        for flag, path in (("--train_file", self.train_file), ("--validation_file", self.validation_file)):
            if path is not None:
                check_image_source(path, flag)
        if not 0.0 < self.train_val_split < 1.0:
            raise ValueError(f"--train_val_split must be in (0, 1), got {self.train_val_split}")
        if self.random_crop_padding < 0:
            raise ValueError(f"--random_crop_padding must be >= 0, got {self.random_crop_padding}")


@dataclass
class ImageTrainingArguments(TrainingArguments):
    """TrainingArguments with a small-data ViT recipe as defaults (AdamW, cosine, 5 % warm-up)."""

    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate."})
    weight_decay: float = field(default=0.05, metadata={"help": "AdamW weight decay (not on biases / norms)."})
    per_device_train_batch_size: int = field(default=128, metadata={"help": "Training batch size per device."})
    per_device_eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch size per device."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(default=0.05, metadata={"help": "Warm-up: fraction (< 1) or steps."})
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (AdamW)."})
    logging_steps: float = field(default=25, metadata={"help": "Log the training loss every N steps."})
    save_strategy: str = field(default="no", metadata={"help": "Checkpointing: no (default), steps or epoch."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep the image column for the on-the-fly transform (HF example)."}
    )


def model_config(model_args: ModelArguments):
    """The config of the model before the labels are known: the checkpoint's (``--model_name_or_path``), or a new
    model's from ``--model_type`` or ``--model_config`` (default ``vit-cpu-cifar``) and ``--config_overrides``.
    ``UsageError`` for ``--model_type`` / ``--model_config`` / ``--config_overrides`` with a loaded model, or for
    both ``--model_type`` and ``--model_config``."""
    if model_args.model_name_or_path:
        for flag in ("model_type", "model_config", "config_overrides"):
            if getattr(model_args, flag):
                raise UsageError(f"--{flag} describes a new model; a loaded one (--model_name_or_path) keeps its own.")
        return AutoConfig.from_pretrained(model_args.model_name_or_path, **model_args.hub_kwargs())
    if model_args.model_type:
        if model_args.model_config:
            raise UsageError("--model_type and --model_config (--config_name) both describe the new model; pass one.")
        return config_for_model_type(model_args.model_type, AutoModelForImageClassification,
                                     model_args.config_overrides)
    config, _ = resolve_model_config(model_args.model_config or DEFAULT_MODEL_CONFIG, CONFIG_DIR,
                                     model_args.config_overrides, model_args.cache_dir, model_args.token)
    return config


def label_names(dataset, label_column: str) -> list[str]:
    """Class names of a ``ClassLabel`` column, else the sorted distinct values as strings."""
    feature = dataset.features[label_column]
    names = getattr(feature, "names", None)
    if names:
        return list(names)
    return [str(v) for v in sorted(set(dataset[label_column]))]


def probe_pixels(dataset, transform: ImageTransform, n: int):
    """The first ``n`` images of ``dataset`` as a (n, C, H, W) batch through the evaluation ``transform``."""
    n = min(n, len(dataset))
    return transform.pixels(dataset.select(range(n))[transform.image_column]).sub(transform.mean).div(transform.std)


def load_data(model_args, data_args, training_args):
    """The image splits the run needs (``train`` with ``--do_train``, ``validation`` with ``--do_eval``: the local
    files, the hub splits, or ``--train_val_split`` of the training rows), cut to ``--max_train_samples`` /
    ``--max_eval_samples`` (shuffled first: files may be sorted by class). ``ValueError`` for missing splits or
    columns; ``OSError`` / ``ValueError`` from ``datasets`` for an unreadable file.

    Returns ``(raw, image_column, label_column, labels)``: a ``DatasetDict``, its column names, the class names."""
    with training_args.main_process_first(desc="loading the images"):
        raw = load_image_datasets(data_args.dataset_name, data_args.dataset_config_name, data_args.train_file,
                                  data_args.validation_file, model_args.cache_dir, model_args.token)
    if training_args.do_train and "train" not in raw:
        raise ValueError("--do_train needs training data: pass --train_file (or a --dataset_name with a train split)")
    if "validation" not in raw and "test" in raw and data_args.dataset_name is not None:
        raw["validation"] = raw.pop("test")
    if training_args.do_eval and "validation" not in raw:
        if "train" not in raw:
            raise ValueError("--do_eval needs validation data: pass --validation_file")
        split = raw["train"].train_test_split(data_args.train_val_split, seed=training_args.seed)
        raw["train"], raw["validation"] = split["train"], split["test"]
    first = next(iter(raw.values()))
    image_column, label_column = image_and_label_columns(first.features, data_args.image_column_name,
                                                         data_args.label_column_name)
    labels = label_names(first, label_column)
    for split, n in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples)):
        if n is not None and split in raw and len(raw[split]) > n:
            raw[split] = raw[split].shuffle(seed=training_args.seed).select(range(n))
    return raw, image_column, label_column, labels


def build_trainer(model_args, data_args, cond_args, training_args, attention_given: bool = True, data=None):
    """Everything up to a ready ``CondInitTrainer`` (data, model, image processor, transforms, metric, κ callback).

    ``data``: :func:`load_data`'s result when the caller loaded it already (``main``, to treat its errors as user
    errors), else it is loaded here. Returns ``(trainer, train_dataset, eval_dataset)``. Shared with
    ``benchmarks/compare.py --task vision``."""
    set_seed(training_args.seed)
    loaded = model_args.model_name_or_path
    condinit = None if loaded else cond_args.condinit_dict(training_args.seed)
    config = model_config(model_args)
    if condinit is not None and not recipe_applies(cond_args, config):
        condinit = None  # no attention layout, no plugin flag: built and trained as transformers does
    raw, image_column, label_column, labels = data if data is not None else load_data(model_args, data_args,
                                                                                      training_args)

    # ---- model and image processor ----
    config.update({"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                   "label2id": {name: i for i, name in enumerate(labels)}})
    if loaded:
        kwargs = {"config": config, "ignore_mismatched_sizes": model_args.ignore_mismatched_sizes,
                  **model_args.hub_kwargs()}
        if attention_given:
            kwargs["attn_implementation"] = cond_args.attn_implementation
        model = AutoModelForImageClassification.from_pretrained(loaded, **kwargs)
    else:
        recipe = {} if condinit is None else {"condinit": condinit}  # None: transformers' own from_config call
        model = AutoModelForImageClassification.from_config(config, **recipe,
                                                            attn_implementation=cond_args.attn_implementation,
                                                            trust_remote_code=model_args.trust_remote_code)
    if model_args.image_processor_name or loaded:
        image_processor = AutoImageProcessor.from_pretrained(model_args.image_processor_name or loaded,
                                                             **model_args.hub_kwargs())
    else:
        image_processor = ViTImageProcessorPil(size={"height": config.image_size, "width": config.image_size})
    init = f"loaded from {loaded}" if loaded else (f"init={condinit['method']} seed={condinit['seed']}" if condinit
                                                   else "the model's own init (no attention layout: no recipe)")
    logger.info(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
                f"{init}, attention={model.config._attn_implementation}, {len(labels)} labels")

    # ---- transforms (HF example: set_transform per split) ----
    size = image_processor.size
    size = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    common = dict(image_column=image_column, label_column=label_column, size=size,
                  mean=image_processor.image_mean, std=image_processor.image_std)
    eval_transform = ImageTransform(**common, train=False)
    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = raw["train"]
        train_dataset.set_transform(ImageTransform(**common, train=True, padding=data_args.random_crop_padding,
                                                   flip=data_args.horizontal_flip, seed=training_args.seed))
    if training_args.do_eval:
        eval_dataset = raw["validation"]
        eval_dataset.set_transform(eval_transform)

    metric = load_accuracy_metric()

    def compute_metrics(p):
        return metric.compute(predictions=np.argmax(p.predictions, axis=1), references=p.label_ids)

    trainer = CondInitTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=image_processor,
        data_collator=collate_fn,
    )
    if cond_args.log_condition_number_every:
        source = raw["validation"] if "validation" in raw else raw["train"]
        probe = probe_pixels(source.with_format(None), eval_transform, cond_args.condition_number_probe_size)
        make_condition_number_callback(cond_args, None, trainer, probe_inputs=probe)
    return trainer, train_dataset, eval_dataset


def parse(argv: list[str] | None = None):
    """``((model_args, data_args, cond_args, training_args), attention_given)``; without ``--output_dir`` each arm
    gets ``runs/image-<init>-<attention>``. Raises ``UsageError`` for a bad flag."""
    return parse_and_set_up(
        (ModelArguments, DataTrainingArguments, CondInitArguments, ImageTrainingArguments), argv, logger,
        output_prefix="image",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    (model_args, data_args, cond_args, training_args), attention_given = parse(argv)
    loaded = model_args.model_name_or_path

    # ---- every check that can fail, before any data or model work ----
    with user_errors():
        check_loaded_model_flags(cond_args, argv, loaded)
        if not loaded:
            cond_args.condinit_dict(training_args.seed)
        config = model_config(model_args)
        if not loaded:
            recipe_applies(cond_args, config)  # a plugin flag on a type without an attention layout: one line
        if attention_given or not loaded:
            check_attention_usable(cond_args.attention, model_class(AutoModelForImageClassification, config, loaded,
                                                                    model_args.hub_kwargs()),
                                   config, training_args.use_cpu)
        last_checkpoint = find_last_checkpoint(training_args, logger)

    with user_errors(training_args.output_dir):
        claim_output_dir(training_args)
        data = load_data(model_args, data_args, training_args)
    trainer, train_dataset, eval_dataset = build_trainer(model_args, data_args, cond_args, training_args,
                                                         attention_given, data)
    make_throughput_callback(cond_args, trainer)
    make_periodic_checkpoint_callback(cond_args, trainer)

    results: dict = {}
    if training_args.do_train:
        results.update(train_and_save(trainer, train_dataset, last_checkpoint))
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)
    if trainer.is_world_process_zero():
        summary = {k: results[k] for k in ("eval_accuracy", "eval_loss", "train_loss", "train_runtime",
                                            "train_samples_per_second") if k in results}
        print(f"run_image_classification result ({cond_args.init}, {trainer.model.config._attn_implementation}) -> "
              f"{training_args.output_dir}: " + json.dumps(summary))
    return results


def _mp_fn(index):
    main()


if __name__ == "__main__":
    run_main(main)
