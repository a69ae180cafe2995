"""Crammed BERT (Geiping & Goldstein 2023) as a plain Hugging Face model (docs/methods.md §7).

Architecture:
    x0 = LayerNorm(E[tok] + s · PE_sin[pos])                          (scaled sinusoidal positions, s learnable)
    x  = x + Drop(Attn(LN(x)));  x = x + Drop(W_out · (GELU(W_g · LN(x)) ⊙ (W_v · LN(x))))   (pre-LN, GELU-GLU)
    h  = LN_final(x)
No bias anywhere in the encoder. The MLM head is dense → GELU → LayerNorm → decoder tied to E (no bias), evaluated
only on masked positions when ``config.sparse_prediction`` (sparse MLM loss). The classification head pools the
first token: dense → tanh → dropout → classifier.

Attention goes through the HF attention registry (``ALL_ATTENTION_FUNCTIONS`` keyed by
``config._attn_implementation``), and the mask through ``transformers.masking_utils.create_bidirectional_mask``, so
every registered implementation (``sdpa``, ``eager``, ``flex_attention``, and hf_condinit's ``affine_scaled``,
``attention_sink``, ``preconditioned``) and its registered mask function apply, exactly as in ``modeling_bert.py``.

The fused QKV projection is one ``nn.Linear(D, 3·D, bias=False)`` named ``query_key_value``, **interleaved per
head** (docs/methods.md §1): output rows ``[h·3d, h·3d + d)`` are q_h, ``[h·3d + d, h·3d + 2d)`` k_h and
``[h·3d + 2d, (h+1)·3d)`` v_h — the GPT-NeoX storage convention, with the output projection named ``dense`` as in
GPT-NeoX. The layout adapter ``InterleavedQKVLayout`` of hf_condinit reads it through these names.

Choice: the FFN input projection has width ``intermediate_size`` and is split [value | gate] (cramming's ``GLU``:
``x, gate = chunk(2); nonlin(gate) * x``), the output projection reads ``intermediate_size // 2``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss

from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    SequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_crammed_bert import CrammedBertConfig

__all__ = [
    "CrammedBertPreTrainedModel",
    "CrammedBertModel",
    "CrammedBertForMaskedLM",
    "CrammedBertForSequenceClassification",
    "CrammedBertAttention",
    "sinusoidal_table",
]


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """The (num_positions, dim) sinusoidal table of Vaswani et al. (sin on even, cos on odd features), in fp32.

    Deterministic (no RNG), so the buffer can be recomputed from the config alone.
    """
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float32)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


class CrammedBertScaledSinusoidal(nn.Module):
    """Scaled sinusoidal positions: ``scale · PE[pos]`` with a learnable scalar ``scale`` initialised to 1/√D
    (cramming's ``ScaledSinosoidal``). The table is a non-persistent buffer rebuilt by ``_init_weights``."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__()
        self.dim = config.hidden_size
        self.num_positions = config.max_position_embeddings
        self.scale = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(config.hidden_size)))
        self.register_buffer(
            "pe", sinusoidal_table(config.max_position_embeddings, config.hidden_size), persistent=False
        )

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        if position_ids.max() >= self.num_positions:
            raise ValueError(
                f"Crammed BERT: position {int(position_ids.max())} is beyond max_position_embeddings="
                f"{self.num_positions}; truncate the inputs (e.g. --max_seq_length) or raise max_position_embeddings."
            )
        return self.pe[position_ids].to(self.scale.dtype) * self.scale


