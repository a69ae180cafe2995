#!/usr/bin/env python
"""Masked-language-model pretraining (Crammed BERT by default) with hf_condinit initialisations and attention variants.

HF example structure (``ModelArguments`` / ``DataTrainingArguments`` / ``TrainingArguments``), plus:

- ``CondInitArguments`` (``hf_condinit.scripts_common``, shared with ``run_clm.py``): ``--init
  {default,mimetic,conditioned}`` (the attention init of a model built from config:
  ``from_config(config, condinit={"method": init, "seed": seed, ...}, attn_implementation=attention)``),
  ``--attention {default,sdpa,eager,affine_scaled,attention_sink,preconditioned}`` (default: transformers' choice)
  and the method options (``--value_init``, ``--qk_gain``, ``--spectral_lambda``, ...); with
  ``--model_name_or_path`` the attention is changed only when ``--attention`` is given; at the defaults a model type
  without an attention layout (``--model_type fnet``) is built and trained as transformers does;
- ``CondInitTrainer``: no weight decay on ``condinit_`` holders, biases, norms and other < 2-D parameters;
- no ``--model_name_or_path``: a Crammed BERT built from ``CrammedBertConfig`` (docs/methods.md §7), adjustable with
  ``--config_overrides "num_hidden_layers=4,hidden_size=256"``; ``--model_name_or_path`` loads any MLM checkpoint
  with ``from_pretrained`` (never re-initialised);
- no ``--tokenizer_name``: an uncased WordPiece tokenizer trained on the training split (saved with the model);
- crammed recipe defaults: MLM rate 0.25, AdamW β = (0.9, 0.98), ε = 1e-12, weight decay 0.01, peak lr 1e-3,
  gradient clipping 0.5 and a triangular (one-cycle) schedule. The triangle is HF's ``linear`` scheduler with
  ``warmup_steps=0.5``: linear warm-up from 0 to the peak over the first half of training, linear decay to 0 over the
  second half (cramming's ``budget-triangle2``). Pass ``--lr_scheduler_type`` / ``--warmup_steps`` to change it.

Lines that are exactly ``<|endoftext|>`` (TinyStories' document separators) are dropped; the rest of the text is
tokenized line by line (``[CLS] line [SEP]``) and packed into ``--max_seq_length`` blocks, as HF's ``run_mlm.py``.

Example::

    python run_mlm.py --train_file ../shared/data/tinystories/TinyStories-train.sample-2MiB.txt \\
        --config_overrides "num_hidden_layers=4,hidden_size=256,num_attention_heads=4,intermediate_size=1024" \\
        --tokenizer_vocab_size 8192 --max_seq_length 128 --init conditioned --attention sdpa \\
        --per_device_train_batch_size 64 --max_steps 1000 --output_dir out/mlm_conditioned --do_train --do_eval
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    TrainingArguments,
    set_seed,
)

import hf_condinit  # noqa: F401  (installs the hooks, registers attention variants and Crammed BERT)
from hf_condinit.data.streaming import check_first_blocks, split_by_rank
from hf_condinit.data.text import load_raw_datasets, pack_datasets, split_sources, tokenize_datasets
from hf_condinit.data.tokenizer import batch_iterator
from hf_condinit.models.crammed_bert import CrammedBertConfig, train_wordpiece_tokenizer
from hf_condinit.scripts_common import (
    CondInitArguments,
    CondInitTrainer,
    TokenizerHubArguments,
    UsageError,
    check_attention_usable,
    check_loaded_model_flags,
    claim_output_dir,
    config_for_model_type,
    evaluate_with_perplexity,
    find_last_checkpoint,
    make_periodic_checkpoint_callback,
    make_throughput_callback,
    model_class,
    parse_and_set_up,
    parse_config_overrides,
    recipe_applies,
    run_main,
    select_splits,
    train_and_save,
    user_errors,
)

logger = logging.getLogger(__name__)

DOC_SEPARATORS = ("<|endoftext|>",)


@dataclass
class ModelArguments(TokenizerHubArguments):
    """HF's ``run_mlm.py`` model fields (the hub fields of :class:`TokenizerHubArguments` included) plus the WordPiece
    trained when no tokenizer is given."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Checkpoint to continue pretraining (from_pretrained). Default: a new Crammed BERT."},
    )
    model_type: str | None = field(
        default=None,
        metadata={"help": "Train a new model from this model type's default config (e.g. bert, roberta), adjusted "
                          "with --config_overrides. Default: Crammed BERT (crammed_bert)."},
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Config name or path, if not the same as model_name_or_path."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Override config attributes of a model built from scratch, e.g. "
            "'num_hidden_layers=4,hidden_size=256,num_attention_heads=4,intermediate_size=1024'."
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or path. Default: train a WordPiece on the training data."}
    )
    tokenizer_vocab_size: int = field(
        default=32768, metadata={"help": "Vocabulary size of the WordPiece tokenizer trained when none is given."}
    )


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset name (needs network)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    train_file: str | None = field(default=None, metadata={"help": "Training text (.txt/.raw/.tokens/.json/.jsonl)."})
    validation_file: str | None = field(default=None, metadata={"help": "Validation text, same format."})
    text_column: str | None = field(default=None, metadata={"help": "Text column of json / hub data."})
    validation_split_percentage: float = field(
        default=5, metadata={"help": "Without --validation_file: the first N %% of the training rows."}
    )
    max_seq_length: int = field(default=128, metadata={"help": "Block length after packing (crammed: 128)."})
    mlm_probability: float = field(default=0.25, metadata={"help": "Masking rate (crammed: 0.25)."})
    line_by_line: bool = field(
        default=False,
        metadata={"help": "One sequence per line (truncated to --max_seq_length) instead of packed blocks."},
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "With --line_by_line: pad every line to --max_seq_length (default: per batch)."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "Stream the data: read, tokenize and pack on the fly (no Arrow cache of the corpus), the "
                  "same blocks in the same order as without it; needs --max_steps (docs/pretraining.md, "
                  "\"Streaming\")."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the packed training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the packed evaluation blocks."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for preprocessing."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the cached preprocessing."})

    def __post_init__(self):
        if self.dataset_name is None and self.train_file is None:
            raise ValueError("run_mlm.py needs --train_file (a local text file) or --dataset_name (hub).")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}.")
        if self.max_seq_length < 8:
            raise ValueError(f"--max_seq_length must be at least 8, got {self.max_seq_length}.")


