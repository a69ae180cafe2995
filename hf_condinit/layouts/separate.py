"""Separate q/k/v projections: BERT / RoBERTa / ViT / DeiT, Llama / Mistral / Qwen2 (with GQA) and most HF families."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, LayoutError, Projection

__all__ = ["SeparateQKVLayout", "PerBlockSeparateQKVLayout", "storage_of"]


def storage_of(module: nn.Module) -> str | None:
    """``"linear"`` for a module whose 2-D ``weight`` is (out, in) (``nn.Linear`` and subclasses), ``"conv1d"``
    for GPT-2's ``Conv1D`` (in, out), None for anything else (not a projection this package can write)."""
    weight = getattr(module, "weight", None)
    if weight is None or getattr(weight, "ds_shape", weight.shape).__len__() != 2:
        return None
    if isinstance(module, nn.Linear):
        return "linear"
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return "conv1d"
    return None


class SeparateQKVLayout(AttentionLayout):
    """q, k, v and o are separate projections (``nn.Linear``, or ``Conv1D``), found by dotted paths relative to the
    attention block.

    Args:
        q, k, v, o (`str`): dotted paths of the projections inside the block (e.g. ``"self.query"`` for BERT, whose
            block is ``BertAttention`` so that W_O = ``output.dense`` is reachable; ``"q_proj"`` for Llama).
        core (`str`, defaults to `""`): path of the submodule that calls the attention function.
        name (`str`): the layout's name, recorded in ``config.condinit["layout"]``.
        variant_refusal (`str`, optional): why the attention variants cannot run on this family.
    """

    def __init__(self, q: str, k: str, v: str, o: str, core: str = "", name: str = "separate_qkv",
                 variant_refusal: str | None = None):
        self.paths = {"q": q, "k": k, "v": v, "o": o}
        self.core = core
        self.name = name
        self.variant_refusal = variant_refusal

    def _is_attention_block(self, module: nn.Module) -> bool:
        for path in self.paths.values():
            try:
                if storage_of(module.get_submodule(path)) is None:
                    return False
            except AttributeError:
                return False
        return True

    def _hidden_from_weights(self, module: nn.Module) -> int | None:
        q = module.get_submodule(self.paths["q"])
        shape = getattr(q.weight, "ds_shape", q.weight.shape)
        return shape[1] if storage_of(q) == "linear" else shape[0]

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        projs = {}
        for role, path in self.paths.items():
            m = module.get_submodule(path)
            storage = storage_of(m)
            if storage is None:
                raise LayoutError(f"{type(module).__name__}.{path} is not a linear projection ({type(m).__name__}).")
            projs[role] = Projection(m, role, g.heads_for(role), g.head_dim, storage=storage)
        return projs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, paths={self.paths}, core={self.core!r})"


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
