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

    # the papers' sizes, DeepSpeed ZeRO (see docs/pretraining.md)
    deepspeed --num_gpus 8 run_clm.py --deepspeed ds_configs/zero2.json --model_config gpt2-472m --bf16 \\
        --init conditioned --dataset_name roneneldan/TinyStories --tokenizer_name gpt2 --block_size 1024 ...

Defaults: unless given on the command line (or in the ``.json`` argument file), the LM settings of METHODS.md §7
apply (AdamW β=(0.9, 0.95), weight decay 0.1 with biases/norms/``condinit_`` holders exempt, cosine decay, 5 %
warmup, gradient clipping 1.0, lr 3e-4); see ``hf_condinit.scripts_common``. With neither ``--do_train`` nor
``--do_eval``, both run. Results: ``<output_dir>/eval_results.json`` (``eval_loss``, ``perplexity`` = exp(eval loss),
and ``recall_accuracy`` on the synthetic task), ``train_results.json``, ``all_results.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field

from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

import hf_condinit  # noqa: F401  (installs the hooks, registers the attention variants)
from hf_condinit.data import (
    MQARSpec,
    batch_iterator,
    check_data_file,
    load_raw_datasets,
    make_mqar_datasets,
    mqar_recall_accuracy,
    mqar_tokenizer,
    pack_datasets,
    tokenize_datasets,
    train_bpe_tokenizer,
)
from hf_condinit.scripts_common import (
    LM_TRAINING_DEFAULTS,
    CondInitArguments,
    CondInitTrainer,
    evaluate_with_perplexity,
    flags_given,
    log_deepspeed,
    make_condition_number_callback,
    make_throughput_callback,
    parse_args_with_defaults,
    parse_config_overrides,
    select_splits,
    setup_logging,
    train_and_save,
    validate_deepspeed_config,
)

logger = logging.getLogger("run_clm")

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(HERE, "configs")

# Extra defaults of the embedded synthetic run (only when no data flag is given, and only for flags not given).
DEMO_DEFAULTS = {
    "output_dir": "runs/clm-default",
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


@dataclass
class ModelArguments:
    model_config: str | None = field(
        default=None,
        metadata={
            "help": "Model shape: a name in configs/ (gpt2-tiny, gpt2-small-cpu, gpt2-472m, gpt2-1.72b), a path to a "
            "config.json or a directory holding one, or a hub id. Default: gpt2-tiny for the synthetic run, "
            "gpt2-small-cpu with data. The model is always trained from scratch."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Override config values, e.g. 'n_embd=10,resid_pdrop=0.2' (typed like the config's own values)."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Hub id or local directory of a tokenizer. Default: train a byte-level BPE on the training split."},
    )
    tokenizer_vocab_size: int = field(
        default=8192, metadata={"help": "Vocabulary size of the BPE trained when --tokenizer_name is not given."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache directory for hub downloads and datasets."})
    token: str | None = field(default=None, metadata={"help": "Hub token, for private hub data/configs."})


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

    @property
    def synthetic(self) -> bool:
        return self.dataset_name is None and self.train_file is None and self.validation_file is None


def resolve_model_config(name: str, model_args: ModelArguments):
    """A name in configs/ (with or without .json), a file/dir path, or a hub id."""
    candidates = [name]
    if not os.path.isabs(name):
        candidates += [os.path.join(CONFIG_DIR, name), os.path.join(CONFIG_DIR, name + ".json")]
    for path in candidates:
        if os.path.isfile(path) or (os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))):
            return AutoConfig.from_pretrained(path), path
    local = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".json")) if os.path.isdir(CONFIG_DIR) else []
    try:
        return AutoConfig.from_pretrained(name, cache_dir=model_args.cache_dir, token=model_args.token), name
    except (OSError, ValueError) as err:
        raise ValueError(
            f"--model_config {name!r} is not a config in {CONFIG_DIR} ({', '.join(local)}), not a local path, and could "
            f"not be loaded from the hub ({type(err).__name__}: {str(err).splitlines()[0]})"
        ) from err


def context_length(config) -> int | None:
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    return None


def parse(argv=None):
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, CondInitArguments, TrainingArguments))
    argv = sys.argv[1:] if argv is None else list(argv)
    single_process_launch_env(argv)
    defaults = dict(LM_TRAINING_DEFAULTS)
    if not flags_given(argv, DATA_FLAGS):
        defaults.update(DEMO_DEFAULTS)
    else:
        defaults["output_dir"] = "runs/clm"
    model_args, data_args, cond_args, training_args = parse_args_with_defaults(parser, argv, defaults)
    if not training_args.do_train and not training_args.do_eval:
        training_args.do_train = training_args.do_eval = True
    return model_args, data_args, cond_args, training_args


