"""Crammed BERT as a registered Hugging Face model family (``model_type = "crammed_bert"``).

``register()`` (called by ``import hf_condinit``; idempotent) adds the config and models to ``AutoConfig``,
``AutoModel``, ``AutoModelForMaskedLM`` and ``AutoModelForSequenceClassification``. Its layout adapter (fused
``query_key_value`` interleaved per head, like GPT-NeoX) is in `hf_condinit.layouts.table`, so
``AutoModelForMaskedLM.from_config(CrammedBertConfig(...), condinit=True)`` applies conditioned init.
"""

from __future__ import annotations

from .configuration_crammed_bert import CrammedBertConfig
from .modeling_crammed_bert import (
    CrammedBertAttention,
    CrammedBertForMaskedLM,
    CrammedBertForSequenceClassification,
    CrammedBertModel,
    CrammedBertPreTrainedModel,
)
from .tokenization_crammed_bert import train_wordpiece_tokenizer

__all__ = [
    "CrammedBertConfig",
    "CrammedBertAttention",
    "CrammedBertModel",
    "CrammedBertForMaskedLM",
    "CrammedBertForSequenceClassification",
    "CrammedBertPreTrainedModel",
    "register",
    "train_wordpiece_tokenizer",
]

MODEL_TYPE = CrammedBertConfig.model_type


def register() -> None:
    """Register Crammed BERT with the Auto classes (idempotent; safe to call any number of times)."""
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(MODEL_TYPE, CrammedBertConfig)
    for auto_cls, model_cls in (
        (AutoModel, CrammedBertModel),
        (AutoModelForMaskedLM, CrammedBertForMaskedLM),
        (AutoModelForSequenceClassification, CrammedBertForSequenceClassification),
    ):
        if CrammedBertConfig not in auto_cls._model_mapping._extra_content:
            auto_cls.register(CrammedBertConfig, model_cls, exist_ok=True)