@dataclass
class MLMTrainingArguments(TrainingArguments):
    """TrainingArguments with the crammed pretraining recipe as defaults (docs/methods.md §7)."""

    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate (crammed: 1e-3)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW β1."})
    adam_beta2: float = field(default=0.98, metadata={"help": "AdamW β2 (crammed: 0.98)."})
    adam_epsilon: float = field(default=1e-12, metadata={"help": "AdamW ε (crammed: 1e-12)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (crammed: 0.01)."})
    max_grad_norm: float = field(default=0.5, metadata={"help": "Gradient clipping (crammed: 0.5)."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "With warmup_steps=0.5 'linear' is the triangular one-cycle schedule."}
    )
    warmup_steps: float = field(
        default=0.5, metadata={"help": "Warm-up steps (>= 1) or fraction of training (< 1); 0.5 = triangle."}
    )
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (AdamW)."})


def build_config(model_args: ModelArguments, vocab_size: int, pad_token_id: int, max_len: int):
    """The config of a new model: ``--config_name``, ``--model_type``'s default or a default Crammed BERT, then
    ``--config_overrides``."""
    if model_args.config_name and model_args.model_type:
        raise ValueError("--model_type and --config_name both describe the new model; pass one.")
    if model_args.config_name:
        config = AutoConfig.from_pretrained(model_args.config_name, **model_args.hub_kwargs())
        config_cls, base = type(config), config.to_dict()
    elif model_args.model_type:
        config = config_for_model_type(model_args.model_type, AutoModelForMaskedLM)
        config_cls, base = type(config), config.to_dict()
    else:
        config_cls, base = CrammedBertConfig, {}
    overrides = parse_config_overrides(model_args.config_overrides, config_cls(**base))
    kwargs = {**base, **overrides}
    kwargs["vocab_size"] = vocab_size
    kwargs["pad_token_id"] = pad_token_id
    kwargs.setdefault("max_position_embeddings", max(max_len, 128))
    if kwargs["max_position_embeddings"] < max_len:
        raise ValueError(
            f"--max_seq_length {max_len} exceeds max_position_embeddings={kwargs['max_position_embeddings']}."
        )
    return config_cls(**kwargs)


