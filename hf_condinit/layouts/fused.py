"""Fused QKV projections: GPT-2's ``Conv1D`` ``[Q | K | V]`` and per-head interleaved ``[q_h; k_h; v_h]``.

- GPT-2 ``c_attn``: ``Conv1D`` storing (in, out) = (D, 3·D); Q, K, V are consecutive parts of the output axis and
  head h sits at ``[h·d, (h+1)·d)`` inside each part.
- GPT-NeoX ``query_key_value`` and Crammed BERT: ``nn.Linear`` (3·H·d, D) whose output rows are grouped per head,
  ``[q_0; k_0; v_0; q_1; …]`` (the model reshapes to (…, H, 3·d) and chunks the last axis).
"""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, LayoutError, Projection

__all__ = ["FusedQKVLayout", "Gpt2FusedLayout", "InterleavedQKVLayout"]


class FusedQKVLayout(AttentionLayout):
    """One module computes q, k and v; another computes the output projection.

    Args:
        qkv, o (`str`): attribute paths of the fused projection and of the output projection inside the block.
        storage (`str`): ``"linear"`` (weight (out, in)) or ``"conv1d"`` (weight (in, out), GPT-2).
        interleaved (`bool`): per-head interleaved ``[q_h; k_h; v_h]`` blocks instead of ``[Q | K | V]`` parts.
        core (`str`): path of the submodule that calls the attention function (``""`` = the block).
        name (`str`): the layout's name.
    """

    def __init__(self, qkv: str, o: str, *, storage: str, interleaved: bool, core: str = "", name: str):
        if storage not in ("linear", "conv1d"):
            raise ValueError(f"storage must be 'linear' or 'conv1d', got {storage!r}")
        self.qkv, self.o, self.storage, self.interleaved = qkv, o, storage, interleaved
        self.core, self.name = core, name

    def _is_attention_block(self, module: nn.Module) -> bool:
        try:
            qkv, o = module.get_submodule(self.qkv), module.get_submodule(self.o)
        except AttributeError:
            return False
        return getattr(qkv, "weight", None) is not None and getattr(o, "weight", None) is not None

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        if g.n_kv_heads != g.n_heads:
            raise LayoutError(f"The fused layout {self.name!r} has no grouped-query (GQA) variant.")
        qkv, o = module.get_submodule(self.qkv), module.get_submodule(self.o)
        d, width = g.head_dim, g.n_heads * g.head_dim
        projs = {}
        for i, role in enumerate(("q", "k", "v")):
            offset, stride = (i * d, 3 * d) if self.interleaved else (i * width, d)
            projs[role] = Projection(qkv, role, g.n_heads, d, self.storage, offset=offset, stride=stride)
        projs["o"] = Projection(o, "o", g.n_heads, d, self.storage)
        return projs


class Gpt2FusedLayout(FusedQKVLayout):
    """GPT-2: ``attn.c_attn`` (Conv1D, ``[Q | K | V]``) and ``attn.c_proj``; cross-attention blocks are skipped."""

    def __init__(self, qkv: str = "c_attn", o: str = "c_proj", name: str = "gpt2_fused"):
        super().__init__(qkv, o, storage="conv1d", interleaved=False, name=name)

    def _is_attention_block(self, module: nn.Module) -> bool:
        return super()._is_attention_block(module) and not getattr(module, "is_cross_attention", False)


class InterleavedQKVLayout(FusedQKVLayout):
    """GPT-NeoX / Crammed BERT: one ``nn.Linear`` with per-head ``[q_h; k_h; v_h]`` row blocks."""

    def __init__(self, qkv: str = "query_key_value", o: str = "dense", core: str = "", name: str = "interleaved_qkv"):
        super().__init__(qkv, o, storage="linear", interleaved=True, core=core, name=name)
