"""The layout proof: writing through a layout's head views changes exactly that head, as the model itself sees it.

For every attention block and every head, a random change is written through the layout's view of

- query head h (key / value head g): the model's own query (key / value) tensor of head h (g), *as the model
  passes it to its attention function*, must change, every other head of that role and every other role must
  stay as they were (up to one positive scale per token shared by all of them: a full-width qk-norm, OLMo-2's,
  rescales the other heads when one head's pre-norm values change);
- W_O's block h: the output projection's output must change by exactly ``out_h · ΔW_O^h``, where ``out_h`` is
  head h's attention output (B, N, d) as the attention function returned it; where the model gates that output
  before W_O (``out_h ⊙ σ(·)``: Qwen3-Next, Qwen3.5, LFM3), ``out_h`` is W_O's input block h instead, which must
  be head h's attention output scaled elementwise into [0, 1];
- for a query projection that also holds the gate (``gate_starts``), gate head h: the attention function's q/k/v
  must stay as they were and only head h's block of W_O's input may change.

The check holds whatever the model does between the projections and the attention function (RoPE, partial
rotary, qk-norm, repeat_kv of GQA/MQA, softcapping, sliding windows). It is independent of the layout code: the
reference is what the model computes, recorded at

- HF's attention interface (``attn_implementation=PROOF_IMPLEMENTATION``, an SDPA wrapper that records
  ``(module, query, key, value, output)``): ``via="interface"``, the hook the attention variants use;
- for models that compute attention inline (BLOOM, MPT, GPT-Neo, DeBERTa-v2, ...), the two batched products of
  the block's forward (``Q·Kᵀ``, then ``P·V``; ``torch.matmul``/``bmm``/``baddbmm``/``@``/SDPA), captured with a
  ``TorchFunctionMode``: ``via="tensor_ops"``.

Writes are undone exactly (the weights are restored from a copy), so a proof on a model leaves it unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .base import AttentionLayout, HeadGeometry, LayoutError

__all__ = ["PROOF_IMPLEMENTATION", "AttentionCall", "LayoutProof", "record_attention", "prove_layout"]

PROOF_IMPLEMENTATION = "condinit_proof"

# kwargs of an attention call that change the attention's math beyond q, k, v and the mask: the variants do not
# implement them (HF's SDPA path ignores some of them too), so a family passing one cannot take a variant.
MATH_KWARGS = ("softcap", "s_aux", "sinks", "position_bias", "attention_bias", "alibi", "logit_softcapping")


@dataclass
class AttentionCall:
    """One call of the attention function: tensors (B, heads, N, d); ``output`` (B, H, N, d)."""

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor
    via: str
    extra: tuple[str, ...] = ()  # names of MATH_KWARGS passed with a value


_ACTIVE: list[dict] = []  # recording contexts (innermost last)


def _recording_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention function (softcapping, sinks, ... included), or SDPA; records the call."""
    import sys

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    out, weights = (eager or sdpa_attention_forward)(module, query, key, value, attention_mask, **kwargs)
    if _ACTIVE:
        extra = tuple(k for k in MATH_KWARGS if kwargs.get(k) is not None)
        _ACTIVE[-1]["interface"].append(
            AttentionCall(module, query.detach(), key.detach(), value.detach(),
                          out.detach().transpose(1, 2), "interface", extra)
        )
    return out, weights


def register_proof_implementation() -> None:
    """Register `PROOF_IMPLEMENTATION` with HF's attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    if AttentionInterface._global_mapping.get(PROOF_IMPLEMENTATION) is not _recording_attention:
        AttentionInterface.register(PROOF_IMPLEMENTATION, _recording_attention)
        AttentionMaskInterface.register(PROOF_IMPLEMENTATION, eager_mask)


_BMM_FUNCS = {torch.matmul, torch.bmm, torch.baddbmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
              torch.Tensor.bmm, torch.Tensor.baddbmm}


class _ProductRecorder(TorchFunctionMode):
    """Records the batched matrix products (and SDPA calls) run inside one block's forward."""

    def __init__(self):
        super().__init__()
        self.products: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.sdpa: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.sdpa.append((args[0].detach(), args[1].detach(), args[2].detach(), out.detach()))
        elif func in _BMM_FUNCS:
            if func in (torch.baddbmm, torch.Tensor.baddbmm):
                a = kwargs.get("batch1", args[1] if len(args) > 1 else None)
                b = kwargs.get("batch2", args[2] if len(args) > 2 else None)
            else:
                a, b = args[0], args[1]
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.ndim >= 3 and b.ndim >= 3:
                self.products.append((a.detach(), b.detach(), out.detach()))
        return out


