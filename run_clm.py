#!/usr/bin/env python
"""Causal-LM pretraining of GPT-2-style models with hf_condinit's attention initialisations and variants.

In the shape of Hugging Face's ``examples/pytorch/language-modeling/run_clm.py`` (HfArgumentParser over model /
data / ``TrainingArguments``, so every Trainer flag works: ``--deepspeed``, ``--bf16``, ``--gradient_checkpointing``,
``--report_to``, ``--resume_from_checkpoint``, ...), plus ``CondInitArguments`` (``--init``, ``--attention``,
``--spectral_lambda``, method options, ``--log_condition_number_every``).

    # embedded offline default: synthetic multi-query associative recall, tiny GPT-2, ~2 minutes on a laptop CPU
    python run_clm.py --init conditioned

    # real text, BPE trained on the training split and saved with the model
    python run_clm.py --init conditioned --model_config gpt2-small-cpu \\
        --train_file ../shared/data/tinystories/TinyStories-train.sample-2MiB.txt --block_size 256 \\
        --tokenizer_vocab_size 8192 --max_steps 600 --output_dir runs/ts-conditioned

    # continue pretraining a saved model (or a hub id) on new data
    python run_clm.py --model_name_or_path runs/ts-conditioned --train_file more.txt --output_dir runs/ts-more

    # the papers' sizes, DeepSpeed ZeRO (see docs/pretraining.md)
    deepspeed --num_gpus 8 run_clm.py --deepspeed ds_configs/zero2.json --model_config gpt2-472m --bf16 \\
        --init conditioned --dataset_name roneneldan/TinyStories --tokenizer_name gpt2 --block_size 1024 ...

Defaults: unless given on the command line (or in the ``.json`` argument file), the LM settings of docs/methods.md §7
apply (AdamW β=(0.9, 0.95), weight decay 0.1 with biases/norms/``condinit_`` holders exempt, cosine decay, 5 %
warmup, gradient clipping 1.0, lr 3e-4); see ``hf_condinit.scripts_common``. With neither ``--do_train`` nor
``--do_eval``, both run. Results: ``<output_dir>/eval_results.json`` (``eval_loss``, ``perplexity`` = exp(eval loss),
``recall_accuracy`` on the synthetic task, and with ``--blimp_dir DIR`` the zero-shot ``blimp_accuracy`` overall,
``blimp_field_accuracy`` and ``blimp_paradigm_accuracy``: ``hf_condinit.zero_shot``), ``train_results.json``,
``all_results.json``. Without ``--output_dir`` each arm gets its own folder (``runs/clm-synthetic-conditioned-sdpa``,
...); an ``--output_dir`` holding an unfinished run resumes from its last checkpoint, one holding a finished run is refused
(``hf_condinit.scripts_common.find_last_checkpoint``). User errors print one line and exit 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

import hf_condinit  # noqa: F401  (installs the hooks, registers the attention variants)
from hf_condinit.data import (
    MQARSpec,
    batch_iterator,
    check_data_file,
    load_raw_datasets,
    make_mqar_datasets,
    mqar_recall_accuracy,
    mqar_tokenizer,
    materialize,
    pack_datasets,
    split_sources,
    tokenize_datasets,
    train_bpe_tokenizer,
)
from hf_condinit.evaluation.minimal_pairs import context_length, load_minimal_pairs
from hf_condinit.scripts_common import (
    LM_TRAINING_DEFAULTS,
    CondInitArguments,
    CondInitTrainer,
    SpeedLeverArguments,
    TokenizerHubArguments,
    UsageError,
    apply_speed_levers,
    check_attention_usable,
    check_loaded_model_flags,
    check_resume_vocabulary,
    check_speed_levers,
    claim_output_dir,
    config_for_model_type,
    evaluate_with_perplexity,
    find_last_checkpoint,
    flags_given,
    make_condition_number_callback,
    make_periodic_checkpoint_callback,
    make_throughput_callback,
    maybe_init_distributed,
    model_class,
    parse_and_set_up,
    recipe_applies,
    resolve_model_config,
    run_main,
    select_splits,
    single_process_launch_env,
    train_and_save,
    user_errors,
    with_causal_loss_type,
)
from hf_condinit.data.streaming import split_by_rank
from hf_condinit.zero_shot import record_blimp

logger = logging.getLogger("run_clm")

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(HERE, "configs")

# Extra defaults of the embedded synthetic run (only when no data flag is given, and only for flags not given).
DEMO_DEFAULTS = {
    "max_steps": 600,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 64,
    "learning_rate": 2e-3,
    "warmup_steps": 0.05,
    "logging_steps": 50,
    "save_strategy": "no",
    "eval_strategy": "no",
}
DATA_FLAGS = ("dataset_name", "train_file", "validation_file")


TORCH_DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class ModelArguments(TokenizerHubArguments, SpeedLeverArguments):
    """HF's ``run_clm.py`` model fields (``--model_type``, ``--config_name`` = ``--model_config``, ``--dtype`` =
    ``--torch_dtype``, the hub fields of :class:`TokenizerHubArguments`) plus the project's ``--model_config`` names and
    the BPE trained when no tokenizer is given, and the speed levers of :class:`SpeedLeverArguments`."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Continue pretraining a saved model: a directory written by this script (or save_pretrained) or a "
            "hub id. Its weights are loaded as they are (--init refused); its tokenizer is used unless "
            "--tokenizer_name is given. Default: train a new model of --model_config from scratch."
        },
    )
    model_type: str | None = field(
        default=None,
        metadata={"help": "Train a new model from this model type's default config (HF's way to train from scratch, "
                          "e.g. gpt2, llama), adjusted with --config_overrides. Default: --model_config."},
    )
    torch_dtype: str | None = field(
        default=None,
        metadata={"help": "With --model_name_or_path: load the weights in this dtype ('auto': the checkpoint's).",
                  "choices": list(TORCH_DTYPES), "aliases": ["--dtype"]},
    )
    model_config: str | None = field(
        default=None,
        metadata={
            "help": "Model shape of a new model: a name in configs/ (gpt2-tiny, gpt2-small-cpu, gpt2-472m, "
            "gpt2-1.72b), a path to a config.json or a directory holding one, or a hub id. Default: gpt2-tiny for "
            "the synthetic run, gpt2-small-cpu with data.",
            "aliases": ["--config_name"],
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Override config values of a new model, e.g. 'n_embd=10,resid_pdrop=0.2' (typed like the "
                          "config's own values)."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Hub id or local directory of a tokenizer. Default: train a byte-level BPE on the training split."},
    )
    tokenizer_vocab_size: int = field(
        default=8192, metadata={"help": "Vocabulary size of the BPE trained when --tokenizer_name is not given."}
    )


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset, e.g. roneneldan/TinyStories or wikitext (needs network)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. wikitext-103-raw-v1."})
    train_file: str | None = field(default=None, metadata={"help": "Local training text (.txt/.raw/.tokens/.json/.jsonl)."})
    validation_file: str | None = field(default=None, metadata={"help": "Local validation text, same format."})
    text_column: str | None = field(default=None, metadata={"help": "Text column of json data (default: 'text')."})
    validation_split_percentage: float = field(
        default=5, metadata={"help": "Without a validation set: the first N %% of the training rows become one."}
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training sequence (packed). Default: min(1024, context); must be <= context."},
    )
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks of .txt files."})
    append_eos: bool = field(
        default=False,
        metadata={"help": "Append the end-of-text token to every row before packing (one document per row, e.g. "
                  "roneneldan/TinyStories on the hub); line-based .txt files keep their line breaks instead."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate training blocks (debugging)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate evaluation blocks."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized/packed datasets."})
    synthetic_train_examples: int = field(default=20000, metadata={"help": "Synthetic run: training sequences."})
    synthetic_eval_examples: int = field(default=512, metadata={"help": "Synthetic run: evaluation sequences."})
    mqar_pairs: int = field(default=8, metadata={"help": "Synthetic run: key-value pairs per sequence."})
    mqar_queries: int = field(default=8, metadata={"help": "Synthetic run: queries per sequence."})
    mqar_keys: int = field(default=32, metadata={"help": "Synthetic run: key vocabulary size."})
    mqar_values: int = field(default=32, metadata={"help": "Synthetic run: value vocabulary size."})
    blimp_dir: str | None = field(
        default=None,
        metadata={"help": "At the end of the run, zero-shot BLiMP accuracy on this folder of BLiMP *.jsonl files "
                  "(e.g. ../shared/data/blimp): overall, per field and per paradigm, written to eval_results.json and "
                  "the model card (hf_condinit.zero_shot)."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "Stream the data: read, tokenize and pack on the fly (no Arrow cache of the corpus), the "
                  "same blocks in the same order as without it; needs --max_steps (docs/pretraining.md, "
                  "\"Streaming\")."},
    )
    blimp_prefix: str = field(
        default="eos",
        metadata={"help": "Token put before every BLiMP sentence (none: the first token is not scored).",
                  "choices": ["eos", "bos", "none"]},
    )

    @property
    def synthetic(self) -> bool:
        return self.dataset_name is None and self.train_file is None and self.validation_file is None


def parse(argv=None):
    """Parse, with the §7 LM defaults (plus the embedded run's without data flags), a default ``--output_dir`` per
    arm, and both ``--do_train`` and ``--do_eval`` when neither is given (``parse_and_set_up``). Returns
    ``((model_args, data_args, cond_args, training_args), attention_given)``; raises ``UsageError`` for a bad flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    single_process_launch_env(argv)
    synthetic = not flags_given(argv, DATA_FLAGS)
    defaults = {**LM_TRAINING_DEFAULTS, **(DEMO_DEFAULTS if synthetic else {})}
    parsed, attention_given = parse_and_set_up(
        (ModelArguments, DataTrainingArguments, CondInitArguments, TrainingArguments), argv, logger,
        output_prefix="clm-synthetic" if synthetic else "clm", defaults=defaults,
    )  # fmt: skip
    return parsed, attention_given


def build_tokenizer(model_args, data_args, training_args, raw, text_column, context: int, spec: MQARSpec | None):
    if spec is not None:
        return mqar_tokenizer(spec, model_max_length=context)
    if model_args.tokenizer_name or model_args.model_name_or_path:
        return AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                             **model_args.tokenizer_kwargs())
    # Train on the training split only. Global rank 0 trains first and saves; the other ranks load its result when
    # the output dir is shared, or train the same tokenizer themselves (BPE training is deterministic).
    tok_dir = os.path.join(training_args.output_dir, "bpe_tokenizer")
    with training_args.main_process_first(local=False, desc="training the BPE tokenizer"):
        if training_args.process_index != 0 and os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
            tok = AutoTokenizer.from_pretrained(tok_dir)
        else:
            logger.info(f"Training a byte-level BPE (vocab {model_args.tokenizer_vocab_size}) on the training split")
            tok = train_bpe_tokenizer(
                batch_iterator(raw["train"], text_column),
                vocab_size=model_args.tokenizer_vocab_size,
                model_max_length=context,
                length=None if data_args.streaming else len(raw["train"]),
            )
            if training_args.process_index == 0:
                tok.save_pretrained(tok_dir)
    return tok


def prepare_data(model_args, data_args, training_args, spec: MQARSpec | None, context: int | None, block_size: int):
    """Load, tokenize and pack the data (the synthetic corpus when ``spec`` is given); the tokenizer is trained on
    the training split unless one is given. Returns ``(tokenizer, lm_datasets)``."""
    text_column = "text"
    synthetic = spec is not None
    if synthetic:
        logger.info(f"No data flags: using the embedded synthetic corpus (MQAR {spec.to_dict()}, {spec.seq_len} tokens/seq)")
        raw = make_mqar_datasets(data_args.synthetic_train_examples, data_args.synthetic_eval_examples, spec, seed=training_args.seed)
    else:
        with training_args.main_process_first(desc="loading the data"):
            raw, text_column = load_raw_datasets(
                dataset_name=data_args.dataset_name,
                dataset_config_name=data_args.dataset_config_name,
                train_file=data_args.train_file,
                validation_file=data_args.validation_file,
                validation_split_percentage=data_args.validation_split_percentage,
                text_column=data_args.text_column,
                keep_linebreaks=data_args.keep_linebreaks,
                cache_dir=model_args.cache_dir,
                token=model_args.token,
                streaming=data_args.streaming,
            )
    tokenizer = build_tokenizer(model_args, data_args, training_args, raw, text_column, context or block_size, spec)
    raw = split_by_rank(raw, training_args.process_index, training_args.world_size)  # --streaming: this rank's rows
    tokenized = tokenize_datasets(
        raw,
        tokenizer,
        text_column,
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=not data_args.overwrite_cache,
        append_eos=data_args.append_eos and not synthetic,
        main_process_first=lambda: training_args.main_process_first(desc="tokenizing"),
    )
    if synthetic:
        lengths = set(len(x) for x in tokenized["train"][:100]["input_ids"])
        if lengths != {spec.seq_len}:  # the word-level tokenizer gives exactly one token per word
            raise RuntimeError(f"synthetic sequences tokenized to lengths {lengths}, expected {spec.seq_len}")
        lm = tokenized.map(lambda ex: {"labels": ex["input_ids"]}, batched=True)
    else:
        lm = pack_datasets(
            tokenized,
            block_size,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            main_process_first=lambda: training_args.main_process_first(desc="packing"),
            sources=split_sources(data_args.train_file, data_args.validation_file, data_args.dataset_name,
                                  data_args.validation_split_percentage),
        )
    return tokenizer, lm


def build_model(model_args, config, tokenizer, condinit: dict | None, attention: str | None):
    """The model: loaded from ``--model_name_or_path`` (never re-initialised; its saved attention unless
    ``attention`` names one), or built from ``config`` with the condinit recipe (``None``: as transformers builds it)
    and a vocabulary sized to ``tokenizer``; ``attention`` ``None``: transformers' choice."""
    if model_args.model_name_or_path:
        kwargs = model_args.hub_kwargs()
        if model_args.torch_dtype:
            kwargs["dtype"] = model_args.torch_dtype if model_args.torch_dtype == "auto" else getattr(torch, model_args.torch_dtype)
        if attention is not None:
            kwargs["attn_implementation"] = attention
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    else:
        config.vocab_size = len(tokenizer)
        for name in ("bos_token_id", "eos_token_id"):
            setattr(config, name, tokenizer.eos_token_id)
        if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
            config.pad_token_id = None
        recipe = {} if condinit is None else {"condinit": condinit}  # None: transformers' own from_config call
        model = AutoModelForCausalLM.from_config(config, **recipe, attn_implementation=attention,
                                                 trust_remote_code=model_args.trust_remote_code)
    return with_causal_loss_type(model)


def load_model_config(model_args, synthetic: bool):
    """``(config, where)`` of the model: the loaded model's (``--model_name_or_path``), ``--model_type``'s default
    config or ``--model_config``'s, with ``--config_overrides`` for a new one."""
    if model_args.model_name_or_path:
        for flag, value in (("--model_config / --config_name", model_args.model_config),
                            ("--model_type", model_args.model_type), ("--config_overrides", model_args.config_overrides)):
            if value:
                raise UsageError(f"{flag} describes a new model; a loaded one (--model_name_or_path) keeps its own.")
        try:
            config = AutoConfig.from_pretrained(model_args.model_name_or_path, **model_args.hub_kwargs())
        except (OSError, ValueError) as err:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path!r} is not a saved model directory "
                             f"or a reachable hub id ({str(err).splitlines()[0]})") from None
        return config, model_args.model_name_or_path
    if model_args.torch_dtype:
        raise UsageError("--torch_dtype is for loading a model (--model_name_or_path); a new model is built in float32 "
                         "(use --bf16 / --fp16 for mixed precision).")
    if model_args.model_type:
        if model_args.model_config:
            raise UsageError("--model_type and --model_config (--config_name) both describe the new model; pass one.")
        return (config_for_model_type(model_args.model_type, AutoModelForCausalLM, model_args.config_overrides),
                f"--model_type {model_args.model_type}")
    return resolve_model_config(model_args.model_config or ("gpt2-tiny" if synthetic else "gpt2-small-cpu"),
                                CONFIG_DIR, model_args.config_overrides, model_args.cache_dir, model_args.token)


