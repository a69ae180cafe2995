"""Separate q/k/v projections: BERT / RoBERTa / ViT / DeiT, Llama / Mistral / Qwen2 (with GQA) and most HF families."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, LayoutError, Projection

__all__ = ["SeparateQKVLayout", "PerBlockSeparateQKVLayout", "GatedQuerySeparateLayout", "GATE_ORDERS", "storage_of"]


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


#: How the query and its output gate share the query projection's output axis (H heads of d): ``"per_head"``,
#: per head ``[q_h; g_h]`` (Qwen3-Next, Qwen3.5: the output is viewed as (H, 2d) and chunked); ``"halves"``,
#: ``[Q | G]``; each with the gate first instead (``"per_head_gate_first"``, ``"halves_gate_first"``).
GATE_ORDERS = ("per_head", "halves", "per_head_gate_first", "halves_gate_first")


class GatedQuerySeparateLayout(SeparateQKVLayout):
    """Gated attention: separate q/k/v/o projections where the query projection also computes a per-head output
    gate, ``out_h ⊙ σ(x·W_G^h)`` before W_O (Qwen3-Next, Qwen3.5). ``gate_order`` (one of `GATE_ORDERS`) says where
    the query's and the gate's columns lie; the ``"q"`` projection's head views hold the query part only (what the
    inits write), its ``gate_starts`` the gate part (which keeps the model's own init). The layout proof checks both
    halves against the model's forward (`hf_condinit.layouts.proof`)."""

    def __init__(self, q: str, k: str, v: str, o: str, gate_order: str = "per_head", core: str = "",
                 name: str = "gated_separate_qkv", variant_refusal: str | None = None):
        if gate_order not in GATE_ORDERS:
            raise ValueError(f"gate_order must be one of {GATE_ORDERS}, got {gate_order!r}")
        super().__init__(q, k, v, o, core=core, name=name, variant_refusal=variant_refusal)
        self.gate_order = gate_order

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        projs = super()._projections(module, g)
        d, H = g.head_dim, g.n_heads
        if self.gate_order.startswith("per_head"):
            query, gate = [2 * d * h for h in range(H)], [2 * d * h + d for h in range(H)]
        else:
            query, gate = [d * h for h in range(H)], [H * d + d * h for h in range(H)]
        if self.gate_order.endswith("gate_first"):
            query, gate = gate, query
        q = projs["q"]
        projs["q"] = Projection(q.module, "q", q.n_heads, d, q.storage, starts=tuple(query), gate_starts=tuple(gate))
        return projs

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, paths={self.paths}, gate_order={self.gate_order!r}, "
                f"core={self.core!r})")