def mlm_accuracy(eval_preds) -> dict:
    """Masked-token accuracy from (predictions, labels) of the same (batch, seq) shape (see
    :func:`preprocess_logits_for_metrics`)."""
    preds, labels = eval_preds
    preds, labels = np.asarray(preds), np.asarray(labels)
    mask = labels != -100
    return {"accuracy": float((preds[mask] == labels[mask]).mean()) if mask.any() else float("nan")}


def preprocess_logits_for_metrics(logits, labels):
    """Argmax predictions shaped like ``labels`` (-100 where unmasked).

    Crammed BERT's sparse head returns logits for the masked positions only, ``(n_masked, vocab)`` in row-major order;
    they are scattered back to ``(batch, seq)`` so the Trainer can gather and truncate them per sample.
    """
    if isinstance(logits, tuple):
        logits = logits[0]
    preds = logits.argmax(dim=-1)
    if preds.shape == labels.shape:
        return preds
    mask = labels != -100
    if preds.ndim != 1 or preds.shape[0] != int(mask.sum()):
        raise ValueError(f"Cannot align MLM logits of shape {tuple(logits.shape)} with labels {tuple(labels.shape)}.")
    full = labels.new_full(labels.shape, -100)
    full[mask] = preds
    return full


def parse(argv: list[str] | None = None):
    """``((model_args, data_args, cond_args, training_args), attention_given)``; without ``--output_dir`` each arm
    gets ``runs/mlm-<init>-<attention>``. Raises ``UsageError`` for a bad flag."""
    return parse_and_set_up(
        (ModelArguments, DataTrainingArguments, CondInitArguments, MLMTrainingArguments), argv, logger,
        output_prefix="mlm",
    )  # fmt: skip


def main(argv: list[str] | None = None):
    (model_args, data_args, cond_args, training_args), attention_given = parse(argv)

    # ---- every check that can fail, before any data or model work ----
    with user_errors():
        check_loaded_model_flags(cond_args, argv, model_args.model_name_or_path)
        condinit = None if model_args.model_name_or_path else cond_args.condinit_dict(training_args.seed)
        config = reference_config(model_args, data_args)  # a bad --config_overrides / --max_seq_length fails here
        if condinit is not None and not recipe_applies(cond_args, config):
            condinit = None  # no attention layout, no plugin flag: built and trained as transformers does
        if data_args.streaming and training_args.do_train and training_args.max_steps <= 0:
            raise UsageError("--streaming needs --max_steps N: a stream has no length to count epochs in.")
        if data_args.pad_to_max_length and not data_args.line_by_line:
            raise UsageError("--pad_to_max_length pads --line_by_line sequences; packed blocks are all "
                             "--max_seq_length long already.")
        if attention_given or not model_args.model_name_or_path:
            check_attention_usable(cond_args.attention, model_class(AutoModelForMaskedLM, config,
                                                                    model_args.model_name_or_path,
                                                                    model_args.hub_kwargs()),
                                   config, training_args.use_cpu)
        last_checkpoint = find_last_checkpoint(training_args, logger)

    set_seed(training_args.seed)
    with user_errors(training_args.output_dir):
        claim_output_dir(training_args)
        tokenizer, lm_datasets = prepare_data(model_args, data_args, training_args)
        train_dataset, eval_dataset = select_splits(lm_datasets, training_args, data_args.max_train_samples,
                                                    data_args.max_eval_samples, data_args.streaming,
                                                    model_args.cache_dir)
    model = build_model(model_args, cond_args, tokenizer, data_args, condinit, attention_given)

    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm_probability=data_args.mlm_probability,
        seed=training_args.data_seed if training_args.data_seed is not None else training_args.seed,
    )

    trainer = CondInitTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=mlm_accuracy if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

    make_throughput_callback(cond_args, trainer)
    make_periodic_checkpoint_callback(cond_args, trainer)
    if training_args.do_train:
        train_and_save(trainer, train_dataset, last_checkpoint)
    if training_args.do_eval:
        evaluate_with_perplexity(trainer, eval_dataset)

    return trainer


def reference_config(model_args: ModelArguments, data_args: DataTrainingArguments):
    """The config the model will have (loaded, or :func:`build_config`'s with a placeholder vocabulary), for the
    checks made before any work (``--config_overrides``, ``--max_seq_length``, ``--attention``)."""
    if model_args.model_name_or_path:
        for flag in ("model_type", "config_overrides"):
            if getattr(model_args, flag):
                raise ValueError(f"--{flag} describes a new model; a loaded one (--model_name_or_path) keeps its own.")
        return AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                          **model_args.hub_kwargs())
    return build_config(model_args, model_args.tokenizer_vocab_size, 0, data_args.max_seq_length)


