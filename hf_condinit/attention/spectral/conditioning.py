"""Spectral conditioning on a model: attach the holders and hooks, fold C into W or remove it, and check a bf16 copy
(docs/methods.md §3; what C is: `hf_condinit.attention.spectral`)."""

from __future__ import annotations

import torch
from torch import nn

from ...parallel import gathered
from .holder import SpectralHolder

__all__ = [
    "inject_spectral",
    "spectral_holders",
    "forward_weight",
    "apply_spectral_conditioning",
    "merge_spectral",
    "remove_spectral",
    "low_precision_error",
    "PROJECTION_TOL",
]

#: what a bf16 projection with spectral conditioning may differ from fp32 (`low_precision_error`): one bf16 epsilon
#: (2⁻⁷) of the tensor's largest value, i.e. two roundings (the sum's, and C's own in svd mode; measured ≤ 0.0037)
PROJECTION_TOL = 2.0**-7

_QKV = ("q", "k", "v")


def _weight_shape(w: torch.Tensor) -> torch.Size:
    return getattr(w, "ds_shape", None) or w.shape  # DeepSpeed ZeRO-3 partitions report their full shape here


def _has_hook(module: nn.Module, holder: nn.Module, hooks: dict) -> bool:
    return any(getattr(h, "__self__", None) is holder for h in hooks.values())


def inject_spectral(block: nn.Module, core: nn.Module, layout, geometry, lam: float, mode: str) -> list[SpectralHolder]:
    """Attach (idempotently) one `SpectralHolder` per q/k/v projection module of ``block`` to ``core``."""
    projections = layout.projections(block, geometry)
    groups: dict[int, list] = {}
    for role in _QKV:
        groups.setdefault(id(projections[role].module), []).append(projections[role])
    holders = []
    for projs in groups.values():
        name = "condinit_spectral_" + "".join(p.role for p in projs)
        holder = core._modules.get(name)
        w = projs[0].weight
        if holder is None:
            holder = SpectralHolder(projs, lam, mode, _weight_shape(w), device=w.device, dtype=w.dtype)
            core.add_module(name, holder)
        else:
            holder._projections = list(projs)
            holder.lam, holder.mode = float(lam), mode
        module = projs[0].module
        if not _has_hook(module, holder, module._forward_hooks):
            module.register_forward_hook(holder._add_spectral)
        holders.append(holder)
    return holders


def spectral_holders(model: nn.Module) -> list[tuple[str, SpectralHolder]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, SpectralHolder)]


def forward_weight(core: nn.Module, projection: nn.Module) -> torch.Tensor:
    """The weight the forward pass of ``projection`` uses: its ``weight`` plus the C of every spectral holder of
    attention module ``core`` that hooks it (W + C; W alone without spectral conditioning). Detached, shaped and
    stored like ``projection.weight``."""
    w = projection.weight.detach()
    for holder in core.children():
        if isinstance(holder, SpectralHolder) and holder.projection_module is projection:
            w = w + holder.C.to(w.dtype)
    return w


def _record(config, **updates) -> None:
    """Write spectral options into ``config.condinit`` (a plain dict), creating it with ``method="default"``."""
    stored = getattr(config, "condinit", None)
    if stored is None:
        try:
            from ...config import CondInitConfig

            stored = CondInitConfig(method="default").to_dict()
        except Exception:  # the core package not importable (standalone use)
            stored = {"method": "default"}
    elif not isinstance(stored, dict):
        stored = stored.to_dict()
    else:
        stored = dict(stored)
    stored.update(updates)
    config.condinit = stored


def apply_spectral_conditioning(model: nn.Module, lam: float = 10.0, mode: str = "identity") -> nn.Module:
    """Add fixed spectral conditioning C to W_Q, W_K, W_V of every attention block of ``model``, in place.

    C is computed now (from the current weights in ``mode="svd"``) and recorded in ``model.config.condinit``
    (``spectral_lambda``, ``spectral_mode``), so ``save_pretrained`` → ``from_pretrained`` rebuilds the holders and
    restores C exactly. Calling it again replaces λ / mode and recomputes C. ``lam=0`` equals the vanilla model.

    Returns:
        the same model.
    """
    if mode not in ("identity", "svd"):
        raise ValueError(f"spectral mode must be 'identity' or 'svd', got {mode!r}.")
    if lam is None or lam < 0:
        raise ValueError(f"spectral lam must be a float >= 0, got {lam!r}.")
    from ...layouts import get_layout

    layout = get_layout(model)
    config = model.config
    for _, block in layout.attention_modules(model):
        core = layout.core_module(block)
        geometry = layout.geometry(block, config)
        for holder in inject_spectral(block, core, layout, geometry, lam, mode):
            with gathered([p.weight for p in holder._projections]):
                holder.reset_condinit_parameters(force=True)
    _record(config, spectral_lambda=float(lam), spectral_mode=mode)
    return model


