"""Two speed levers of a causal LM's head, pure torch, for ``*ForCausalLM`` models whose logits are
``lm_head(base_model(...).last_hidden_state)`` (GPT-2, Llama, GPT-NeoX, ...; not families that scale or soft-cap the
logits after the head, which :func:`use_chunked_lm_head_loss` refuses).

**Padded vocabulary** (:func:`pad_vocabulary`): the input embedding and LM head get rows up to a multiple of ``N``
(``N = 64``: 50,257 → 50,304, nanoGPT's lever: the head's matmuls get tensor-core-friendly shapes) through HF's own
``resize_token_embeddings(..., pad_to_multiple_of=N, mean_resizing=False)``, after the model is built, so the real
rows keep the weights they were built (or loaded) with. Conventions:

- the padded ids ``real_vocab .. V_pad - 1`` are never a prediction: a forward hook on the output embedding sets their
  logits to ``-inf`` in every forward (training loss, evaluation, scoring, generation), so they take no probability
  mass, add nothing to the loss and receive no gradient through it (unlike nanoGPT, which trains them as unused
  tokens); the loss equals the unpadded model's at equal real rows;
- ``config.vocab_size`` is the number of rows (``V_pad``), as HF's ``resize_token_embeddings`` sets it and as padded
  checkpoints on the hub report it (Pythia 50,432, Phi-2 51,200); the tokenizer saved beside the model keeps the real
  size (``len(tokenizer)``);
- ``generation_config.suppress_tokens`` lists the padded ids, so ``generate`` never produces one, also when the
  checkpoint is loaded by plain transformers without this package (the ``-inf`` hook is not saved; such a load computes
  the padded logits from the padded rows, which no gradient reached).

**Chunked LM-head cross-entropy** (:func:`chunked_lm_head_loss`, :func:`use_chunked_lm_head_loss`): the causal-LM loss
from the final hidden states ``(B, T, D)`` and the head's weight ``(V, D)`` without the ``(B, T, V)`` logits: tokens go
through the head ``chunk_tokens`` at a time; each chunk's fp32 logits give its loss and, in the same pass, its
gradients (softmax − one-hot) for the hidden states and the weight (Liger-Kernel's fused-linear-cross-entropy
scheme, in torch); the backward only scales the stored gradients. Peak memory: one ``(chunk_tokens, V)`` fp32 block
instead of the bf16 logits, their fp32 copy and both gradients. Same reduction as transformers' ``ForCausalLMLoss``
(labels shifted inside, ``-100`` ignored, sum / ``num_items_in_batch`` when given, else the mean over counted targets).
The head's weight is read outside the head's own forward: under DeepSpeed ZeRO-3 it is registered as an external
parameter of the model (gathered for the model's forward and backward); FSDP2's root owns and unshards it.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "IGNORE_INDEX",
    "chunked_lm_head_loss",
    "chunked_loss_refusal",
    "pad_vocabulary",
    "use_chunked_lm_head_loss",
]

IGNORE_INDEX = -100
#: Tokens per head chunk: a (1024, 50,304) fp32 block is 206 MB, against 3.3 GB of fp32 logits for 16 × 1024 tokens.
DEFAULT_CHUNK_TOKENS = 1024
#: Config fields of families whose logits are not ``lm_head(last_hidden_state)`` (Gemma 2/3, Cohere, Granite).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# ----------------------------------------------------------------------------------------------- padded vocabulary


class _MaskPaddedLogits:
    """Forward hook of the output embedding: ``logits[..., real_vocab:] = -inf`` in place (only the padded columns
    are written; the head's matmul does not need its output for its backward)."""

    def __init__(self, real_vocab: int):
        self.real_vocab = real_vocab

    def __call__(self, module, args, logits):
        logits[..., self.real_vocab:] = float("-inf")


def pad_vocabulary(model: nn.Module, real_vocab: int, multiple: int) -> int:
    """Resize ``model``'s embedding (and untied LM head) to ``real_vocab`` rounded up to a multiple of ``multiple``,
    mask the padded logits to ``-inf`` and suppress the padded ids in generation (module docstring). ``real_vocab``:
    the tokenizer's size; rows beyond it in a loaded model become padding too. Returns the padded size."""
    model.resize_token_embeddings(real_vocab, pad_to_multiple_of=multiple, mean_resizing=False)
    padded = model.get_input_embeddings().weight.shape[0]
    head = model.get_output_embeddings()
    for key, hook in list(head._forward_hooks.items()):  # idempotent: one mask, for this real_vocab
        if isinstance(hook, _MaskPaddedLogits):
            del head._forward_hooks[key]
    if padded > real_vocab:
        head.register_forward_hook(_MaskPaddedLogits(real_vocab))
    kept = {t for t in model.generation_config.suppress_tokens or () if t < real_vocab}  # a model's own, if any
    model.generation_config.suppress_tokens = sorted(kept | set(range(real_vocab, padded))) or None
    return padded


# ------------------------------------------------------------------------------------------- chunked cross-entropy


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum_i CE(hidden_i @ weight.T + bias, target_i) / normaliser`` over the rows of ``hidden (N, D)`` with
    ``target != IGNORE_INDEX``; gradients computed during the forward, chunk by chunk (module docstring). Under
    autocast the head's matmuls run in the autocast dtype, as ``lm_head`` would; logits are upcast to fp32 per chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, normaliser, real_vocab: int | None, chunk: int, grads: bool):
        n = hidden.shape[0]
        valid = targets != IGNORE_INDEX
        safe = torch.where(valid, targets, 0)
        loss = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if grads else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if grads else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if grads and bias is not None else None
        scale = torch.where(valid, 1.0 / normaliser, 0.0).float()  # d loss / d (per-token CE)
        for start in range(0, n, chunk):
            rows = slice(start, min(start + chunk, n))
            h, t = hidden[rows], safe[rows]
            low = F.linear(h, weight, bias)  # (c, V) in the head's compute dtype
            z = low.float()
            if real_vocab is not None:
                z[:, real_vocab:] = float("-inf")
            lse = torch.logsumexp(z, dim=-1)
            loss = loss + ((lse - z.gather(1, t[:, None]).squeeze(1)) * scale[rows]).sum()
            if not grads:
                continue
            dz = z.sub_(lse[:, None]).exp_()  # softmax, in place
            dz.scatter_add_(1, t[:, None], torch.full_like(lse[:, None], -1.0))
            dz = dz.mul_(scale[rows, None]).to(low.dtype)
            grad_hidden[rows] = dz @ weight  # autocast casts the weight as it did for F.linear
            grad_weight += dz.T @ h
            if grad_bias is not None:
                grad_bias += dz.float().sum(0)
        if grads:
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
            ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype)
        grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        if grad_bias is not None:
            grad_bias = (grad_bias * grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def chunked_lm_head_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor | None,
                         bias: torch.Tensor | None = None, *, num_items_in_batch=None,
                         shift_labels: torch.Tensor | None = None, real_vocab: int | None = None,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss(lm_head(hidden), labels, ...)`` without the logits.

    ``hidden``: ``(B, T, D)`` final hidden states; ``weight`` ``(V, D)`` / ``bias`` ``(V,)``: the head's; ``labels``
    ``(B, T)`` unshifted (``labels = input_ids``; position ``i`` predicts ``labels[i + 1]``) or ``shift_labels``
    already shifted; ``-100`` ignored. ``num_items_in_batch``: the Trainer's target count (sum / it), else the mean over
    counted targets. ``real_vocab``: logits from this column on are ``-inf`` (a padded vocabulary). Returns the fp32
    scalar loss; its backward gives the gradients of ``hidden``, ``weight`` and ``bias``."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    targets = shift_labels.reshape(-1).to(hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if num_items_in_batch is None:
        normaliser = (targets != IGNORE_INDEX).sum()
    else:
        normaliser = torch.as_tensor(num_items_in_batch, device=hidden.device)
    grads = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (hidden, weight, bias))
    return _ChunkedLinearCrossEntropy.apply(flat, weight, bias, targets, normaliser, real_vocab, chunk_tokens, grads)