def prepare_data(model_args, data_args, training_args):
    """Load the text, get the tokenizer (loaded, or a WordPiece trained on the training split), tokenize and pack.
    Returns ``(tokenizer, lm_datasets)``."""
    raw_datasets, text_column = load_raw_datasets(
        dataset_name=data_args.dataset_name,
        dataset_config_name=data_args.dataset_config_name,
        train_file=data_args.train_file,
        validation_file=data_args.validation_file,
        validation_split_percentage=data_args.validation_split_percentage,
        text_column=data_args.text_column,
        keep_linebreaks=False,
        cache_dir=model_args.cache_dir,
        token=model_args.token,
        streaming=data_args.streaming,
    )
    raw_datasets = raw_datasets.filter(
        lambda batch: [t.strip() not in DOC_SEPARATORS for t in batch[text_column]], batched=True
    )
    if not data_args.streaming and len(raw_datasets["train"]) == 0:
        raise ValueError(f"the training data ({data_args.train_file or data_args.dataset_name}) has no text rows.")

    # ---- tokenizer ----
    if model_args.tokenizer_name or model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                                  **model_args.tokenizer_kwargs())
    else:
        logger.info(f"Training a WordPiece tokenizer (vocab {model_args.tokenizer_vocab_size}) on the training split")
        tokenizer = train_wordpiece_tokenizer(
            batch_iterator(raw_datasets["train"], text_column),
            vocab_size=model_args.tokenizer_vocab_size,
            model_max_length=data_args.max_seq_length,
        )
    if tokenizer.mask_token is None:
        raise ValueError("The tokenizer has no mask token; masked-language modelling needs one.")
    raw_datasets = split_by_rank(raw_datasets, training_args.process_index, training_args.world_size)  # --streaming

    max_seq_length = data_args.max_seq_length
    if model_args.model_name_or_path:
        max_positions = getattr(reference_config(model_args, data_args), "max_position_embeddings", None)
        max_seq_length = min(max_seq_length, max_positions or max_seq_length)
    sources = split_sources(data_args.train_file, data_args.validation_file, data_args.dataset_name,
                            data_args.validation_split_percentage)
    with training_args.main_process_first(desc="tokenizing and packing"):
        tokenized = tokenize_datasets(
            raw_datasets,
            tokenizer,
            text_column,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            max_length=max_seq_length if data_args.line_by_line else None,
            pad_to_max_length=data_args.pad_to_max_length,
        )
        if data_args.line_by_line:
            if data_args.streaming:
                check_first_blocks(tokenized, max_seq_length, sources)
            return tokenizer, tokenized
        lm_datasets = pack_datasets(
            tokenized,
            max_seq_length,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            add_labels=False,
            sources=sources,
        )
    return tokenizer, lm_datasets


def build_model(model_args, cond_args, tokenizer, data_args, condinit, attention_given: bool):
    """Load ``--model_name_or_path`` (never re-initialised) or build a new model with the condinit recipe
    (``None``: as transformers builds it)."""
    if model_args.model_name_or_path:
        kwargs = model_args.hub_kwargs()
        if model_args.config_name:
            kwargs["config"] = reference_config(model_args, data_args)
        if attention_given:
            kwargs["attn_implementation"] = cond_args.attn_implementation
        model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    else:
        config = build_config(model_args, len(tokenizer), tokenizer.pad_token_id, data_args.max_seq_length)
        recipe = {} if condinit is None else {"condinit": condinit}  # None: transformers' own from_config call
        model = AutoModelForMaskedLM.from_config(config, **recipe, attn_implementation=cond_args.attn_implementation,
                                                 trust_remote_code=model_args.trust_remote_code)
    n_params = sum(p.numel() for p in model.parameters())
    init = cond_args.init if condinit is not None or model_args.model_name_or_path else "the model's own (no recipe)"
    logger.info(f"Model {type(model).__name__}: {n_params / 1e6:.2f}M parameters, init={init}, "
                f"attention={model.config._attn_implementation}")
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))

    return model


def _mp_fn(index):
    main()


if __name__ == "__main__":
    run_main(main)