class CrammedBertEmbeddings(nn.Module):
    """Token embedding + scaled sinusoidal positions, then LayerNorm and dropout (no token types)."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = CrammedBertScaledSinusoidal(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device).unsqueeze(0)
        embeddings = inputs_embeds + self.position_embeddings(position_ids).to(inputs_embeds.dtype)
        return self.dropout(self.LayerNorm(embeddings))


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
):
    """Plain softmax attention (same contract as ``modeling_bert.eager_attention_forward``)."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class CrammedBertAttention(nn.Module):
    """Bidirectional multi-head self-attention with one fused, per-head interleaved QKV projection.

    Attributes read by attention implementations and layout adapters: ``config``, ``num_heads``
    (= ``num_attention_heads``), ``head_dim`` (= ``head_size``), ``scaling``, ``is_causal = False``,
    ``query_key_value`` (``nn.Linear(D, 3·D, bias=False)``, rows [q_h; k_h; v_h] per head) and ``dense``
    (``nn.Linear(D, D, bias=False)``, the output projection W_O).
    """

    def __init__(self, config: CrammedBertConfig, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_groups = 1
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.head_size = self.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        # (B, T, 3D) -> (B, T, H, 3d) -> (B, H, T, 3d); per head [q_h | k_h | v_h] along the last axis.
        qkv = self.query_key_value(hidden_states).view(*input_shape, self.num_heads, 3 * self.head_dim)
        qkv = qkv.transpose(1, 2)
        query_states, key_states, value_states = qkv.chunk(3, dim=-1)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.dense(attn_output), attn_weights


class CrammedBertGLUFeedForward(nn.Module):
    """GELU-GLU feed-forward without biases: ``dense_out(act(gate) ⊙ value)`` with ``[value | gate] = dense_in(x)``."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__()
        self.dense_in = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.act = ACT2FN[config.hidden_act]
        self.dense_out = nn.Linear(config.intermediate_size // 2, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        value, gate = self.dense_in(hidden_states).chunk(2, dim=-1)
        return self.dense_out(self.act(gate) * value)


class CrammedBertLayer(GradientCheckpointingLayer):
    """Pre-LN block: ``x + Drop(Attn(LN(x)))`` then ``x + Drop(FFN(LN(x)))``."""

    def __init__(self, config: CrammedBertConfig, layer_idx: int | None = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.attention = CrammedBertAttention(config, layer_idx=layer_idx)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.ffn = CrammedBertGLUFeedForward(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.attention(self.norm1(hidden_states), attention_mask, **kwargs)
        hidden_states = hidden_states + self.dropout(attn_output)
        hidden_states = hidden_states + self.dropout(self.ffn(self.norm2(hidden_states)))
        return hidden_states


class CrammedBertPreTrainedModel(PreTrainedModel):
    config_class = CrammedBertConfig
    config: CrammedBertConfig
    base_model_prefix = "crammed_bert"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CrammedBertEmbeddings", "CrammedBertLayer"]
    _supports_flash_attn = False  # flash-attn kernels need bf16/fp16 + CUDA; untested here
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {
        "hidden_states": CrammedBertLayer,
        "attentions": CrammedBertAttention,
    }

    def _init_weights(self, module: nn.Module):
        """N(0, initializer_range) for every Linear / Embedding, LayerNorm weight 1 (bias 0), the position scale
        1/√D and the sinusoidal table recomputed. Every write goes through ``transformers.initialization`` (guarded
        by ``_is_hf_initialized``), so weights loaded by ``from_pretrained`` are never overwritten."""
        super()._init_weights(module)  # Linear / Embedding: normal(0, initializer_range); LayerNorm: ones / zeros
        if isinstance(module, CrammedBertScaledSinusoidal):
            init.constant_(module.scale, 1.0 / math.sqrt(module.dim))
            init.copy_(module.pe, sinusoidal_table(module.num_positions, module.dim))


class CrammedBertModel(CrammedBertPreTrainedModel):
    """The Crammed BERT encoder (embeddings, pre-LN blocks, final LayerNorm); ``pooler_output`` is None."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = CrammedBertEmbeddings(config)
        self.layers = nn.ModuleList([CrammedBertLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        """``token_type_ids`` is accepted (tokenizers of other BERTs return it) and ignored: Crammed BERT has no
        segment embeddings."""
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")

        hidden_states = self.embeddings(input_ids=input_ids, position_ids=position_ids, inputs_embeds=inputs_embeds)
        attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        hidden_states = self.final_norm(hidden_states)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states)


class CrammedBertPredictionHead(nn.Module):
    """MLM transform: dense (no bias) → GELU → LayerNorm."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class CrammedBertForMaskedLM(CrammedBertPreTrainedModel):
    """Crammed BERT with the MLM head; the decoder (no bias) is tied to the input embeddings.

    With ``labels`` and ``config.sparse_prediction`` (default), only the masked positions (``labels != -100``) go
    through the head and decoder: ``logits`` has shape ``(n_masked, vocab_size)`` in row-major order of the masked
    positions, and ``loss`` is their mean cross-entropy (the same value as the dense loss, at a fraction of the cost).
    """

    _tied_weights_keys = {"decoder.weight": "crammed_bert.embeddings.word_embeddings.weight"}

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.crammed_bert = CrammedBertModel(config)
        self.head = CrammedBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, new_embeddings):
        self.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        outputs = self.crammed_bert(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        sequence_output = outputs.last_hidden_state
        if labels is not None and self.config.sparse_prediction:
            labels = labels.reshape(-1)
            sequence_output = sequence_output.reshape(labels.shape[0], -1)
            masked = labels != -100
            sequence_output = sequence_output[masked]
            labels = labels[masked]
        logits = self.decoder(self.head(sequence_output))

        loss = None
        if labels is not None:
            if labels.numel() == 0 or not bool((labels != -100).any()):
                loss = logits.sum() * 0.0  # no masked token in the batch: zero loss, graph kept for DDP/ZeRO
            else:
                loss = CrossEntropyLoss()(logits.reshape(-1, self.config.vocab_size).float(), labels.reshape(-1))
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class CrammedBertPooler(nn.Module):
    """First-token pooler: dense → tanh (cramming's classification head with ``include_ff_layer``)."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


class CrammedBertForSequenceClassification(CrammedBertPreTrainedModel):
    """Crammed BERT with a first-token pooler + dropout + linear classifier.

    ``num_labels == 1`` (or ``problem_type="regression"``) trains with MSE (STS-B); integer labels with
    ``num_labels > 1`` with cross-entropy; float multi-hot labels with BCE — the HF convention.
    """

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crammed_bert = CrammedBertModel(config)
        self.pooler = CrammedBertPooler(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput:
        outputs = self.crammed_bert(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        pooled = self.dropout(self.pooler(outputs.last_hidden_state))
        logits = self.classifier(pooled)

        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif self.num_labels > 1 and labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                if self.num_labels == 1:
                    loss = MSELoss()(logits.squeeze(-1).float(), labels.reshape(-1).to(torch.float32))
                else:
                    loss = MSELoss()(logits.float(), labels.float())
            elif self.config.problem_type == "single_label_classification":
                loss = CrossEntropyLoss()(logits.view(-1, self.num_labels).float(), labels.view(-1))
            else:
                loss = BCEWithLogitsLoss()(logits.float(), labels.float())
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