def _as_heads(t: torch.Tensor, batch: int) -> torch.Tensor:
    """(…, N, d) with the leading axes holding batch × heads → (B, heads, N, d)."""
    return t.reshape(batch, -1, t.shape[-2], t.shape[-1])


def _call_from_products(module: nn.Module, rec: _ProductRecorder, batch: int) -> AttentionCall | None:
    if rec.sdpa:
        q, k, v, out = rec.sdpa[0]
        return AttentionCall(module, _as_heads(q, batch), _as_heads(k, batch), _as_heads(v, batch),
                             _as_heads(out, batch), "tensor_ops")
    if len(rec.products) < 2:
        return None
    (q, kt, _), (_, v, out) = rec.products[0], rec.products[1]
    return AttentionCall(module, _as_heads(q, batch), _as_heads(kt.transpose(-1, -2), batch), _as_heads(v, batch),
                         _as_heads(out, batch), "tensor_ops")


@contextlib.contextmanager
def using_attn_implementation(model: nn.Module, name: str):
    """Switch ``model`` to attention implementation ``name`` (if it accepts it) and restore the previous one."""
    configs = []
    for m in model.modules():
        for c in _all_configs(getattr(m, "config", None)):
            if not any(c is o for o in configs):
                configs.append(c)
    before = [c.__dict__.get("_attn_implementation_internal", None) for c in configs]
    try:
        model.set_attn_implementation(name)
    except Exception:  # the model refuses a custom implementation: recorded from tensor products only
        pass
    try:
        yield
    finally:
        for c, value in zip(configs, before):
            c.__dict__["_attn_implementation_internal"] = value


def _all_configs(config) -> list:
    out, stack = [], [config]
    while stack:
        c = stack.pop()
        if c is None or any(c is o for o in out):
            continue
        out.append(c)
        if not hasattr(c, "_attn_implementation_internal"):
            out.pop()
            continue
        for key in getattr(c, "sub_configs", {}) or {}:
            stack.append(getattr(c, key, None))
    return out


@dataclass
class Recording:
    """One forward, per block: the attention ``calls``, the block's float tensor ``inputs`` (None where not found)
    and the ``o_outputs`` (and ``o_inputs``) of its output projection, each in call order."""

    calls: list[list[AttentionCall]]
    inputs: list[list[tuple[dict, dict] | None]]
    o_outputs: list[list[torch.Tensor]]
    o_inputs: list[list[torch.Tensor]] = field(default_factory=list)


