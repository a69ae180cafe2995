"""Fused QKV projections: one module computes q, k and v, in one of the orderings HF families use.

Orderings of the fused output axis (H query heads, H_kv key/value heads, head dimension d, G = H / H_kv):

- ``"concat"``: ``[Q | K | V]`` parts of H·d, H_kv·d, H_kv·d (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``, ModernBERT
  ``Wqkv``, GPT-BigCode and Falcon multi-query, with H_kv = 1). ``order`` permutes the parts (CodeGen: ``"qvk"``)
  and ``chunks`` repeats the pattern: the axis is ``chunks`` equal chunks, each holding ``[Q_c | V_c | K_c]`` for
  H/chunks consecutive heads (CodeGen's ``mp_num = 4``).
- ``"grouped"``: per key/value head g, ``[q_{gG}; …; q_{gG+G−1}; k_g; v_g]`` (Falcon's new decoder
  architecture); with G = 1 this is the per-head interleaving ``[q_h; k_h; v_h]`` of GPT-NeoX, BLOOM and Crammed
  BERT.
"""

from __future__ import annotations

from torch import nn

from .base import AttentionLayout, HeadGeometry, LayoutError, Projection
from .separate import storage_of

__all__ = ["FusedQKVLayout", "Gpt2FusedLayout", "InterleavedQKVLayout", "fused_starts"]


def fused_starts(g: HeadGeometry, ordering: str, order: str = "qkv", chunks: int = 1) -> dict[str, tuple[int, ...]]:
    """Where each head of q, k and v begins on the fused output axis (see the module docstring)."""
    d, G = g.head_dim, g.n_heads // g.n_kv_heads
    if ordering == "grouped":
        block = (G + 2) * d
        return {
            "q": tuple((h // G) * block + (h % G) * d for h in range(g.n_heads)),
            "k": tuple(j * block + G * d for j in range(g.n_kv_heads)),
            "v": tuple(j * block + (G + 1) * d for j in range(g.n_kv_heads)),
        }
    if ordering != "concat":
        raise ValueError(f"ordering must be 'concat' or 'grouped', got {ordering!r}")
    counts = {role: g.heads_for(role) for role in "qkv"}
    if any(n % chunks for n in counts.values()):
        raise LayoutError(f"{counts} heads cannot be split into {chunks} chunks of the fused projection.")
    chunk_width = sum(counts.values()) * d // chunks
    part_start, offset = {}, 0
    for role in order:
        part_start[role] = offset
        offset += counts[role] // chunks * d
    starts = {}
    for role, n in counts.items():
        per_chunk = n // chunks
        starts[role] = tuple((h // per_chunk) * chunk_width + part_start[role] + (h % per_chunk) * d for h in range(n))
    return starts


class FusedQKVLayout(AttentionLayout):
    """One module computes q, k and v; another computes the output projection.

    Args:
        qkv, o (`str`): attribute paths of the fused projection and of the output projection inside the block.
        storage (`str`): ``"linear"`` (weight (out, in)) or ``"conv1d"`` (weight (in, out), GPT-2).
        ordering, order, chunks: how q/k/v heads lie on the fused output axis (module docstring).
        core (`str`): path of the submodule that calls the attention function (``""`` = the block).
        name (`str`): the layout's name.
        variant_refusal (`str`, optional): why the attention variants cannot run on this family.
    """

    def __init__(self, qkv: str, o: str, *, storage: str, ordering: str = "concat", order: str = "qkv",
                 chunks: int = 1, core: str = "", name: str, variant_refusal: str | None = None):
        if storage not in ("linear", "conv1d"):
            raise ValueError(f"storage must be 'linear' or 'conv1d', got {storage!r}")
        if ordering not in ("concat", "grouped") or sorted(order) != ["k", "q", "v"]:
            raise ValueError(f"unknown fused ordering {ordering!r} / order {order!r}")
        self.qkv, self.o, self.storage = qkv, o, storage
        self.ordering, self.order, self.chunks = ordering, order, chunks
        self.core, self.name, self.variant_refusal = core, name, variant_refusal

    def _is_attention_block(self, module: nn.Module) -> bool:
        try:
            qkv, o = module.get_submodule(self.qkv), module.get_submodule(self.o)
        except AttributeError:
            return False
        return storage_of(qkv) is not None and storage_of(o) is not None

    def _hidden_from_weights(self, module: nn.Module) -> int | None:
        qkv = module.get_submodule(self.qkv)
        shape = getattr(qkv.weight, "ds_shape", qkv.weight.shape)
        return shape[1] if self.storage == "linear" else shape[0]

    def _projections(self, module: nn.Module, g: HeadGeometry) -> dict[str, Projection]:
        qkv, o = module.get_submodule(self.qkv), module.get_submodule(self.o)
        starts = fused_starts(g, *self._ordering_for(module))
        projs = {role: Projection(qkv, role, g.heads_for(role), g.head_dim, self.storage, starts=starts[role])
                 for role in ("q", "k", "v")}
        projs["o"] = Projection(o, "o", g.n_heads, g.head_dim, self.storage)
        return projs

    def _ordering_for(self, module: nn.Module) -> tuple[str, str, int]:
        """(ordering, order, chunks) of the fused projection of block ``module``."""
        return self.ordering, self.order, self.chunks

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, qkv={self.qkv!r}, o={self.o!r}, storage={self.storage!r}, "
                f"ordering={self.ordering!r}, order={self.order!r}, chunks={self.chunks}, core={self.core!r})")


class Gpt2FusedLayout(FusedQKVLayout):
    """GPT-2: ``attn.c_attn`` (Conv1D, ``[Q | K | V]``) and ``attn.c_proj``; cross-attention blocks are skipped."""

    def __init__(self, qkv: str = "c_attn", o: str = "c_proj", name: str = "gpt2_fused"):
        super().__init__(qkv, o, storage="conv1d", ordering="concat", name=name)

    def _is_attention_block(self, module: nn.Module) -> bool:
        return super()._is_attention_block(module) and not getattr(module, "is_cross_attention", False)


class InterleavedQKVLayout(FusedQKVLayout):
    """GPT-NeoX / BLOOM / Crammed BERT: one ``nn.Linear`` with per-head ``[q_h; k_h; v_h]`` row blocks."""

    def __init__(self, qkv: str = "query_key_value", o: str = "dense", core: str = "", name: str = "interleaved_qkv",
                 variant_refusal: str | None = None):
        super().__init__(qkv, o, storage="linear", ordering="grouped", core=core, name=name,
                         variant_refusal=variant_refusal)
