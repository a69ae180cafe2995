"""What a portable checkpoint runs without hf_condinit: holders rebuilt from config.json, variants registered.

This file is one part of the self-contained ``condinit_modeling.py`` that `hf_condinit.attention.portable` writes
next to the weights (bundled verbatim with the holders' base, the shared helpers, every variant's folder and
``catalog.py``, relative imports removed; see `hf_condinit.attention.portable.bundle_source`). Inside hf_condinit it
is importable and tested like any module, but the package itself never calls it.

``config.condinit_holders`` (written by `hf_condinit.attention.portable.holder_manifest`) lists every holder of the
saved model: the module it is attached to (path relative to ``model.base_model``, so any head class of the family
finds it), its attribute name, its kind and the shapes needed to build it before the weights are loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ._common import watch_attention_requests
from .catalog import VARIANTS
from .compile_guard import guard_compile
from .spectral.holder import SpectralHolder


def register_portable_variants() -> None:
    """Register the variants with HF's attention and mask registries, leaving names already registered alone (the
    same functions registered by hf_condinit, when it is imported too)."""
    for variant in VARIANTS:
        if variant.name not in AttentionInterface._global_mapping:
            AttentionInterface.register(variant.name, variant.forward)
            AttentionMaskInterface.register(variant.name, sdpa_mask)


class StoredProjection:
    """The part of a layout ``Projection`` that a spectral holder's forward hook reads: the module, the role and
    the weight's storage convention (``"linear"``: (out, in); ``"conv1d"``: (in, out))."""

    def __init__(self, module: torch.nn.Module, role: str, storage: str):
        self.module, self.role, self.storage = module, role, storage

    @property
    def weight(self) -> torch.Tensor:
        return self.module.weight

    def linear(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.linear(x, t) if self.storage == "linear" else x @ t


def attach_holders(model: torch.nn.Module, manifest: list[dict]) -> None:
    """Attach (idempotently) the holders listed in ``manifest`` to ``model.base_model``, with their hooks.

    Values are zeros until the checkpoint's weights are loaded into them.
    """
    root = model.base_model
    holders = {v.name: v.holder for v in VARIANTS if v.holder is not None}
    for entry in manifest:
        core = root.get_submodule(entry["module"])
        if entry["name"] in core._modules:
            continue
        like = next(core.parameters())
        kind = entry["kind"]
        if kind in holders:
            holder = holders[kind].from_shape(entry, device=like.device, dtype=like.dtype)
            core.add_module(entry["name"], holder)
            holder.hook_into(core)
        elif kind == "spectral":
            module = root.get_submodule(entry["projection"])
            projections = [StoredProjection(module, role, entry["storage"]) for role in entry["roles"]]
            holder = SpectralHolder(projections, entry["lam"], entry["mode"], torch.Size(entry["shape"]),
                                    device=module.weight.device, dtype=module.weight.dtype)
            core.add_module(entry["name"], holder)
            module.register_forward_hook(holder._add_spectral)
        else:
            raise ValueError(f"condinit_holders: unknown holder kind {kind!r} (saved by a newer hf_condinit?).")


class CondInitPortableConfigMixin:
    """Mixed in before a transformers config class: config.json keeps ``attn_implementation`` = the recorded variant
    when the config is saved again (transformers never writes it), so the re-saved checkpoint stays refused by a
    concrete transformers class and is rebuilt with its variant."""

    def to_dict(self):
        out = super().to_dict()
        if out.get("condinit_attention"):
            out["attn_implementation"] = out["condinit_attention"]
        return out


class CondInitPortableMixin:
    """Mixed in before a transformers model class: checks that the model is built with the recorded variant, then
    attaches the holders of ``config.condinit_holders`` before the original ``post_init`` (so they exist when
    ``from_pretrained`` loads the weights), and, as `hf_condinit.attention.inject` does, the pre-hook that refuses
    torch.compile in one line where the running torch compiles this model wrongly (`guard_compile`) and, for a
    variant, the hooks that pass a request for attention weights on to the blocks (`watch_attention_requests`)."""

    def post_init(self):
        variant = getattr(self.config, "condinit_attention", None)
        if variant and self.config._attn_implementation != variant:
            raise ValueError(
                f"This checkpoint was trained with attention variant {variant!r}, but the model is being built with "
                f"attn_implementation={self.config._attn_implementation!r}, which computes another model. Leave "
                "attn_implementation out (or pass the recorded one)."
            )
        attach_holders(self, getattr(self.config, "condinit_holders", None) or [])
        guard_compile(self)
        if variant:
            watch_attention_requests(self)
        super().post_init()
