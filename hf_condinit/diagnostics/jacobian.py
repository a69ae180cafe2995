"""The attention Jacobian with respect to the query, key and value weights, and its Gram matrix in closed form.

Pure tensor functions: no model, layout or Trainer knowledge. The condition number of this Jacobian, with its side
quantities and bounds, is in :mod:`.condition_number` (docs/methods.md §6), built on the closed form below.

Notation (the papers' row-vector convention). One head, one sequence::

    X ∈ R^{N×D}                      the attention input (the normalised hidden state that feeds q/k/v)
    Q = X W_Q + b_Q,  K = X W_K + b_K,  V = X W_V + b_V      W_* ∈ R^{D×d}  (math orientation)
    S = scaling · Q Kᵀ + mask,  P = softmax_rows(S),  A = P V ∈ R^{N×d}
    J = ∂ vec(A) / ∂ (vec W_Q, vec W_K, vec W_V)              (X and the biases are held fixed)

**vec convention** (column-major, the standard one of Kronecker identities): ``vec(M)`` stacks the columns of
``M``, so entry ``M[r, c]`` of an ``R×C`` matrix sits at ``c·R + r``. Hence ``∂vec(A)/∂vec(W_V) = I_d ⊗ (P X)``
exactly. For a batch of probe sequences ``X ∈ R^{B×N×D}`` the rows of J stack over the sequences
(sequence-major): sequence ``b`` contributes ``vec(A_b[valid queries])``, so its rows are at
``offset_b + j·N_b + n``. Columns are ``[vec W_Q | vec W_K | vec W_V]``, column ``i·D + a`` of a block being entry
``W[a, i]``.

Closed form (used by :func:`attention_head_gram`, checked against autograd in the tests). With ``Λ(p) =
Diag(p) − p pᵀ`` the Jacobian of a softmax row, write for query token ``t``
``C_t = Λ(p_t) V`` (so ``C_t[l, j] = P[t, l] (V[l, j] − A[t, j])``), ``M_t = Kᵀ C_t ∈ R^{d×d}`` and
``R_t = Xᵀ C_t ∈ R^{D×d}``. Then, with ``s`` the scaling and tokens ``t, u`` ranging over every valid query of
every probe sequence::

    J_Q[(t,j), (i,a)] = s · X[t,a] · M_t[i,j]          J_Q J_Qᵀ = s² (X Xᵀ)[t,u] · (M_tᵀ M_u)[j,k]
    J_K[(t,j), (i,a)] = s · Q[t,i] · R_t[a,j]          J_K J_Kᵀ = s² (Q Qᵀ)[t,u] · (R_tᵀ R_u)[j,k]
    J_V[(t,j), (i,a)] = δ_ij · (P X)[t,a]              J_V J_Vᵀ = ((P X)(P X)ᵀ)[t,u] · δ_jk

and ``G = J Jᵀ = J_Q J_Qᵀ + J_K J_Kᵀ + J_V J_Vᵀ`` (``(Σ_b N_b d)²``, float64). (Cross-sequence entries of X Xᵀ etc.
are real: every sequence sees the same weights.) The closed form matches
``torch.autograd.functional.jacobian`` to ~1e-15 and avoids materialising J, whose width ``3·D·d`` is ~12× its
height for the default probe on a 256-wide model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "attention_head_gram",
    "attention_head_jacobian",
    "attention_head_output",
    "attention_probabilities",
]

_F64 = torch.float64


# ----------------------------------------------------------------------------------------------------------------
# preparation and forward
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    X: torch.Tensor  # (B, N, D) float64
    allowed: torch.Tensor  # (B, N, N) bool, query x key
    query_valid: torch.Tensor  # (B, N) bool
    key_valid: torch.Tensor  # (B, N) bool
    batched: bool


def _prepare(X, causal, key_padding_mask, attn_mask) -> _Prepared:
    if X.dim() not in (2, 3):
        raise ValueError(f"X must be (N, D) or (B, N, D), got shape {tuple(X.shape)}")
    batched = X.dim() == 3
    X = X.detach().to(device="cpu", dtype=_F64)
    if not batched:
        X = X.unsqueeze(0)
    B, N, _ = X.shape
    allowed = torch.ones(B, N, N, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(N, N, dtype=torch.bool).tril()
    if key_padding_mask is not None:
        kpm = torch.as_tensor(key_padding_mask).detach().to("cpu").bool()
        if kpm.dim() == 1:
            kpm = kpm.unsqueeze(0)
        if kpm.shape != (B, N):
            raise ValueError(f"key_padding_mask must be (B, N) = {(B, N)} (or (N,) unbatched), got {tuple(kpm.shape)}")
    else:
        kpm = torch.ones(B, N, dtype=torch.bool)
    allowed &= kpm[:, None, :]
    if attn_mask is not None:
        am = torch.as_tensor(attn_mask).detach().to("cpu")
        if am.dtype != torch.bool:
            raise ValueError("attn_mask must be a bool tensor (True = the query may attend to the key)")
        allowed = allowed & am.expand(B, N, N)
    query_valid = kpm.clone()
    empty = query_valid & ~allowed.any(-1)
    if empty.any():
        b, n = empty.nonzero()[0].tolist()
        raise ValueError(f"valid query {n} of sequence {b} sees no key under the mask; softmax is undefined")
    if int(query_valid.sum()) == 0:
        raise ValueError("the probe has no valid query token")
    return _Prepared(X=X, allowed=allowed, query_valid=query_valid, key_valid=kpm, batched=batched)


def _f64(t):
    return None if t is None else t.detach().to(device="cpu", dtype=_F64)


def _forward(prep: _Prepared, W_q, W_k, W_v, b_q, b_k, b_v, scaling):
    X = prep.X
    W_q, W_k, W_v = _f64(W_q), _f64(W_k), _f64(W_v)
    for name, w in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        if w.dim() != 2 or w.shape[0] != X.shape[-1]:
            raise ValueError(f"{name} must be (D, d) with D = {X.shape[-1]} (math orientation), got {tuple(w.shape)}")
    Q = X @ W_q
    K = X @ W_k
    V = X @ W_v
    if b_q is not None:
        Q = Q + _f64(b_q)
    if b_k is not None:
        K = K + _f64(b_k)
    if b_v is not None:
        V = V + _f64(b_v)
    S = float(scaling) * (Q @ K.transpose(-1, -2))
    S = S.masked_fill(~prep.allowed, float("-inf"))
    P = torch.softmax(S, dim=-1)
    P = torch.nan_to_num(P, nan=0.0)  # invalid (padded) query rows that see nothing; they are dropped anyway
    A = P @ V
    return Q, K, V, P, A, W_q, W_k, W_v


def attention_probabilities(X, W_q, W_k, b_q=None, b_k=None, *, scaling, causal=False, key_padding_mask=None,
                            attn_mask=None) -> torch.Tensor:
    """The attention probabilities ``P = softmax(scaling · Q Kᵀ + mask)`` of one head, float64.

    Args:
        X (`torch.Tensor`): ``(N, D)`` or ``(B, N, D)`` attention input.
        W_q, W_k (`torch.Tensor`): ``(D, d)`` weights in math orientation (``Q = X W_q + b_q``).
        b_q, b_k (`torch.Tensor`, *optional*): ``(d,)`` biases.
        scaling (`float`): logit scale, e.g. ``d ** -0.5``.
        causal (`bool`, *optional*, defaults to `False`): lower-triangular mask.
        key_padding_mask (`torch.Tensor`, *optional*): ``(B, N)`` (or ``(N,)``), 1/True = real token (HF's
            ``attention_mask``). Padded keys are masked; padded queries get a zero row here.
        attn_mask (`torch.Tensor`, *optional*): bool ``(N, N)`` or ``(B, N, N)``, True = may attend; combined by AND.

    Returns:
        `torch.Tensor`: ``(N, N)`` or ``(B, N, N)``.
    """
    prep = _prepare(X, causal, key_padding_mask, attn_mask)
    d = W_q.shape[-1]
    zeros = torch.zeros(prep.X.shape[-1], d, dtype=_F64)
    P = _forward(prep, W_q, W_k, zeros, b_q, b_k, None, scaling)[3]
    return P if prep.batched else P[0]


def attention_head_output(X, W_q, W_k, W_v, b_q=None, b_k=None, b_v=None, *, scaling, causal=False,
                          key_padding_mask=None, attn_mask=None) -> torch.Tensor:
    """The head output ``A = softmax(scaling · Q Kᵀ + mask) V`` in float64 (differentiable in the weights).

    Same arguments as :func:`attention_probabilities`. Rows of padded queries are zero. Unlike the other functions
    of this module it keeps the autograd graph of the weights, so it serves as the brute-force reference.
    """
    prep = _prepare(X, causal, key_padding_mask, attn_mask)
    X64 = prep.X
    Q = X64 @ W_q.to(_F64)
    K = X64 @ W_k.to(_F64)
    V = X64 @ W_v.to(_F64)
    if b_q is not None:
        Q = Q + b_q.to(_F64)
    if b_k is not None:
        K = K + b_k.to(_F64)
    if b_v is not None:
        V = V + b_v.to(_F64)
    S = (float(scaling) * (Q @ K.transpose(-1, -2))).masked_fill(~prep.allowed, float("-inf"))
    P = torch.softmax(S, dim=-1).masked_fill(~prep.query_valid[..., None], 0.0)
    A = P @ V
    return A if prep.batched else A[0]


# ----------------------------------------------------------------------------------------------------------------
# closed-form blocks
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class JacobianBlocks:
    scaling: float
    Xt: torch.Tensor  # (T, D) valid query tokens
    Qt: torch.Tensor  # (T, d)
    Mt: torch.Tensor  # (T, d, d)  M_t = Kᵀ Λ(p_t) V
    Rt: torch.Tensor  # (T, D, d)  R_t = Xᵀ Λ(p_t) V
    PXt: torch.Tensor  # (T, D)
    perm: torch.Tensor  # (T*d,) row order (sequence, j, n) -> index t*d + j of the (t, j) order
    prep: _Prepared
    P: torch.Tensor  # (B, N, N)
    W: tuple  # (W_q, W_k, W_v) float64


def jacobian_blocks(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling, causal, key_padding_mask, attn_mask) -> JacobianBlocks:
    prep = _prepare(X, causal, key_padding_mask, attn_mask)
    Q, K, V, P, A, W_q, W_k, W_v = _forward(prep, W_q, W_k, W_v, b_q, b_k, b_v, scaling)
    X64 = prep.X
    # C[b, n, l, j] = P[b, n, l] (V[b, l, j] - A[b, n, j])  =  (Λ(p_{b,n}) V)[l, j]
    C = P[..., None] * (V[:, None, :, :] - A[:, :, None, :])
    M = torch.einsum("bli,bnlj->bnij", K, C)
    R = torch.einsum("bla,bnlj->bnaj", X64, C)
    PX = P @ X64
    qv = prep.query_valid
    d = W_q.shape[1]
    # row permutation: (t, j) order -> documented (sequence, j, n) order
    tok_index = torch.full(qv.shape, -1, dtype=torch.long)
    tok_index[qv] = torch.arange(int(qv.sum()))
    perm = []
    for b in range(qv.shape[0]):
        ts = tok_index[b][qv[b]]
        perm.append((ts[None, :] * d + torch.arange(d)[:, None]).reshape(-1))
    return JacobianBlocks(scaling=float(scaling), Xt=X64[qv], Qt=Q[qv], Mt=M[qv], Rt=R[qv], PXt=PX[qv],
                   perm=torch.cat(perm), prep=prep, P=P, W=(W_q, W_k, W_v))


def attention_head_jacobian(X, W_q, W_k, W_v, b_q=None, b_k=None, b_v=None, *, scaling, causal=False,
                            key_padding_mask=None, attn_mask=None) -> torch.Tensor:
    """The explicit Jacobian ``J = ∂vec(A)/∂(vec W_Q, vec W_K, vec W_V)`` in closed form, float64.

    Rows and columns follow the module's vec convention (column-major, sequence-major stacking, valid queries only);
    shape ``(Σ_b N_b·d, 3·D·d)``. The last ``D·d`` columns are ``I_d ⊗ (P X)`` for one sequence. Arguments as in
    :func:`.condition_number.head_condition_number`. Materialises J: meant for small probes and tests.
    """
    blk = jacobian_blocks(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling, causal, key_padding_mask, attn_mask)
    T, D = blk.Xt.shape
    d = blk.Qt.shape[1]
    s = blk.scaling
    Jq = s * torch.einsum("ta,tij->tjia", blk.Xt, blk.Mt)
    Jk = s * torch.einsum("ti,taj->tjia", blk.Qt, blk.Rt)
    Jv = torch.einsum("ta,ji->tjia", blk.PXt, torch.eye(d, dtype=_F64))
    J = torch.cat([Jq.reshape(T * d, d * D), Jk.reshape(T * d, d * D), Jv.reshape(T * d, d * D)], dim=1)
    return J[blk.perm]


def gram_from_blocks(blk: JacobianBlocks, permute: bool = True, device=None) -> torch.Tensor:
    T, D = blk.Xt.shape
    d = blk.Qt.shape[1]
    s2 = blk.scaling ** 2
    Xt, Qt, Mt, Rt, PXt = (t.to(device) for t in (blk.Xt, blk.Qt, blk.Mt, blk.Rt, blk.PXt))
    Mf = Mt.transpose(1, 2).reshape(T * d, d)  # row (t, j), col i
    Rf = Rt.transpose(1, 2).reshape(T * d, D)  # row (t, j), col a
    G = (Mf @ Mf.T).view(T, d, T, d)
    G.mul_((s2 * (Xt @ Xt.T))[:, None, :, None])
    RR = (Rf @ Rf.T).view(T, d, T, d)
    RR.mul_((s2 * (Qt @ Qt.T))[:, None, :, None])
    G.add_(RR)
    del RR
    PXPX = PXt @ PXt.T
    idx = torch.arange(d, device=G.device)
    G[:, idx, :, idx] += PXPX  # advanced indexing puts the j axis first: (d, T, T)
    G = G.view(T * d, T * d)
    if not permute:
        return G
    perm = blk.perm.to(G.device)
    return G[perm][:, perm]


def attention_head_gram(X, W_q, W_k, W_v, b_q=None, b_k=None, b_v=None, *, scaling, causal=False,
                        key_padding_mask=None, attn_mask=None) -> torch.Tensor:
    """``G = J Jᵀ`` in closed form (module docstring), float64, rows in the order of :func:`attention_head_jacobian`.

    Arguments as in :func:`.condition_number.head_condition_number`.
    """
    blk = jacobian_blocks(X, W_q, W_k, W_v, b_q, b_k, b_v, scaling, causal, key_padding_mask, attn_mask)
    return gram_from_blocks(blk)