def _detach_holder(model: nn.Module, name: str, holder: SpectralHolder) -> None:
    module = holder.projection_module
    for key, hook in list(module._forward_hooks.items()):
        if getattr(hook, "__self__", None) is holder:
            del module._forward_hooks[key]
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    delattr(parent, attr)


def merge_spectral(model: nn.Module) -> nn.Module:
    """Fold C into W (W ← W + C) and remove the holders and hooks: a plain HF model with the same outputs
    (peft ``merge_and_unload`` analogue). ``config.condinit["spectral_lambda"]`` is reset to None."""
    for name, holder in spectral_holders(model):
        w = holder._projections[0].weight
        with gathered([w]), torch.no_grad():
            w.add_(holder.C.to(w.dtype))
        _detach_holder(model, name, holder)
    if getattr(model.config, "condinit", None) is not None:
        _record(model.config, spectral_lambda=None)
    return model


def remove_spectral(model: nn.Module) -> nn.Module:
    """Remove the holders and hooks without folding C into W (back to the plain model)."""
    for name, holder in spectral_holders(model):
        _detach_holder(model, name, holder)
    if getattr(model.config, "condinit", None) is not None:
        _record(model.config, spectral_lambda=None)
    return model


def low_precision_error(model: nn.Module, low: nn.Module, inputs: dict, rounded: nn.Module | None = None) -> dict:
    """How far a low-precision copy ``low`` of the fp32 model ``model`` (same weights, ``copy.deepcopy(model).to(
    torch.bfloat16)``) computes from it, in eval mode without gradients (the bf16 check of docs/methods.md §3).

    Returns ``{"logits": e, "projections": {name: e}}``, each ``e = max |got − truth| / max |truth|`` of one
    tensor: the model's output (logits, or last hidden state; padded positions of ``inputs["attention_mask"]``
    zeroed), and, for every projection with spectral conditioning, its output in ``low``'s forward against the fp32
    module applied to the *same* input (upcast), so that the projection's own arithmetic is judged, not the rounding
    accumulated upstream. A correct bf16 projection is within `PROJECTION_TOL`. The output's error depends on the
    model: with λ = 10 the attention is nearly one-hot and rounding q/k to bf16 flips near-ties (Llama, identity C:
    0.107 while every projection is within 0.002). ``rounded`` (the fp32 model with its weights and C rounded to bf16,
    computing in fp32) measures that sensitivity: its output error is returned as ``"logits_rounded"``.
    """
    captured = []
    handles = [h.projection_module.register_forward_hook(lambda m, a, o: captured.append((m, a[0], o)))
               for _, h in spectral_holders(low)]  # registered after the spectral hook: sees the final output
    try:
        with torch.no_grad():
            outputs = [m.eval()(**inputs) for m in (low, model, *([rounded] if rounded is not None else []))]
    finally:
        for handle in handles:
            handle.remove()
    mask = inputs.get("attention_mask")
    outputs = [o.logits if hasattr(o, "logits") else o.last_hidden_state for o in outputs]
    if mask is not None:
        outputs = [t.float() * mask[..., None].float() for t in outputs]
    got, truth = outputs[:2]

    def rel(a, b):
        return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()

    names = {id(m): n for n, m in low.named_modules()}
    fp32_modules = dict(model.named_modules())
    projections = {}
    for module, x, out in captured:
        name = names[id(module)]
        with torch.no_grad():
            projections[name] = rel(out, fp32_modules[name](x.float()))
    errors = {"logits": rel(got, truth), "projections": projections}
    if rounded is not None:
        errors["logits_rounded"] = rel(outputs[2], truth)
    return errors
