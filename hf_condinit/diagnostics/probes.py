"""Capture the real inputs of every attention block, and the model-level attention-Jacobian diagnostic.

Paper: Saratchandran & Lucey, "Conditioned Initialization for Attention" (Figures 1 and 3); docs/methods.md §6.
For each layer and head, X is the real normalised input of the attention (the ``hidden_states`` argument of the
layout's attention block: ``ln_1`` output in GPT-2, ``input_layernorm`` output in Llama, the layer input in
post-LN BERT), the weights are the head's ``(W_Q, W_K, W_V)`` views of :mod:`hf_condinit.layouts` of the weights
the forward pass uses (W + C under spectral conditioning, `hf_condinit.attention.spectral.forward_weight`), and κ(J)
comes from :func:`hf_condinit.diagnostics.condition_number.head_condition_number`. For ``affine_scaled``,
``attention_sink`` and ``preconditioned`` κ is that of the plain softmax head inside the variant (its q/k/v weights
are the forward's; the variant's output transform is not modelled).

Choice: rotary position embeddings (Llama, NeoX) are **not** applied: the diagnostic measures the Jacobian of the
content attention ``softmax(s · (X W_Q + b_Q)(X W_K + b_K)ᵀ + mask)(X W_V + b_V)``, the object of the papers'
bound, not of the rotated logits. Sliding windows, ALiBi and other logit biases are likewise left out.

Choice (``causal=None``, "the mask the model really uses"), first rule that applies, per layer:

1. a bool ``is_causal`` attribute on the layout's core module (``layout.core_module(block)``), then on the block
   (GPT-2 and Llama attention: True; BERT self-attention: ``config.is_decoder``);
2. ``config.is_decoder`` is True → causal;
3. ``config.model_type`` in :data:`CAUSAL_MODEL_TYPES` → causal; otherwise bidirectional.

The probe's ``attention_mask`` (1 = real token) is applied as a key-padding mask, and padded query rows are left
out of J.

Choice: κ(X) and κ(P X) use the relative tolerance ``sqrt(max(T, D)) · eps(dtype of the captured X)`` (float32:
~1e-6), because LayerNorm outputs with zero bias (GPT-2 and BERT at init) lie on the hyperplane ``x · 1 = 0`` and
their last singular value is rounding noise of the model's dtype. κ(J) itself uses the float64 tolerance. Under DeepSpeed ZeRO-3 the attention block's parameters are gathered with
``deepspeed.zero.GatheredParameters`` (only when they carry ``ds_id``); the forward pass and the gathering are
collective, so every rank must call with the same probe (``compute=False`` on the ranks that should skip the
eigenvalue work).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import nn

from ..attention.spectral import forward_weight
from ..parallel import gathered, unwrap_model
from .condition_number import BOUND_NOTES, HeadCondition, head_condition_number

__all__ = [
    "CAUSAL_MODEL_TYPES",
    "ConditionReport",
    "LayerCondition",
    "attention_jacobian_condition_number",
    "capture_attention_inputs",
    "resolve_causal",
]

#: model types treated as causal by rule 3 when neither ``is_causal`` nor ``config.is_decoder`` says so.
CAUSAL_MODEL_TYPES = frozenset(
    {"gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
     "phi", "phi3", "opt", "bloom", "falcon", "olmo", "olmo2", "starcoder2"}
)


def _select(n: int, wanted: Optional[Sequence[int]], what: str) -> list[int]:
    if wanted is None:
        return list(range(n))
    if isinstance(wanted, int):
        wanted = [wanted]
    out = []
    for i in wanted:
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise ValueError(f"{what} {i} out of range: the model has {n} {what}s")
        out.append(j)
    return sorted(set(out))


def _first_param_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def capture_attention_inputs(model: nn.Module, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                             *, layers: Optional[Sequence[int]] = None) -> dict[int, torch.Tensor]:
    """Run ``model`` once on a probe and return the input ``X`` of each attention block of its layout.

    Forward pre-hooks on ``get_layout(model).attention_modules(model)`` record the ``hidden_states`` argument
    (keyword ``hidden_states``, else positional argument 0). The forward runs under ``torch.no_grad()`` in eval mode;
    the previous train/eval mode is restored and the hooks are removed afterwards, even on error.

    Args:
        model (`nn.Module`): a Transformers model whose ``config.model_type`` has a layout.
        input_ids (`torch.Tensor`): ``(B, N)`` probe token ids, or for a vision model a floating-point ``(B, C, H, W)``
            image batch passed as ``pixel_values`` (moved to the model's device).
        attention_mask (`torch.Tensor`, *optional*): ``(B, N)``, 1 = real token.
        layers (`Sequence[int]`, *optional*): layer ordinals to capture (default: all; negative ones count from the end).

    Returns:
        `dict[int, torch.Tensor]`: layer ordinal → detached ``(B, N, D)`` tensor (the model's dtype and device).
    """
    from ..layouts import get_layout

    model = unwrap_model(model)
    blocks = get_layout(model).attention_modules(model)
    wanted = _select(len(blocks), layers, "layer")
    captured: dict[int, torch.Tensor] = {}

    def make_hook(idx):
        def hook(module, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            if x is None:
                raise RuntimeError(f"attention block {idx} was called without hidden_states")
            captured.setdefault(idx, x.detach().clone())

        return hook

    handles = [blocks[i][1].register_forward_pre_hook(make_hook(i), with_kwargs=True) for i in wanted]
    was_training = model.training
    device = _first_param_device(model)
    try:
        model.eval()
        # A floating-point probe is an image batch (B, C, H, W) for a vision model (ViT, DeiT, Swin).
        kwargs = {"pixel_values" if input_ids.is_floating_point() else "input_ids": input_ids.to(device)}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(device)
        with torch.no_grad():
            model(**kwargs)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    missing = [i for i in wanted if i not in captured]
    if missing:
        raise RuntimeError(f"attention blocks {missing} were not called during the forward pass")
    return {i: captured[i] for i in wanted}


def resolve_causal(model: nn.Module, block: nn.Module, layout=None) -> bool:
    """Whether attention block ``block`` of ``model`` is causal (rules in the module docstring)."""
    model = unwrap_model(model)
    candidates = []
    if layout is not None:
        candidates.append(layout.core_module(block))
    candidates.append(block)
    for m in candidates:
        value = getattr(m, "is_causal", None)
        if isinstance(value, bool):
            return value
    config = model.config
    if getattr(config, "is_decoder", False):
        return True
    return getattr(config, "model_type", None) in CAUSAL_MODEL_TYPES


def _f64cpu(t):
    return None if t is None else t.detach().to("cpu", torch.float64).clone()


@dataclass
class LayerCondition:
    """Per-layer result: ``heads[i]`` is the :class:`HeadCondition` of query head ``head_ids[i]``.

    ``unmasked`` holds the same heads measured without the causal mask (padding still applied), when requested.
    """

    layer: int
    name: str
    causal: bool
    scaling: float
    head_ids: list[int]
    heads: list[HeadCondition]
    unmasked: Optional[list[HeadCondition]] = None

    @staticmethod
    def _agg(values, fn):
        vals = [v for v in values if not math.isnan(v)]
        return fn(vals) if vals else float("nan")

    @property
    def mean(self) -> float:
        return self._agg([h.kappa for h in self.heads], lambda v: sum(v) / len(v))

    @property
    def max(self) -> float:
        return self._agg([h.kappa for h in self.heads], max)

    def mean_of(self, attr: str, heads=None) -> float:
        return self._agg([getattr(h, attr) for h in (heads or self.heads)], lambda v: sum(v) / len(v))

    @property
    def upper_bound(self) -> float:
        """Mean over heads of the proven ``upper_bound`` (≥ :attr:`mean`); ``nan`` when some head's does not apply."""
        values = [h.upper_bound for h in self.heads]
        return float("nan") if not values or any(map(math.isnan, values)) else sum(values) / len(values)

    @property
    def n_saturated(self) -> int:
        return sum(h.saturated for h in self.heads)

    @property
    def n_lower_bound(self) -> int:
        """Heads whose κ is only a lower bound (saturated even after the svd refinement)."""
        return sum(h.kappa_is_lower_bound for h in self.heads)

    def to_dict(self) -> dict:
        out = {
            "layer": self.layer, "name": self.name, "causal": self.causal, "scaling": self.scaling,
            "mean": self.mean, "max": self.max, "bound": self.mean_of("bound"), "upper_bound": self.upper_bound,
            "kappa_px": self.mean_of("kappa_px"), "kappa_p": self.mean_of("kappa_p"),
            "n_saturated": self.n_saturated, "n_lower_bound": self.n_lower_bound,
            "heads": [{"head": h, **hc.to_dict()} for h, hc in zip(self.head_ids, self.heads)],
        }
        if self.unmasked is not None:
            um = [hc.kappa for hc in self.unmasked]
            out["unmasked_mean"] = self._agg(um, lambda v: sum(v) / len(v))
            out["unmasked_max"] = self._agg(um, max)
            out["unmasked_heads"] = [{"head": h, **hc.to_dict()} for h, hc in zip(self.head_ids, self.unmasked)]
        return out


@dataclass
class ConditionReport:
    """Result of :func:`attention_jacobian_condition_number`: one :class:`LayerCondition` per measured layer."""

    layers: list[LayerCondition]
    method: str
    probe_shape: tuple
    seconds: float
    rtol: Optional[float] = None
    model_type: Optional[str] = None
    extra: dict = field(default_factory=dict)

    def to_log_dict(self, prefix: str = "kappa") -> dict[str, float]:
        """Flat float metrics for ``trainer.log`` / ``report_to``.

        Keys, per measured layer ``i``: ``{prefix}/layer_{i}/mean`` and ``/max`` (κ over heads), ``/bound`` (mean over
        heads of the papers' surrogate, not an upper bound), ``/kappa_px`` and ``/kappa_p`` (means over heads),
        ``/n_saturated``, ``/n_lower_bound`` (heads whose κ is only a lower bound: the mean and max then are lower
        bounds too); with ``include_unmasked``: ``/unmasked_mean`` and ``/unmasked_max``. Overall: ``{prefix}/mean`` (mean of the layer
        means), ``{prefix}/max`` (max over all heads) and ``{prefix}/seconds`` (cost of the measurement).
        """
        out: dict[str, float] = {}
        for lc in self.layers:
            d = lc.to_dict()
            base = f"{prefix}/layer_{lc.layer}"
            for key in ("mean", "max", "bound", "kappa_px", "kappa_p", "n_saturated", "n_lower_bound", "unmasked_mean",
                        "unmasked_max"):
                if key in d:
                    out[f"{base}/{key}"] = float(d[key])
        means = [lc.mean for lc in self.layers if not math.isnan(lc.mean)]
        maxes = [lc.max for lc in self.layers if not math.isnan(lc.max)]
        out[f"{prefix}/mean"] = sum(means) / len(means) if means else float("nan")
        out[f"{prefix}/max"] = max(maxes) if maxes else float("nan")
        out[f"{prefix}/seconds"] = float(self.seconds)
        return out

    def __repr__(self) -> str:
        """A per-layer table (``print(report)``): heads measured, κ mean / max over heads, the mean proven upper
        bound (``κ ≤``; ``n/a`` where it does not apply), the mean papers' surrogate (not a bound), mean κ(P) and
        κ(PX), and the heads whose κ is only a lower bound; a value marked ``≥`` is a lower bound. Notes under the
        table say what the two bounds are (``hf_condinit.diagnostics.condition_number``). The full per-head data:
        :meth:`to_dict`."""

        def num(value: float, lower_bound: bool = False) -> str:
            text = "nan" if math.isnan(value) else f"{value:.4g}"
            return ("≥" if lower_bound and not math.isnan(value) else "") + text

        header = ("layer", "heads", "κ mean", "κ max", "κ ≤", "surrogate", "κ(P)", "κ(PX)", "lower bounds")
        rows = [header]
        for lc in self.layers:
            bounded = lc.n_lower_bound > 0
            upper = "n/a" if math.isnan(lc.upper_bound) else num(lc.upper_bound)
            rows.append((str(lc.layer), str(len(lc.heads)), num(lc.mean, bounded), num(lc.max, bounded), upper,
                         num(lc.mean_of("bound")), num(lc.mean_of("kappa_p")), num(lc.mean_of("kappa_px")),
                         str(lc.n_lower_bound)))
        overall = self.to_log_dict()
        any_bounded = any(lc.n_lower_bound for lc in self.layers)
        rows.append(("all", str(sum(len(lc.heads) for lc in self.layers)), num(overall["kappa/mean"], any_bounded),
                     num(overall["kappa/max"], any_bounded), "", "", "", "",
                     str(sum(lc.n_lower_bound for lc in self.layers))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [f"ConditionReport({self.model_type or 'model'}, method={self.method!r}, probe {tuple(self.probe_shape)}, "
                 f"{self.seconds:.2f} s)"]
        lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
        lines += [f"  {line}" for line in BOUND_NOTES]
        if any_bounded:
            lines.append("  ≥: a lower bound (a head's κ hit the float64 resolution; the true value is larger)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-serialisable nested dict (per layer and per head)."""
        return {
            "method": self.method, "rtol": self.rtol, "probe_shape": list(self.probe_shape),
            "seconds": self.seconds, "model_type": self.model_type, **self.extra,
            "layers": [lc.to_dict() for lc in self.layers],
        }


def _check_shared_prefixes(input_ids, attention_mask) -> Optional[tuple[int, int]]:
    """Two probe sequences whose first real token coincide (rows of J then repeat under a causal mask)."""
    ids = input_ids.detach().cpu()
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.detach().cpu().bool()
    firsts = {}
    for b in range(ids.shape[0]):
        real = mask[b].nonzero()
        if real.numel() == 0:
            continue
        key = (int(real[0]), int(ids[b, real[0]]))
        if key in firsts:
            return firsts[key], b
        firsts[key] = b
    return None


def attention_jacobian_condition_number(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    *,
    causal: Optional[bool] = None,
    layers: Optional[Sequence[int]] = None,
    heads: Optional[Sequence[int]] = None,
    method: str = "eig",
    include_unmasked: bool = False,
    rtol: Optional[float] = None,
    compute: bool = True,
    device=None,
) -> Optional[ConditionReport]:
    """κ of the attention Jacobian w.r.t. ``(W_Q, W_K, W_V)`` for every (selected) layer and head of ``model``.

    Args:
        model (`nn.Module`): a Transformers model with a registered layout (``hf_condinit.layouts.get_layout``).
        input_ids (`torch.Tensor`): ``(B, N)`` probe; use sequences whose first tokens differ (under a causal mask
            sequences sharing a prefix repeat rows of J, which is then exactly singular; a warning is emitted).
        attention_mask (`torch.Tensor`, *optional*): ``(B, N)``, 1 = real token; padded tokens are left out.
        causal (`bool`, *optional*): force the mask; ``None`` = the mask the model uses (module docstring rules).
        layers (`Sequence[int]`, *optional*): layer ordinals (default: all).
        heads (`Sequence[int]`, *optional*): query-head indices (default: all). Under GQA query head ``h`` uses KV
            head ``h // (H // H_kv)``.
        method (`str`, *optional*, defaults to ``"eig"``): ``"eig"`` or ``"svd"`` (see ``head_condition_number``).
        include_unmasked (`bool`, *optional*, defaults to `False`): also measure each head without the causal mask.
        rtol (`float`, *optional*): relative eigenvalue tolerance (default per method).
        compute (`bool`, *optional*, defaults to `True`): ``False`` runs only the collective parts (forward and
            ZeRO-3 gathering) and returns ``None``: for the ranks other than 0 under ZeRO-3.
        device (`torch.device` or `str`, *optional*, defaults to CPU): where the (T·d)² eigenproblems run (float64);
            ``"model"`` = the model's device (e.g. its GPU).

    Returns:
        :class:`ConditionReport` (or ``None`` with ``compute=False``).
    """
    from ..layouts import get_layout

    t0 = time.perf_counter()
    model = unwrap_model(model)
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    layer_ids = _select(len(blocks), layers, "layer")
    X_by_layer = capture_attention_inputs(model, input_ids, attention_mask, layers=layer_ids)
    kpm = None if attention_mask is None else attention_mask.detach().cpu().bool()
    if device == "model":
        device = _first_param_device(model)

    work = []
    for i in layer_ids:
        name, block = blocks[i]
        with gathered(block.parameters(), modifier_rank=None):
            g = layout.geometry(block, model.config)
            projs = layout.projections(block, g)
            if not compute:
                continue
            group = g.n_heads // g.n_kv_heads
            head_ids = _select(g.n_heads, heads, "head")
            core = layout.core_module(block)
            w = {r: [_f64cpu(t) for t in projs[r].heads(forward_weight(core, projs[r].module))]
                 for r in ("q", "k", "v")}
            b = {r: ([_f64cpu(t) for t in projs[r].bias_heads(projs[r].bias)] if projs[r].bias is not None else None)
                 for r in ("q", "k", "v")}
        scaling = float(getattr(core, "scaling", getattr(block, "scaling", g.head_dim ** -0.5)))
        is_causal = resolve_causal(model, block, layout) if causal is None else bool(causal)
        per_head = []
        for h in head_ids:
            kv = h // group
            per_head.append(((w["q"][h], w["k"][kv], w["v"][kv]),
                             tuple(None if b[r] is None else b[r][h if r == "q" else kv] for r in ("q", "k", "v"))))
        work.append((i, name, is_causal, scaling, head_ids, per_head))
    if not compute:
        return None

    if any(item[2] for item in work):
        shared = _check_shared_prefixes(input_ids, attention_mask)
        if shared is not None:
            warnings.warn(
                f"probe sequences {shared[0]} and {shared[1]} start with the same token at the same position: under a "
                "causal mask their outputs coincide there, J is exactly rank-deficient and every layer reports "
                "'saturated'. Use probe sequences with distinct first tokens.",
                stacklevel=2,
            )

    results = []
    for i, name, is_causal, scaling, head_ids, per_head in work:
        X = X_by_layer[i].detach().to("cpu", torch.float64)
        src_dtype = X_by_layer[i].dtype
        x_rtol = None
        if src_dtype != torch.float64 and src_dtype.is_floating_point:
            x_rtol = math.sqrt(max(X.shape[-2] * X.shape[0], X.shape[-1])) * torch.finfo(src_dtype).eps
        hcs, ums = [], [] if include_unmasked else None
        for (wq, wk, wv), (bq, bk, bv) in per_head:
            kw = dict(scaling=scaling, key_padding_mask=kpm, method=method, rtol=rtol, x_rtol=x_rtol, device=device)
            hcs.append(head_condition_number(X, wq, wk, wv, bq, bk, bv, causal=is_causal, **kw))
            if include_unmasked:  # a bidirectional layer is already unmasked
                ums.append(head_condition_number(X, wq, wk, wv, bq, bk, bv, causal=False, **kw) if is_causal
                           else hcs[-1])
        results.append(LayerCondition(layer=i, name=name, causal=is_causal, scaling=scaling, head_ids=head_ids,
                                      heads=hcs, unmasked=ums))
    return ConditionReport(layers=results, method=method, probe_shape=tuple(input_ids.shape),
                           seconds=time.perf_counter() - t0, rtol=rtol,
                           model_type=getattr(model.config, "model_type", None))