def _float_inputs(args: tuple, kwargs: dict):
    """The floating-point tensor arguments of a block call (hidden states, encoder states for cross-attention), as
    ({position: tensor}, {name: tensor}), or None when the call has no hidden-state input."""
    pos = {k: a.detach() for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()}
    named = {k: v.detach() for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if 0 not in pos and "hidden_states" not in named:
        return None
    return pos, named


def record_attention(model: nn.Module, blocks: list[nn.Module], inputs: dict, *, products: bool = True,
                     o_modules: list[nn.Module] | None = None,
                     pinned: list[list[tuple[dict, dict]]] | None = None) -> Recording:
    """Run ``model(**inputs)`` and record, per block, the attention calls made inside it (in call order).

    A call goes to the block whose forward it ran in (the innermost one); calls made at HF's attention interface
    are preferred, the block's batched products (``products=True``) are the fallback for blocks that never call the
    interface. ``pinned``: per block and call, the float tensor inputs to substitute for the block's own (so a block
    sees the same inputs, encoder states included, whatever the earlier blocks compute).
    """
    batch = next(v for v in inputs.values() if isinstance(v, torch.Tensor)).shape[0]
    state = {"interface": []}
    rec = Recording([[] for _ in blocks], [[] for _ in blocks], [[] for _ in blocks], [[] for _ in blocks])
    stack: list[tuple[int, _ProductRecorder | None, int]] = []
    handles = []

    def pre(i):
        def hook(module, args, kwargs):
            n = len(rec.inputs[i])
            rec.inputs[i].append(_float_inputs(args, kwargs))
            result = None
            if pinned is not None:
                pos, named = pinned[i][n]
                args = tuple(pos.get(k, a) for k, a in enumerate(args))
                result = (args, {**kwargs, **named})
            products_rec = _ProductRecorder() if products else None
            if products_rec is not None:
                products_rec.__enter__()
            stack.append((i, products_rec, len(state["interface"])))
            return result
        return hook

    def post(i):
        def hook(module, args, kwargs, output):
            j, products_rec, first = stack.pop()
            if products_rec is not None:
                products_rec.__exit__(None, None, None)
            calls = state["interface"][first:]
            del state["interface"][first:]
            if calls:
                rec.calls[j].extend(calls)
            elif products_rec is not None:
                call = _call_from_products(module, products_rec, batch)
                if call is not None:
                    rec.calls[j].append(call)
        return hook

    def o_hook(i):
        def hook(module, args, output):
            rec.o_outputs[i].append(output.detach())
            rec.o_inputs[i].append(args[0].detach())
        return hook

    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(pre(i), with_kwargs=True))
        handles.append(block.register_forward_hook(post(i), with_kwargs=True))
        if o_modules is not None:
            handles.append(o_modules[i].register_forward_hook(o_hook(i)))
    _ACTIVE.append(state)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        _ACTIVE.pop()
        for h in handles:
            h.remove()
        while stack:  # a forward that raised
            products_rec = stack.pop()[1]
            if products_rec is not None:
                products_rec.__exit__(None, None, None)
    return rec


@dataclass
class LayoutProof:
    """What the proof established for one model: ``via`` (``"interface"`` / ``"tensor_ops"``), ``core`` (path of
    the module that calls the attention function, relative to the block; None for tensor_ops), ``extra`` (math
    kwargs passed to the attention function) and ``n_blocks``."""

    via: str
    core: str | None
    extra: tuple[str, ...] = ()
    n_blocks: int = 0
    geometries: list[HeadGeometry] = field(default_factory=list)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and bool(((a - b).abs() <= tol * (1.0 + b.abs())).all())


def _same_up_to_token_scale(new: torch.Tensor, old: torch.Tensor, tol: float) -> bool:
    """``new == s·old`` with one positive scale per (batch, token) shared by every head/coordinate given.

    Tensors (B, heads, N, d); an empty heads axis is trivially equal."""
    if new.shape != old.shape:
        return False
    if new.numel() == 0 or _close(new, old, tol):
        return True
    num = (new * old).sum(dim=(1, 3), keepdim=True)
    den = (old * old).sum(dim=(1, 3), keepdim=True).clamp_min(1e-30)
    scale = num / den
    return bool((scale > 0).all()) and _close(new, scale * old, 10 * tol)


def _changed(new: torch.Tensor, old: torch.Tensor, tol: float) -> bool:
    return new.shape == old.shape and bool(((new - old).abs() > 100 * tol * (1.0 + old.abs())).any())


def _role_tensor(call: AttentionCall, role: str) -> torch.Tensor:
    return {"q": call.query, "k": call.key, "v": call.value}[role]


def _fail(model, i, message):
    raise LayoutError(f"layout proof failed on {type(model).__name__} attention block {i}: {message}")


