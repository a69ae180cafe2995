"""Tiny configs per family (built in code, no downloads) and shared test helpers."""

from __future__ import annotations

import torch
from transformers import AutoConfig

# model_type -> kwargs of AutoConfig.for_model; every model_type of layouts/table.py must appear here.
MINI_CONFIGS = {
    "gpt2": dict(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0),
    "bert": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=64,
                 max_position_embeddings=32),
    "roberta": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                    vocab_size=64, max_position_embeddings=40, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "vit": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, image_size=8,
                patch_size=4),
    "deit": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, image_size=8,
                 patch_size=4),
    "llama": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=64, vocab_size=64, max_position_embeddings=32, attention_bias=True),
    "mistral": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=2,
                    intermediate_size=64, vocab_size=64, max_position_embeddings=32),
    "qwen2": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=64, vocab_size=64, max_position_embeddings=32),
    "gpt_neox": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                     vocab_size=64, max_position_embeddings=32, attention_bias=True),
    "crammed_bert": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                         vocab_size=64, max_position_embeddings=32),
}

VISION_TYPES = {"vit", "deit"}


def mini_config(model_type: str, **overrides):
    return AutoConfig.for_model(model_type, **{**MINI_CONFIGS[model_type], **overrides})


def example_inputs(model_type: str, config, batch: int = 2, seq: int = 6, seed: int = 0) -> dict:
    """Model inputs that exercise every layer (token ids, or pixels for vision models)."""
    gen = torch.Generator().manual_seed(seed)
    if model_type in VISION_TYPES:
        return {"pixel_values": torch.randn(batch, config.num_channels, config.image_size, config.image_size,
                                            generator=gen)}
    return {"input_ids": torch.randint(3, config.vocab_size, (batch, seq), generator=gen)}
