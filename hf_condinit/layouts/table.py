"""``config.model_type`` → layout adapter (peft's ``constants.py`` analogue)."""

from __future__ import annotations

from ..registry import register_layout
from .fused import Gpt2FusedLayout, InterleavedQKVLayout
from .separate import PerBlockSeparateQKVLayout, SeparateQKVLayout

_BERT_LIKE = SeparateQKVLayout(
    q="self.query", k="self.key", v="self.value", o="output.dense", core="self", name="bert_separate"
)
# Llama / Mistral / Qwen2 (with GQA) and, in transformers 5, ViT / DeiT share the q_proj/k_proj/v_proj/o_proj names.
_QKVO_PROJ = SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="o_proj", name="qkvo_proj")

MODEL_TYPE_TO_LAYOUT = {
    "gpt2": Gpt2FusedLayout(),
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "vit": _QKVO_PROJ,
    "deit": _QKVO_PROJ,
    # Swin: same names, but width and heads change per stage (read from each block); window attention with a
    # relative position bias added as an attention mask.
    "swin": PerBlockSeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="o_proj", name="swin_qkvo_proj"),
    "llama": _QKVO_PROJ,
    "mistral": _QKVO_PROJ,
    "qwen2": _QKVO_PROJ,
    "gpt_neox": InterleavedQKVLayout(),
    # hf_condinit.models.crammed_bert: same interleaved storage as GPT-NeoX, the block calls attention itself.
    "crammed_bert": InterleavedQKVLayout(qkv="query_key_value", o="dense", name="crammed_bert_interleaved"),
}

for _model_type, _layout in MODEL_TYPE_TO_LAYOUT.items():
    register_layout(_model_type, _layout)