def chunked_loss_refusal(config) -> str | None:
    """Why a model of ``config`` cannot take :func:`use_chunked_lm_head_loss` (its logits are transformed after the
    head), or None; checked from the config alone, before a model is built."""
    transforms = [name for name in _LOGIT_TRANSFORMS if getattr(config, name, None) not in (None, 1, 1.0)]
    return f"its config sets {', '.join(transforms)}" if transforms else None


def use_chunked_lm_head_loss(model: nn.Module, real_vocab: int | None = None,
                             chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> nn.Module:
    """Make every *training* forward of ``model`` that gets ``labels`` compute its loss with
    :func:`chunked_lm_head_loss` from the base model's last hidden state and the output embedding's weight; it returns
    ``logits=None``. Evaluation (``model.eval()``), calls without labels and generation run the model's own forward.
    ``real_vocab``: as :func:`pad_vocabulary`'s (the padded logits are ``-inf`` in the loss too).

    Installed as the instance's ``forward`` (a bound method carrying the class forward's signature, which the
    ``Trainer`` inspects for loss kwargs and dataset columns; a launcher wrapper, DDP or ``torch.compile`` calls
    through it). Not saved with the model. Raises ``ValueError`` for a model whose logits are not
    ``lm_head(last_hidden_state)``. Returns ``model``."""
    head, base = model.get_output_embeddings(), getattr(model, "base_model", model)
    refusal = chunked_loss_refusal(model.config)
    if refusal is None and (not isinstance(head, nn.Linear) or base is model):
        refusal = f"{type(model).__name__} has no nn.Linear head on a base model"
    if refusal:
        raise ValueError(f"the chunked LM-head loss needs logits = lm_head(last hidden state): {refusal}")
    stock = type(model).forward

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        if kwargs.get("labels") is None or not self.training or len(args) > 1:
            return stock(self, *args, **kwargs)
        labels, shift_labels = kwargs.pop("labels"), kwargs.pop("shift_labels", None)
        kwargs.pop("logits_to_keep", None)
        out = self.base_model(*args, **kwargs)  # the loss kwargs travel on, as the stock forward passes them
        head = self.get_output_embeddings()
        loss = chunked_lm_head_loss(out[0], head.weight, labels, head.bias, shift_labels=shift_labels,
                                    num_items_in_batch=kwargs.get("num_items_in_batch"), real_vocab=real_vocab,
                                    chunk_tokens=chunk_tokens)
        from transformers.modeling_outputs import CausalLMOutput

        return CausalLMOutput(loss=loss, logits=None, hidden_states=getattr(out, "hidden_states", None),
                              attentions=getattr(out, "attentions", None))

    model.forward = types.MethodType(forward, model)
    _gather_head_in_forward(model, head)
    return model


def _gather_head_in_forward(model: nn.Module, head: nn.Linear) -> None:
    """Under DeepSpeed ZeRO-3 (the head's weight carries a ``ds_id``), register the head's parameters as external
    parameters of ``model``: ZeRO-3 then gathers them for ``model``'s whole forward and backward, where the chunked
    loss reads them outside the head's own forward, and releases them after. Elsewhere (plain, DDP, ZeRO-1/2; FSDP2,
    whose root unshards the embeddings and head it owns for the root's forward) nothing is needed."""
    params = [p for p in (head.weight, head.bias) if p is not None and hasattr(p, "ds_id")]
    if params:
        import deepspeed

        for param in params:
            deepspeed.zero.register_external_parameter(model, param)
