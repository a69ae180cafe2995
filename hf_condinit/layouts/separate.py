"""Separate q/k/v ``nn.Linear`` projections: BERT / RoBERTa / ViT / DeiT and Llama / Mistral / Qwen2 (with GQA)."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, Projection

__all__ = ["SeparateQKVLayout", "PerBlockSeparateQKVLayout"]


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


class PerBlockSeparateQKVLayout(SeparateQKVLayout):
    """Separate q/k/v/o ``nn.Linear`` layers in blocks whose width and head count change along the model (Swin: each
    stage doubles the width and has its own ``num_heads[stage]``), so the geometry is read from the block itself:
    D = ``q.in_features``, H = ``block.num_attention_heads``, d = ``block.head_dim`` (no GQA); the model config is
    only used for the other layouts' shared signature."""

    def geometry(self, module: nn.Module, config) -> HeadGeometry:
        core = self.core_module(module)
        n_heads = int(core.num_attention_heads)
        q = module.get_submodule(self.paths["q"])
        geometry = HeadGeometry(hidden=q.in_features, n_heads=n_heads, n_kv_heads=n_heads,
                                head_dim=int(getattr(core, "head_dim", q.out_features // n_heads)))
        self._check_shapes(module, geometry)
        return geometry
