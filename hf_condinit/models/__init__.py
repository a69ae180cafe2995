"""Model families shipped with hf_condinit (currently Crammed BERT), registered with the Auto classes."""

from __future__ import annotations

from .crammed_bert import (
    CrammedBertConfig,
    CrammedBertForMaskedLM,
    CrammedBertForSequenceClassification,
    CrammedBertModel,
    register,
)

__all__ = [
    "CrammedBertConfig",
    "CrammedBertModel",
    "CrammedBertForMaskedLM",
    "CrammedBertForSequenceClassification",
    "register",
]
