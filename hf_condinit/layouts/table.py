"""``config.model_type`` → layout adapter (peft's ``constants.py`` analogue).

Every entry is proved against the model's own forward on a miniature in ``tests/layouts/test_layouts.py``
(`hf_condinit.layouts.proof`); model types not listed here get a layout detected and proved at run time
(`hf_condinit.layouts.detect`). ``variant_refusal`` records why a family can never take the attention variants
(`affine_scaled`, `attention_sink`, `preconditioned`): terms the variants do not implement, or attention that is
inline in every supported transformers version. Whether the installed transformers routes a family's attention
through HF's attention interface is decided at run time (``AttentionLayout.refuse_variant``), not here. Spectral
conditioning (hooks on the projections) applies to all.
"""

from __future__ import annotations

from torch import nn

from ..registry import register_layout
from .fused import FusedQKVLayout, Gpt2FusedLayout, InterleavedQKVLayout
from .separate import PerBlockSeparateQKVLayout, SeparateQKVLayout

INLINE = "its attention is computed inline{what}, not through HF's attention interface, where the variants plug in"

_BERT_LIKE = SeparateQKVLayout(
    q="self.query", k="self.key", v="self.value", o="output.dense", core="self", name="bert_separate"
)
# Llama and most decoders since (with GQA, qk-norm, sliding windows, MoE feed-forwards), and, in transformers 5,
# ViT / DeiT share the q_proj/k_proj/v_proj/o_proj names.
_QKVO_PROJ = SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="o_proj", name="qkvo_proj")
_QKV_OUT_PROJ = SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="out_proj", name="qkv_out_proj")


class FalconLayout(FusedQKVLayout):
    """Falcon's ``query_key_value``: grouped per KV head ``[q…; k; v]`` with ``new_decoder_architecture``,
    ``[Q | k | v]`` with ``multi_query`` (one KV head), per-head interleaved ``[q_h; k_h; v_h]`` otherwise (read from
    each block's flags). ALiBi variants pass the bias as the attention mask."""

    def __init__(self):
        super().__init__("query_key_value", "dense", storage="linear", name="falcon_fused")

    def _ordering_for(self, module: nn.Module) -> tuple[str, str, int]:
        concat = getattr(module, "multi_query", False) and not getattr(module, "new_decoder_architecture", False)
        return ("concat" if concat else "grouped"), "qkv", 1


_FAMILIES = {
    "qwen3": _QKVO_PROJ, "qwen3_moe": _QKVO_PROJ, "qwen2_moe": _QKVO_PROJ, "gemma": _QKVO_PROJ,
    "gemma2": _QKVO_PROJ, "gemma3_text": _QKVO_PROJ, "olmo": _QKVO_PROJ, "olmo2": _QKVO_PROJ, "olmoe": _QKVO_PROJ,
    "mixtral": _QKVO_PROJ, "starcoder2": _QKVO_PROJ, "smollm3": _QKVO_PROJ, "granite": _QKVO_PROJ,
    "cohere": _QKVO_PROJ, "glm4": _QKVO_PROJ, "helium": _QKVO_PROJ, "ministral": _QKVO_PROJ,
    "stablelm": _QKVO_PROJ, "internlm3": _QKVO_PROJ, "seed_oss": _QKVO_PROJ,
    # native attention sinks: the model passes its own learned sink logits (s_aux) to the attention function
    "gpt_oss": SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="o_proj", name="qkvo_proj_sinks",
                                 variant_refusal="its attention function receives the model's own attention "
                                                 "sinks (s_aux), which the variants do not implement"),
    "phi": SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="dense", name="qkv_proj_dense"),
    "phi3": FusedQKVLayout("qkv_proj", "o_proj", storage="linear", name="phi3_fused"),
    "opt": _QKV_OUT_PROJ, "gptj": _QKV_OUT_PROJ,
    "gpt_neo": SeparateQKVLayout(q="q_proj", k="k_proj", v="v_proj", o="out_proj", name="gpt_neo_separate",
                                 variant_refusal=INLINE.format(what="")),
    "falcon": FalconLayout(),
    "bloom": InterleavedQKVLayout(name="bloom_interleaved", variant_refusal=INLINE.format(what=" with ALiBi")),
    "mpt": FusedQKVLayout("Wqkv", "out_proj", storage="linear", name="mpt_fused",
                          variant_refusal=INLINE.format(what=" with ALiBi")),
    # CodeGen's qkv_proj: mp_num = 4 chunks, each [Q_c | V_c | K_c]
    "codegen": FusedQKVLayout("qkv_proj", "out_proj", storage="linear", order="qvk", chunks=4,
                              name="codegen_fused"),
    "gpt_bigcode": FusedQKVLayout("c_attn", "c_proj", storage="linear", name="gpt_bigcode_fused"),
    "distilbert": SeparateQKVLayout(q="q_lin", k="k_lin", v="v_lin", o="out_lin", name="distilbert_separate"),
    "electra": _BERT_LIKE, "xlm-roberta": _BERT_LIKE,
    "deberta-v2": SeparateQKVLayout(
        q="self.query_proj", k="self.key_proj", v="self.value_proj", o="output.dense", name="deberta_v2_separate",
        variant_refusal=INLINE.format(what=" with disentangled relative-position terms")),
    "modernbert": FusedQKVLayout("Wqkv", "Wo", storage="linear", name="modernbert_fused"),
}

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
    **_FAMILIES,
}

for _model_type, _layout in MODEL_TYPE_TO_LAYOUT.items():
    register_layout(_model_type, _layout)