def single_process_launch_env(argv) -> None:
    """``python run_clm.py --deepspeed ...`` without a launcher: give DeepSpeed the env a 1-process launcher would
    (otherwise ``zero.Init`` falls back to MPI discovery). Must run before ``TrainingArguments`` is built."""
    if "WORLD_SIZE" in os.environ or "RANK" in os.environ or not flags_given(argv, ("deepspeed",)):
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def maybe_init_distributed(training_args):
    """ZeRO-3 builds the model inside ``deepspeed.zero.Init``, which needs DeepSpeed's comm layer first; on CPU
    (``--use_cpu``) that must be gloo."""
    if not training_args.deepspeed:
        return
    import deepspeed
    import deepspeed.comm as ds_comm

    # accelerate has already set up torch.distributed (for world size > 1); DeepSpeed's own comm layer (which
    # zero.Init asks for the world size) is separate and must be initialised too, over the same backend.
    if not ds_comm.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if training_args.use_cpu else None)


def build_tokenizer(model_args, data_args, training_args, raw, text_column, context: int, spec: MQARSpec | None):
    if spec is not None:
        return mqar_tokenizer(spec, model_max_length=context)
    if model_args.tokenizer_name:
        return AutoTokenizer.from_pretrained(
            model_args.tokenizer_name, cache_dir=model_args.cache_dir, token=model_args.token
        )
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
                length=len(raw["train"]),
            )
            if training_args.process_index == 0:
                tok.save_pretrained(tok_dir)
    return tok


def main(argv=None):
    model_args, data_args, cond_args, training_args = parse(argv)
    setup_logging(training_args, logger)

    # ---- every check that can fail, before any data or model work -------------------------------------------
    condinit = cond_args.condinit_dict(seed=training_args.seed)
    validate_deepspeed_config(training_args, cond_args)
    synthetic = data_args.synthetic
    config_name = model_args.model_config or ("gpt2-tiny" if synthetic else "gpt2-small-cpu")
    config, config_path = resolve_model_config(config_name, model_args)
    if model_args.config_overrides:
        logger.info(f"Overriding config: {model_args.config_overrides}")
        config.update(parse_config_overrides(model_args.config_overrides, config))
    context = context_length(config)
    spec = None
    if synthetic:
        spec = MQARSpec(data_args.mqar_pairs, data_args.mqar_queries, data_args.mqar_keys, data_args.mqar_values)
        if data_args.block_size is not None and data_args.block_size != spec.seq_len:
            raise ValueError(
                f"--block_size {data_args.block_size}: the synthetic corpus has fixed sequences of {spec.seq_len} tokens "
                f"(2*mqar_pairs + 2*mqar_queries + 2); omit --block_size or change the mqar flags"
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
    resume = training_args.resume_from_checkpoint
    if resume in ("last", "latest", "True", "true"):
        resume = get_last_checkpoint(training_args.output_dir)
        if resume is None:
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint}: no checkpoint in {training_args.output_dir}")
    elif resume is not None and not os.path.isdir(resume):
        raise ValueError(f"--resume_from_checkpoint {resume!r} is not a directory")

    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
        f"distributed: {training_args.parallel_mode.value}, bf16: {training_args.bf16}"
    )
    logger.info(f"Training/evaluation parameters {training_args}")
    maybe_init_distributed(training_args)
    set_seed(training_args.seed)

    # ---- data -------------------------------------------------------------------------------------------------
    text_column = "text"
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
            )
    tokenizer = build_tokenizer(model_args, data_args, training_args, raw, text_column, context or block_size, spec)
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
        )
    train_dataset, eval_dataset = select_splits(lm, training_args, data_args.max_train_samples, data_args.max_eval_samples)

    # ---- model: from scratch, with the condinit recipe ---------------------------------------------------------
    config.vocab_size = len(tokenizer)
    for name in ("bos_token_id", "eos_token_id"):
        setattr(config, name, tokenizer.eos_token_id)
    if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
        config.pad_token_id = None
    model = AutoModelForCausalLM.from_config(config, condinit=condinit, attn_implementation=cond_args.attention)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    logger.info(
        f"Model {config_path}: {n_params / 1e6:.2f}M parameters, init={condinit['method']} seed={condinit['seed']}, "
        f"attention={cond_args.attention}, block_size={block_size}, vocab={config.vocab_size}"
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
    log_deepspeed(trainer, training_args, logger)
    make_throughput_callback(cond_args, trainer)
    if cond_args.log_condition_number_every:
        source = eval_dataset if eval_dataset is not None else train_dataset
        cond_args.condition_number_probe_length = min(cond_args.condition_number_probe_length, block_size)
        make_condition_number_callback(cond_args, source, trainer)

    # ---- train / eval -------------------------------------------------------------------------------------------
    results = {}
    if training_args.do_train:
        results.update(train_and_save(trainer, train_dataset, resume, block_size))
    if training_args.do_eval:
        results.update(evaluate_with_perplexity(trainer, eval_dataset))
    if trainer.is_world_process_zero():
        summary = {k: results[k] for k in ("eval_loss", "perplexity", "eval_recall_accuracy", "train_loss",
                                            "train_runtime", "train_tokens_per_second") if k in results}
        print(f"run_clm result ({condinit['method']}, {cond_args.attention}) -> {training_args.output_dir}: "
              + json.dumps(summary))
    return results


if __name__ == "__main__":
    main()
