"""The speed levers of ``run_clm.py`` that HF's ``TrainingArguments`` lacks: a padded vocabulary and the
chunked LM-head cross-entropy (:mod:`hf_condinit.lm_head`), as the fields of :class:`SpeedLeverArguments` (a
script's ``ModelArguments`` inherits them), checked before any work (:func:`check_speed_levers`) and applied to the
built model (:func:`apply_speed_levers`); a resume whose checkpoint holds another vocabulary size than the run would
build is refused before the model is (:func:`check_resume_vocabulary`).

The other levers are HF's own flags and need nothing here: ``--torch_compile`` (whole model; with
``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1`` per block), ``--optim adamw_torch_fused`` and ``--tf32`` (CUDA only;
transformers sets ``torch.backends.fp32_precision = "tf32"`` on torch >= 2.9). docs/pretraining.md, "Speed levers"."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import UsageError

LM_HEAD_CE_CHOICES = ("default", "chunked")


@dataclass
class SpeedLeverArguments:
    pad_vocab_to_multiple_of: int | None = field(
        default=None,
        metadata={"help": "Pad the embedding / LM head to a multiple of N rows (64: 50257 -> 50304) after the model is "
                          "built or loaded; the padded logits are -inf (never predicted, no loss, no gradient) and "
                          "generation_config suppresses the padded ids. config.vocab_size becomes the padded size, "
                          "the saved tokenizer keeps its own."},
    )
    lm_head_ce: str = field(
        default="default",
        metadata={"help": "Training loss of the LM head: default (the model's own: full logits, upcast to fp32) or "
                          "chunked (cross-entropy from the last hidden states, 1024 tokens at a time, gradients in the "
                          "same pass: no (batch, seq, vocab) logits). Evaluation always uses the model's own forward.",
                  "choices": list(LM_HEAD_CE_CHOICES)},
    )


def check_speed_levers(lever_args: SpeedLeverArguments, training_args, config) -> None:
    """Raise :class:`UsageError` for a lever the run cannot take: the chunked loss for a model of ``config`` whose
    logits are transformed after the head, or under FSDP1 (untested; the loss reads the head's weight outside the
    head's own forward). Under ZeRO-3 the head's parameters are registered as the model's external parameters
    (:mod:`hf_condinit.lm_head`); FSDP2's root unshards the embeddings and head it owns for the root's forward."""
    if lever_args.lm_head_ce != "chunked":
        return
    from ..lm_head import chunked_loss_refusal
    from .launch import fsdp_version

    refusal = chunked_loss_refusal(config)
    if refusal:
        raise UsageError(f"--lm_head_ce chunked needs logits = lm_head(last hidden state): {refusal}; "
                         "use --lm_head_ce default.")

    if fsdp_version(training_args) == 1:
        raise UsageError("--lm_head_ce chunked is tested under FSDP2 only; set \"fsdp_version\": 2 in the "
                         "--fsdp_config (fsdp_configs/), or use --lm_head_ce default.")


def apply_speed_levers(model, lever_args: SpeedLeverArguments, tokenizer_size: int):
    """Pad ``model``'s vocabulary (``--pad_vocab_to_multiple_of``) to a multiple above ``tokenizer_size`` and install
    the chunked loss (``--lm_head_ce chunked``; with the padded logits masked in it too). Returns ``model``."""
    from ..lm_head import pad_vocabulary, use_chunked_lm_head_loss

    real_vocab = None
    if lever_args.pad_vocab_to_multiple_of:
        pad_vocabulary(model, tokenizer_size, lever_args.pad_vocab_to_multiple_of)
        real_vocab = tokenizer_size
    if lever_args.lm_head_ce == "chunked":
        use_chunked_lm_head_loss(model, real_vocab=real_vocab)
    return model


def check_resume_vocabulary(lever_args: SpeedLeverArguments, checkpoint: str | None, tokenizer_size: int,
                            loaded_vocab: int | None = None) -> None:
    """Raise :class:`UsageError` when ``checkpoint`` (the one the run resumes from; None: a fresh run) holds a model
    whose ``config.json`` ``vocab_size`` differs from the model this run builds: ``tokenizer_size`` rows, or
    ``loaded_vocab`` for a loaded model (``--model_name_or_path``) without ``--pad_vocab_to_multiple_of``, rounded
    up to that multiple when given (as :func:`apply_speed_levers` pads). Unchecked, a run trained with the flag and
    resumed without it (or with a multiple that rounds elsewhere) dies in the Trainer's checkpoint load with a shape
    mismatch. A checkpoint without a top-level ``vocab_size`` is not checked."""
    if checkpoint is None:
        return
    try:
        with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
            saved = json.load(f).get("vocab_size")
    except (OSError, ValueError):
        return  # a damaged checkpoint is find_last_checkpoint's to refuse
    multiple = lever_args.pad_vocab_to_multiple_of
    real = tokenizer_size if multiple or loaded_vocab is None else loaded_vocab
    size = -(-real // multiple) * multiple if multiple else real
    if saved is None or saved == size:
        return
    built = f"{real} rows padded to a multiple of {multiple}" if multiple else f"{real} rows, unpadded"
    trained = ""  # a checkpoint smaller than the tokenizer was trained with another one
    if saved >= tokenizer_size:
        trained = f" (trained {'with' if saved > tokenizer_size else 'without'} --pad_vocab_to_multiple_of)"
    raise UsageError(f"cannot resume from {checkpoint}: its model has a vocabulary of {saved} rows{trained}, this "
                     f"run's would have {size} ({built}); resume with the --pad_vocab_to_multiple_of it was trained "
                     "with, or pass a new --output_dir to start over.")
