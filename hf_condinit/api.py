"""`apply_init`: the explicit entry point, and the per-block routine the hooks share with it.

Determinism: block ``i`` (its ordinal in ``layout.attention_modules(model)``) draws from its own generator seeded
with ``seed * 1_000_003 + i`` (`block_generator`), so the weights depend only on (seed, layer), not on the head class
(``AutoModel`` vs ``AutoModelForCausalLM``), traversal order or ZeRO partitioning, and the global torch RNG is
never consumed (every other parameter equals the model's default init for the same global seed). The generator is a
CPU one (the same weights on every device) unless ``generator="device"`` puts it on the weights' device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .config import CondInitConfig, resolve_condinit
from .layouts import AttentionLayout, LayoutError, get_layout
from .parallel import gathered
from .registry import INIT_SCHEMES

__all__ = ["InitReport", "apply_init", "block_generator", "init_attention_block", "resolved_condinit"]

_SEED_STRIDE = 1_000_003


@dataclass
class InitReport:
    """What `apply_init` did.

    Attributes:
        method: the scheme applied.
        layout: name of the layout adapter.
        options: the full resolved `CondInitConfig` as a dict (also stored in ``model.config.condinit``).
        layers: one entry per attention block: ``name``, ``ordinal``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
            ``written`` (roles written) and ``skipped`` (roles left alone because they were loaded).
    """

    method: str
    layout: str
    options: dict[str, Any]
    layers: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"hf_condinit: {self.method} init via layout {self.layout!r} on {len(self.layers)} attention blocks"]
        for layer in self.layers:
            lines.append(
                f"  [{layer['ordinal']}] {layer['name']}: heads={layer['n_heads']} kv_heads={layer['n_kv_heads']} "
                f"d={layer['head_dim']} wrote={','.join(layer['written']) or '-'}"
                + (f" skipped(loaded)={','.join(layer['skipped'])}" if layer["skipped"] else "")
            )
        return "\n".join(lines)


def resolved_condinit(config) -> CondInitConfig | None:
    """``config.condinit`` as a `CondInitConfig` (None if unset), with ``seed`` resolved and written back."""
    raw = getattr(config, "condinit", None)
    cfg = resolve_condinit(raw)
    if cfg is None:
        return None
    if cfg.seed is None:
        cfg.seed = torch.initial_seed() % (2**31)
        config.condinit = cfg.to_dict()
    return cfg


def block_generator(cfg: CondInitConfig, ordinal: int, params: list[torch.Tensor]) -> torch.Generator:
    """Block ``ordinal``'s own generator, seeded ``cfg.seed · 1 000 003 + ordinal``: on the CPU for
    ``cfg.generator == "cpu"``; for ``"device"`` on the device of the first of the block's tensors ``params`` that is
    not on meta (the CPU when all are: a meta tensor has no generator, and nothing is drawn into it)."""
    device = torch.device("cpu")
    if cfg.generator == "device":
        device = next((t.device for t in params if not t.is_meta), device)
    return torch.Generator(device=device).manual_seed((cfg.seed * _SEED_STRIDE + ordinal) % 2**63)


def init_attention_block(
    block: nn.Module,
    ordinal: int,
    layout: AttentionLayout,
    model_config,
    cfg: CondInitConfig,
    *,
    loaded: str = "skip",
    wrote: list | None = None,
) -> dict[str, Any]:
    """Apply ``cfg.method`` to one attention block in place and describe what was done.

    ``loaded`` says what to do with roles whose weight carries ``_is_hf_initialized`` (loaded from a checkpoint):
    ``"skip"`` them (the construction hooks), ``"raise"`` (`apply_init`'s default) or ``"overwrite"`` them.
    ``wrote``: a list that receives every tensor written (weights and biases of the written roles).
    """
    geometry = layout.geometry(block, model_config)
    projs = layout.projections(block, geometry)
    if cfg.method != "mimetic":
        projs.pop("o")
    flagged = [role for role, p in projs.items() if getattr(p.weight, "_is_hf_initialized", False)]
    if flagged and loaded == "raise":
        raise ValueError(
            f"Attention block {ordinal} holds weights loaded from a checkpoint ({', '.join(flagged)}); "
            "apply_init would overwrite them. Pass overwrite_loaded=True to re-initialise them on purpose."
        )
    skipped = flagged if loaded == "skip" else []
    todo = {role: p for role, p in projs.items() if role not in skipped}
    params = list({id(t): t for p in todo.values() for t in (p.weight, p.bias) if t is not None}.values())
    generator = block_generator(cfg, ordinal, params)
    if params and all(t.is_meta for t in params):
        written = []  # meta-device build: nothing to write into (the draws and SVDs would be wasted CPU time)
    else:
        with torch.no_grad(), gathered(params):
            written = INIT_SCHEMES[cfg.method](todo, geometry, cfg, generator)
        if wrote is not None and written:
            wrote.extend(params)
    return {
        "ordinal": ordinal,
        "n_heads": geometry.n_heads,
        "n_kv_heads": geometry.n_kv_heads,
        "head_dim": geometry.head_dim,
        "written": written,
        "skipped": skipped,
    }


def attention_blocks(model: nn.Module, layout: AttentionLayout) -> list[tuple[str, nn.Module]]:
    """``layout.attention_modules(model)``, raising a clear error when the model has none."""
    blocks = layout.attention_modules(model)
    if not blocks:
        raise LayoutError(
            f"Layout {layout.name!r} found no attention block in {type(model).__name__}. Register a layout that "
            "matches this model with hf_condinit.register_layout(model_type, layout, overwrite=True)."
        )
    return blocks


def apply_init(
    model: nn.Module, method: Any = "conditioned", *, overwrite_loaded: bool = False, **options: Any
) -> InitReport:
    """Apply an init scheme to the attention of an already-built HF model, in place.

    Args:
        model (`PreTrainedModel`): any model whose ``config.model_type`` has a registered layout.
        method (`str`, `dict`, `bool` or `CondInitConfig`, defaults to `"conditioned"`): as ``condinit=`` on
            ``from_config``; keyword ``options`` are merged into it (e.g. ``seed=0, value_init="per_head"``).
        overwrite_loaded (`bool`, defaults to `False`): allow overwriting weights that ``from_pretrained`` loaded.

    Returns:
        `InitReport`. The resolved options are also written to ``model.config.condinit``.

    Under DeepSpeed ZeRO-3 call it on every rank: each block is gathered, written on rank 0 and re-partitioned,
    giving the same weights as without ZeRO for the same seed.
    """
    base = resolve_condinit(method) or CondInitConfig(method="default")
    cfg = CondInitConfig.from_dict({**base.to_dict(), **options})
    if cfg.seed is None:
        cfg.seed = torch.initial_seed() % (2**31)
    layout = get_layout(model)
    cfg.layout = layout.name
    report = InitReport(method=cfg.method, layout=layout.name, options=cfg.to_dict())
    for ordinal, (name, block) in enumerate(attention_blocks(model, layout)):
        entry = init_attention_block(
            block, ordinal, layout, model.config, cfg, loaded="overwrite" if overwrite_loaded else "raise"
        )
        report.layers.append({"name": name, **entry})
    model.config.condinit = cfg.to_dict()
    return report
