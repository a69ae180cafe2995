"""Crammed BERT configuration (Geiping & Goldstein 2023, "Cramming: Training a Language Model on a Single GPU in One
Day"; docs/methods.md §7).

The defaults are the paper's final recipe: 16 layers, 768 hidden, 12 heads, pre-LN, no biases in the encoder,
GELU-GLU feed-forward, scaled sinusoidal positions + embedding LayerNorm, tied embeddings, sparse MLM loss, seq 128.

Choice: ``intermediate_size`` is the width of the FFN *input* projection (3072), as in the cramming code base; the
GLU halves it, so the output projection reads ``intermediate_size // 2`` features.
Choice: pretraining dropout is 0 (crammed recipe), the classification head keeps ``classifier_dropout=0.1``.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

__all__ = ["CrammedBertConfig"]


@strict
class CrammedBertConfig(PreTrainedConfig):
    r"""Configuration of a Crammed BERT model.

    Args:
        vocab_size (`int`, *optional*, defaults to 32768): vocabulary size (WordPiece, as in cramming).
        hidden_size (`int`, *optional*, defaults to 768): model width D.
        num_hidden_layers (`int`, *optional*, defaults to 16): number of pre-LN transformer blocks.
        num_attention_heads (`int`, *optional*, defaults to 12): heads H; ``hidden_size`` must be divisible by it.
        intermediate_size (`int`, *optional*, defaults to 3072): width of the FFN input projection (GLU halves it).
        hidden_act (`str`, *optional*, defaults to `"gelu"`): gate nonlinearity of the GLU (and of the MLM head).
        hidden_dropout_prob (`float`, *optional*, defaults to 0.0): dropout on residual branches and embeddings.
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.0): dropout on attention probabilities.
        classifier_dropout (`float`, *optional*, defaults to 0.1): dropout in the sequence-classification head.
        max_position_embeddings (`int`, *optional*, defaults to 128): length of the sinusoidal position table.
        initializer_range (`float`, *optional*, defaults to 0.02): std of the N(0, σ) init of Linear / Embedding.
        layer_norm_eps (`float`, *optional*, defaults to 1e-12): LayerNorm epsilon.
        pad_token_id (`int`, *optional*, defaults to 0): padding token id.
        sparse_prediction (`bool`, *optional*, defaults to `True`): when labels are given to the MLM model, compute the
            decoder only on the masked positions (``labels != -100``); the returned logits are then
            ``(n_masked, vocab_size)`` instead of ``(batch, seq, vocab_size)``.
        tie_word_embeddings (`bool`, *optional*, defaults to `True`): tie the MLM decoder to the input embeddings.
    """

    model_type = "crammed_bert"

    vocab_size: int = 32768
    hidden_size: int = 768
    num_hidden_layers: int = 16
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.0
    attention_probs_dropout_prob: float | int = 0.0
    classifier_dropout: float | int | None = 0.1
    max_position_embeddings: int = 128
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    sparse_prediction: bool = True
    tie_word_embeddings: bool = True

    def validate_architecture(self):
        """Part of `@strict` validation: shapes that the modeling code relies on."""
        super().validate_architecture()
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"CrammedBertConfig: hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})."
            )
        if self.intermediate_size % 2 != 0:
            raise ValueError(
                f"CrammedBertConfig: intermediate_size ({self.intermediate_size}) must be even (the GELU-GLU splits "
                "it into a value half and a gate half)."
            )
        if self.hidden_size % 2 != 0:
            raise ValueError(
                f"CrammedBertConfig: hidden_size ({self.hidden_size}) must be even (sinusoidal positions)."
            )
