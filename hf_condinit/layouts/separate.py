"""Separate q/k/v ``nn.Linear`` projections: BERT / RoBERTa / ViT / DeiT and Llama / Mistral / Qwen2 (with GQA)."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, Projection

__all__ = ["SeparateQKVLayout"]


class SeparateQKVLayout(AttentionLayout):
    """q, k, v and o are separate ``nn.Linear`` layers, found by dotted paths relative to the attention block.

    Args:
        q, k, v, o (`str`): dotted paths of the projections inside the block (e.g. ``"self.query"`` for BERT, whose
            block is ``BertAttention`` so that W_O = ``output.dense`` is reachable; ``"q_proj"`` for Llama).
        core (`str`, defaults to `""`): path of the submodule that calls the attention function.
        name (`str`): the layout's name, recorded in ``config.condinit["layout"]``.
    """

    def __init__(self, q: str, k: str, v: str, o: str, core: str = "", name: str = "separate_qkv"):
        self.paths = {"q": q, "k": k, "v": v, "o": o}
        self.core = core
        self.name = name

    def _is_attention_block(self, module: nn.Module) -> bool:
        for path in self.paths.values():
            try:
                if not isinstance(module.get_submodule(path), nn.Linear):
                    return False
            except AttributeError:
                return False
        return True

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        return {
            role: Projection(module.get_submodule(path), role, g.heads_for(role), g.head_dim, storage="linear")
            for role, path in self.paths.items()
        }