def check_streaming_flags(training_args, synthetic: bool) -> None:
    """``--streaming`` reads text data and needs ``--max_steps`` (a stream has no length to count epochs in)."""
    if synthetic:
        raise UsageError("--streaming reads --train_file or --dataset_name; the synthetic corpus is generated in memory.")
    if training_args.do_train and training_args.max_steps <= 0:
        raise UsageError("--streaming needs --max_steps N: a stream has no length to count epochs in.")


def main(argv=None):
    (model_args, data_args, cond_args, training_args), attention_given = parse(argv)
    loaded = model_args.model_name_or_path

    # ---- every check that can fail, before any data or model work -------------------------------------------
    with user_errors():
        synthetic = data_args.synthetic
        check_loaded_model_flags(cond_args, argv, loaded)
        if loaded and synthetic:
            raise UsageError("--model_name_or_path continues a model on new data: pass --train_file or --dataset_name.")
        condinit = None if loaded else cond_args.condinit_dict(seed=training_args.seed)
        config, config_path = load_model_config(model_args, synthetic)
        if not loaded and not recipe_applies(cond_args, config):
            condinit = None  # no attention layout, no plugin flag: built and trained as transformers does
        if attention_given or not loaded:
            check_attention_usable(cond_args.attention, model_class(AutoModelForCausalLM, config, loaded,
                                                                    model_args.hub_kwargs()),
                                   config, training_args.use_cpu)
        context = context_length(config)
        spec = None
        if synthetic:
            spec = MQARSpec(data_args.mqar_pairs, data_args.mqar_queries, data_args.mqar_keys, data_args.mqar_values)
            if data_args.block_size is not None and data_args.block_size != spec.seq_len:
                raise ValueError(
                    f"--block_size {data_args.block_size}: the synthetic corpus has fixed sequences of {spec.seq_len} "
                    f"tokens (2*mqar_pairs + 2*mqar_queries + 2); omit --block_size or change the mqar flags"
                )
            block_size = spec.seq_len
            if model_args.tokenizer_name:
                raise ValueError("--tokenizer_name cannot be used with the synthetic corpus (it has its own vocabulary)")
        else:
            block_size = data_args.block_size or min(1024, context or 1024)
        if context is not None and block_size > context:
            raise ValueError(
                f"block size {block_size} is larger than the model's context ({context} positions in {config_path}); "
                f"pass --block_size <= {context} or --config_overrides n_positions={block_size}"
            )
        if data_args.train_file:
            check_data_file(data_args.train_file, "train_file")
        if data_args.validation_file:
            check_data_file(data_args.validation_file, "validation_file")
        if data_args.validation_file and not data_args.train_file:
            raise ValueError("--validation_file needs --train_file")
        if data_args.dataset_name and data_args.train_file:
            raise ValueError("pass either --dataset_name or --train_file, not both")
        if data_args.streaming:
            check_streaming_flags(training_args, synthetic)
        check_speed_levers(model_args, training_args, config)
        resume = find_last_checkpoint(training_args, logger)
        blimp_pairs = None
        if data_args.blimp_dir:
            if synthetic:
                raise UsageError("--blimp_dir scores English sentences: train on text (--train_file or --dataset_name).")
            blimp_pairs = load_minimal_pairs(data_args.blimp_dir)

    logger.info(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
        f"distributed: {training_args.parallel_mode.value}, bf16: {training_args.bf16}"
    )
    maybe_init_distributed(training_args)
    set_seed(training_args.seed)

    # ---- data: a bad file is a user error, and a failed start leaves no new --output_dir behind ------------------
    with user_errors(training_args.output_dir):
        claim_output_dir(training_args)
        tokenizer, lm = prepare_data(model_args, data_args, training_args, spec, context, block_size)
        train_dataset, eval_dataset = select_splits(lm, training_args, data_args.max_train_samples,
                                                    data_args.max_eval_samples, data_args.streaming,
                                                    model_args.cache_dir)
    if loaded and len(tokenizer) > config.vocab_size:
        raise UsageError(f"the tokenizer has {len(tokenizer)} tokens but the model {loaded} only {config.vocab_size}; "
                         f"pass the model's own tokenizer (omit --tokenizer_name).")
    check_resume_vocabulary(model_args, resume, len(tokenizer), config.vocab_size if loaded else None)
    model = build_model(model_args, config, tokenizer, condinit, cond_args.attn_implementation)
    apply_speed_levers(model, model_args, len(tokenizer))
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    arm = f"loaded from {loaded}" if loaded else (f"init={condinit['method']} seed={condinit['seed']}" if condinit
                                                  else "the model's own init (no attention layout: no recipe)")
    logger.info(
        f"Model {config_path}: {n_params / 1e6:.2f}M parameters, {arm}, attention={model.config._attn_implementation}, "
        f"block_size={block_size}, vocab={model.config.vocab_size}"
    )

    compute_metrics = preprocess = None
    if synthetic:

        def preprocess(logits, labels):
            return logits.argmax(dim=-1)

        def compute_metrics(pred):
            return {"recall_accuracy": mqar_recall_accuracy(pred.predictions, pred.label_ids, spec)}

    trainer = CondInitTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess,
    )
    make_throughput_callback(cond_args, trainer)
    make_periodic_checkpoint_callback(cond_args, trainer)
    if cond_args.log_condition_number_every:
        source = eval_dataset if eval_dataset is not None else train_dataset
        if data_args.streaming and eval_dataset is None:
            source = materialize(train_dataset, cond_args.condition_number_probe_size, model_args.cache_dir)
        cond_args.condition_number_probe_length = min(cond_args.condition_number_probe_length, block_size)
        make_condition_number_callback(cond_args, source, trainer)

    # ---- train / eval -------------------------------------------------------------------------------------------
    results = {}
    if training_args.do_train:
        results.update(train_and_save(trainer, train_dataset, resume, block_size))
    if training_args.do_eval:
        results.update(evaluate_with_perplexity(trainer, eval_dataset))
    if blimp_pairs is not None:
        results.update(record_blimp(trainer, tokenizer, blimp_pairs, prefix=data_args.blimp_prefix))
    if trainer.is_world_process_zero():
        summary = {k: results[k] for k in ("eval_loss", "perplexity", "eval_recall_accuracy", "train_loss",
                                            "train_runtime", "train_tokens_per_second", "blimp_accuracy")
                   if k in results}
        arm = f"from {loaded}" if loaded else cond_args.init
        print(f"run_clm result ({arm}, {model.config._attn_implementation}) -> {training_args.output_dir}: "
              + json.dumps(summary))
    return results


if __name__ == "__main__":
    run_main(main)