def prove_layout(model: nn.Module, layout: AttentionLayout, inputs: dict, *, seed: int = 0,
                 tol: float = 1e-5) -> LayoutProof:
    """Prove ``layout`` on ``model`` (a small model: one forward per head and role); raise `LayoutError` if wrong.

    ``model`` must be in eval mode with float32 weights; ``inputs`` are its forward kwargs (batch first). When every
    block's hidden-state input can be found, each block's input is pinned to its unperturbed value and one head is
    written in every block at once (one forward per head and role for the whole model); otherwise block by block.
    """
    register_proof_implementation()
    named = layout.attention_modules(model)
    if not named:
        raise LayoutError(f"layout {layout.name!r} finds no attention block in {type(model).__name__}.")
    blocks = [m for _, m in named]
    gen = torch.Generator().manual_seed(seed)
    with using_attn_implementation(model, PROOF_IMPLEMENTATION):
        base = record_attention(model, blocks, inputs)
        via, cores, extra, geometries, projs = set(), set(), set(), [], []
        for i, block in enumerate(blocks):
            if not base.calls[i]:
                _fail(model, i, "the block never ran an attention function (no call at HF's attention interface "
                                "and no Q·Kᵀ / P·V products in its forward).")
            for call in base.calls[i]:
                via.add(call.via)
                extra.update(call.extra)
                if call.via == "interface":
                    cores.add(next((n for n, m in block.named_modules() if m is call.module), None))
            g = layout.geometry(block, model.config)
            geometries.append(g)
            projs.append(layout.projections(block, g))
            _check_head_counts(model, i, g, base.calls[i])
        products = via != {"interface"}
        o_modules = [p["o"].module for p in projs]
        base = record_attention(model, blocks, inputs, products=products, o_modules=o_modules)
        pin = all(x is not None for xs in base.inputs for x in xs)
        groups = [list(range(len(blocks)))] if pin else [[i] for i in range(len(blocks))]
        gated = any(p["q"].gate_starts for p in projs)
        for group in groups:
            for role in ("q", "k", "v", "o") + (("gate",) if gated else ()):
                proj_of = {i: projs[i]["q" if role == "gate" else role] for i in group}
                for h in range(max(proj_of[i].n_heads for i in group)):
                    todo = [i for i in group if h < proj_of[i].n_heads]
                    with _perturbed([proj_of[i] for i in todo], h, gen, gate=role == "gate") as deltas:
                        new = record_attention(model, blocks, inputs, products=products, o_modules=o_modules,
                                               pinned=base.inputs if pin else None)
                    for i, delta in zip(todo, deltas):
                        _check_block(model, i, role, h, geometries[i], base, new, delta, tol,
                                     o_starts=projs[i]["o"].starts)
    core = cores.pop() if len(cores) == 1 and via == {"interface"} else None
    return LayoutProof(via="interface" if via == {"interface"} else "tensor_ops", core=core,
                       extra=tuple(sorted(extra)), n_blocks=len(blocks), geometries=geometries)


def _check_head_counts(model, i, g: HeadGeometry, calls: list[AttentionCall]) -> None:
    for call in calls:
        if call.query.shape[1] != g.n_heads:
            _fail(model, i, f"the model passes {call.query.shape[1]} query heads, the layout has {g.n_heads}.")
        if call.key.shape[1] not in (g.n_kv_heads, g.n_heads) or call.value.shape[1] != call.key.shape[1]:
            _fail(model, i, f"the model passes {call.key.shape[1]} key/value heads, the layout has {g.n_kv_heads}.")


