"""Init schemes, written once against the layout protocol and registered in ``INIT_SCHEMES``.

A scheme is ``fn(projs, geometry, cfg, generator) -> list[str]``: ``projs`` maps ``"q"/"k"/"v"/"o"`` to
`Projection`s of one attention block, ``cfg`` is a `CondInitConfig`, ``generator`` the block's own generator. It
overwrites only what docs/methods.md names and returns the roles it wrote. It runs after the model's own init, so
everything it does not touch keeps the architecture's default (e.g. GPT-2's 0.02/√(2L) residual W_O).

Parameters flagged ``_is_hf_initialized`` (loaded by ``from_pretrained``) are never written: the caller
(`hf_condinit.api.init_attention_block`) drops their roles before calling the scheme.
"""

from __future__ import annotations

import torch

from ..config import CondInitConfig
from ..layouts.base import HeadGeometry, Projection
from ..registry import register_scheme
from .functional import factor_device, mimetic_factors, mimetic_target, rect_identity_, semi_orthogonal_heads_

__all__ = ["default_scheme", "conditioned_scheme", "mimetic_scheme"]


def default_scheme(projs: dict[str, Projection], g: HeadGeometry, cfg: CondInitConfig, generator) -> list[str]:
    """The architecture's own init, which has already run: nothing to write."""
    return []


def conditioned_scheme(projs: dict[str, Projection], g: HeadGeometry, cfg: CondInitConfig, generator) -> list[str]:
    """Conditioned init (docs/methods.md §1).

    Q and K: an independent semi-orthogonal (D, d) block per head (per KV head for K), times ``qk_gain``; draws
    in the order Q heads then K heads. V: ``value_init="block"`` gives KV head j the identity block at rows
    [j·d, (j+1)·d) (mod D), ``"per_head"`` gives every head I_{D×d}; times ``v_gain``. q/k/v biases: zero.
    """
    written, random_views = [], []
    for role in ("q", "k", "v"):
        proj = projs.get(role)
        if proj is None:
            continue
        views = proj.heads(proj.weight)
        if role == "v":
            for j, view in enumerate(views):
                rect_identity_(view, row_offset=j * g.head_dim if cfg.value_init == "block" else 0, gain=cfg.v_gain)
        else:
            random_views += views
        if proj.bias is not None and not getattr(proj.bias, "_is_hf_initialized", False):
            for b in proj.bias_heads(proj.bias):
                b.zero_()
        written.append(role)
    semi_orthogonal_heads_(random_views, generator, gain=cfg.qk_gain)  # Q and K heads: one batched factorisation
    return written


def mimetic_scheme(projs: dict[str, Projection], g: HeadGeometry, cfg: CondInitConfig, generator) -> list[str]:
    """Mimetic init (Trockman & Kolter 2023; docs/methods.md §2).

    Per query head h: A = α1·Z + β1·I, (L, R) = `mimetic_factors` (A, d), W_Q^h = L, W_K^h = Rᵀ, so W_Q^h W_K^hᵀ
    is A's best rank-d approximation. Under GQA a KV head's W_K comes from the first query head of its group as
    above, and every other query head h of the group gets the least-squares W_Q^h = T_h W_K (W_Kᵀ W_K)⁻¹ for its
    own target T_h, so every head carries its β1·I term as far as the shared W_K allows (for the first head that
    formula gives L again). Per layer: A2 = α2·Z + sign·β2·I, (L, R) = `mimetic_factors` (A2, H_kv·d), KV head j:
    W_V^j = L[:, j·d:(j+1)·d]; query head h (group g(h), group size G) gets W_O^h = R[g·d:(g+1)·d] / G, so the
    expanded W_V W_O equals A2's best rank-(H_kv·d) approximation (exactly A2 when H_kv·d ≥ D). When d > D (or
    H_kv·d > D) the factors beyond rank D are zero. Draw order: Z for each query head, then the VO Z, whether
    or not a pair is written; the QK targets of the block are factorised in one batched call (H D×D targets in
    memory), on `factor_device`.
    Biases untouched. Needs all four roles; a block whose Q/K or V/O pair is partly loaded keeps the loaded pair
    and the other is skipped as a whole.
    """
    d, group = g.head_dim, g.n_heads // g.n_kv_heads
    kept = min(d, g.hidden)  # W_K's non-zero columns
    targets = torch.stack([mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist,
                                          generator) for _ in range(g.n_heads)])  # (H, D, D)
    vo_target = mimetic_target(
        g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist, generator
    )
    written = []
    if "q" in projs and "k" in projs:
        targets = targets.to(factor_device(projs["q"].weight, g.hidden))
        first_q, right = mimetic_factors(targets[::group], d)  # each KV group's first head: (H_kv, D, d), (H_kv, d, D)
        w_k = right.mT
        w_q = first_q.repeat_interleave(group, dim=0)
        if group > 1:  # least squares against the shared W_K: min ‖W_Q W_Kᵀ − T_h‖_F (zero where W_K is)
            shared = w_k[..., :kept].repeat_interleave(group, dim=0)  # (H, D, kept)
            fit = torch.linalg.solve(shared.mT @ shared, shared.mT @ targets.mT).mT
            fit[::group] = first_q[..., :kept]
            w_q = torch.cat([fit, w_q[..., kept:]], dim=-1)
        with torch.no_grad():
            for view, w in zip(projs["q"].heads(projs["q"].weight), w_q):
                view.copy_(w)
            for view, w in zip(projs["k"].heads(projs["k"].weight), w_k):
                view.copy_(w)
        written += ["q", "k"]
    if "v" in projs and "o" in projs:
        left, right = mimetic_factors(vo_target.to(factor_device(projs["v"].weight, g.hidden)), g.n_kv_heads * d)
        v_views, o_views = projs["v"].heads(projs["v"].weight), projs["o"].heads(projs["o"].weight)
        with torch.no_grad():
            for j, view in enumerate(v_views):
                view.copy_(left[:, j * d : (j + 1) * d])
            for h, view in enumerate(o_views):
                j = h // group
                view.copy_(right[j * d : (j + 1) * d] / group)
        written += ["v", "o"]
    return written


register_scheme("default", default_scheme)
register_scheme("conditioned", conditioned_scheme)
register_scheme("mimetic", mimetic_scheme)