def _check_block(model, i, role, h, g: HeadGeometry, base: Recording, new: Recording, delta, tol, *,
                 o_starts: tuple[int, ...] | None = None) -> None:
    old_calls, new_calls = base.calls[i], new.calls[i]
    if len(new_calls) != len(old_calls):
        _fail(model, i, "the number of attention calls changed with the weights.")
    if role in ("q", "k", "v"):
        for old, call in zip(old_calls, new_calls):
            _check_head_change(model, i, role, h, g, old, call, tol)
        return
    before, after = base.o_outputs[i], new.o_outputs[i]
    if len(before) != len(old_calls) or len(after) != len(new_calls):
        _fail(model, i, f"the output projection ran {len(after)} times for {len(new_calls)} attention calls.")
    d = g.head_dim
    start = o_starts[h] if o_starts is not None else h * d

    def o_input_head(rec: Recording, k: int, head_start: int) -> torch.Tensor:  # (B, N, d)
        return rec.o_inputs[i][k][..., head_start:head_start + d]

    if role == "gate":
        for old, call in zip(old_calls, new_calls):
            for r in ("q", "k", "v"):
                if not _same_up_to_token_scale(_role_tensor(call, r), _role_tensor(old, r), tol):
                    _fail(model, i, f"writing gate head {h} through the layout changes the model's {r}.")
        for k in range(len(new_calls)):
            heads = [o_starts[j] if o_starts is not None else j * d for j in range(g.n_heads)]
            for j, js in enumerate(heads):
                moved = _changed(o_input_head(new, k, js), o_input_head(base, k, js), tol)
                if moved != (j == h):
                    _fail(model, i, f"writing gate head {h} through the layout does not gate exactly head {h}'s "
                                    "output (wrong gate order or offsets).")
        return
    for k, (call, a, b) in enumerate(zip(new_calls, before, after)):
        out_h = call.output[:, h]
        in_h = o_input_head(base, k, start)
        if not _close(in_h, out_h, tol):  # an output gate between the attention and W_O
            gate_ok = (in_h * out_h >= -tol) & (in_h.abs() <= out_h.abs() * (1 + tol) + tol)
            if in_h.shape != out_h.shape or not bool(gate_ok.all()):
                _fail(model, i, f"W_O's input block {h} is not head {h}'s attention output times a gate in [0, 1].")
            out_h = in_h
        expected = out_h @ delta.to(call.output.dtype)
        got = b - a
        if got.shape != expected.shape or not _close(got, expected, 100 * tol):
            _fail(model, i, f"writing W_O's block {h} does not add head {h}'s output times that block to the "
                            "output projection (wrong o layout or something between attention and W_O).")


@contextlib.contextmanager
def _perturbed(projs: list, h: int, gen: torch.Generator, gate: bool = False):
    """Add a random (D, d) / (d, D) change to head ``h``'s view (its gate's view with ``gate``) of each projection's
    weight; yield the changes; restore the weights exactly."""
    saved = {id(p.weight): (p.weight, p.weight.detach().clone()) for p in projs}
    deltas = []
    with torch.no_grad():
        for proj in projs:
            view = (proj.gate_heads if gate else proj.heads)(proj.weight)[h]
            delta = torch.randn(view.shape, generator=gen, dtype=torch.float32).to(view)
            view.add_(delta)
            deltas.append(delta)
    try:
        yield deltas
    finally:
        with torch.no_grad():
            for weight, copy in saved.values():
                weight.copy_(copy)


def _check_head_change(model, i, role, h, g: HeadGeometry, old: AttentionCall, new: AttentionCall, tol) -> None:
    n_rec = _role_tensor(old, role).shape[1]
    if role == "q" or n_rec == g.n_kv_heads:
        touched = [h]
    else:  # key/value heads repeated to H before the attention function (repeat_kv)
        group = g.n_heads // g.n_kv_heads
        touched = list(range(h * group, (h + 1) * group))
    for r in ("q", "k", "v"):
        a, b = _role_tensor(old, r), _role_tensor(new, r)
        if r == role:
            others = [j for j in range(a.shape[1]) if j not in touched]
            if not all(_changed(b[:, j], a[:, j], tol) for j in touched):
                _fail(model, i, f"writing {role} head {h} through the layout does not change the model's {role} "
                                f"head {h} (wrong head order, offsets or module).")
            if not _same_up_to_token_scale(b[:, others], a[:, others], tol):
                _fail(model, i, f"writing {role} head {h} through the layout changes other {role} heads.")
        elif not _same_up_to_token_scale(b, a, tol):
            _fail(model, i, f"writing {role} head {h} through the layout changes the model's {r}.")
