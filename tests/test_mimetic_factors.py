"""`mimetic_factors`' two paths against the exact answer (a float64 SVD), and mimetic init through them.

The requirement (issue 19): L R within 1e-4 relative Frobenius error of the target's exact best rank-r
approximation, on the same random targets as before (the draws are unchanged: `mimetic_target` is untouched,
and below `SUBSPACE_MIN_DIM` the weights are bit for bit the original implementation's).
"""

import numpy as np
import pytest
import torch
from transformers import AutoModel, LlamaConfig

import hf_condinit
from hf_condinit.init import functional
from hf_condinit.init.functional import SUBSPACE_MIN_DIM, mimetic_factors, mimetic_target
from hf_condinit.layouts import get_layout

SEED_STRIDE = 1_000_003  # documented in hf_condinit.api
TOL = 1e-4


def exact_truncation(a: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(a.double())
    return (u[:, :r] * s[:r]) @ vh[:r]


def original_factors(a: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation before issue 19: full fp32 SVD, sliced."""
    u, s, vh = torch.linalg.svd(a)
    root = s.sqrt()
    return (u * root)[:, :r], (root[:, None] * vh)[:r]


def rel_err(left, right, want) -> float:
    return float((left.double() @ right.double() - want).norm() / want.norm())


# (D, r, α, β, sign, dist): QK targets (β·I added), the VO sign, both distributions, r = D/2 (the path's limit)
TARGETS = [(96, 16, 0.7, 0.7, 1, "uniform"), (96, 48, 0.4, 0.4, -1, "normal"), (160, 32, 0.7, 0.7, 1, "normal")]


@pytest.mark.parametrize("dim,rank,alpha,beta,sign,dist", TARGETS)
def test_subspace_path_matches_exact_truncation(dim, rank, alpha, beta, sign, dist):
    gen = torch.Generator().manual_seed(dim + rank)
    for _ in range(3):
        a = mimetic_target(dim, alpha, beta, sign, dist, gen)
        left, right, precision = functional._top_singular_factors(a, rank)
        assert precision == torch.float32  # well-separated σ_r: the fp32 result was accepted
        assert left.shape == (dim, rank) and right.shape == (rank, dim) and left.dtype == torch.float32
        want = exact_truncation(a, rank)
        assert rel_err(left, right, want) <= TOL
        assert rel_err(*original_factors(a, rank), want) <= TOL  # the old path meets it too: same result
        # balanced split: LᵀL = R Rᵀ = Σ_r (the singular values of A, descending)
        sigma = torch.linalg.svdvals(a.double())[:rank]
        torch.testing.assert_close(left.double().T @ left.double(), torch.diag(sigma), atol=1e-5, rtol=0)
        torch.testing.assert_close(right.double() @ right.double().T, torch.diag(sigma), atol=1e-5, rtol=0)


def test_near_degenerate_split_falls_back_to_float64():
    """σ_r − σ_{r+1} = 1e-6: fp32 cannot tell the two directions apart, the estimate says so, float64 does."""
    dim, rank = 64, 8
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    s = torch.linspace(2.0, 0.1, dim, dtype=torch.float64)
    s[rank] = s[rank - 1] - 1e-6
    a = ((u * s) @ v.T).float()
    left, right, precision = functional._top_singular_factors(a, rank)
    assert precision == torch.float64
    assert rel_err(left, right, exact_truncation(a, rank)) <= TOL


def test_full_svd_path_splits_a_near_degenerate_cut_in_float64():
    """Below SUBSPACE_MIN_DIM (the full-SVD path): a relative gap of 5e-4 at the cut (Kosmos-2.5's miniature had
    one) leaves fp32's rank-r product ~1e-4 from the exact truncation; the split estimate sends it to float64."""
    dim, rank = 64, 4
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    s = torch.linspace(3.0, 0.1, dim, dtype=torch.float64)
    s[rank] = s[rank - 1] * (1 - 5e-4)
    a = ((u * s) @ v.T).float()
    assert functional._fp32_split_error(torch.linalg.svdvals(a), rank) > functional.MIMETIC_TOL
    left, right = mimetic_factors(a, rank)
    assert rel_err(left, right, exact_truncation(a, rank)) <= 1e-5
    # a well separated cut keeps fp32 (the original weights, bit for bit)
    s[rank] = s[rank - 1] * 0.5
    b = ((u * s) @ v.T).float()
    assert functional._fp32_split_error(torch.linalg.svdvals(b), rank) < functional.MIMETIC_TOL
    for got, want in zip(mimetic_factors(b, rank), original_factors(b, rank)):
        assert torch.equal(got, want)


def test_dispatch_bit_identity_and_padding():
    gen = torch.Generator().manual_seed(1)
    small = mimetic_target(SUBSPACE_MIN_DIM // 2, 0.7, 0.7, 1, "uniform", gen)
    for got, want in zip(mimetic_factors(small, 16), original_factors(small, 16)):
        assert torch.equal(got, want)  # below SUBSPACE_MIN_DIM: the original implementation, bit for bit
    big = mimetic_target(SUBSPACE_MIN_DIM, 0.7, 0.7, 1, "uniform", gen)
    left, right = mimetic_factors(big, 64)  # the subspace path
    assert rel_err(left, right, exact_truncation(big, 64)) <= TOL
    for got, want in zip(mimetic_factors(big, 320), original_factors(big, 320)):  # 2·r > D: full SVD
        assert torch.equal(got, want)
    # LAPACK's subset solver failing to converge falls back to the full SVD
    def no_convergence(*args, **kwargs):
        raise np.linalg.LinAlgError("did not converge")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(functional, "_top_singular_factors", no_convergence)
        for got, want in zip(mimetic_factors(big, 64), original_factors(big, 64)):
            assert torch.equal(got, want)
    # rank above D: zero-padded, L R = A
    a = mimetic_target(12, 0.7, 0.7, 1, "uniform", gen)
    left, right = mimetic_factors(a, 20)
    assert left.shape == (12, 20) and right.shape == (20, 12)
    assert not left[:, 12:].any() and not right[12:].any()
    torch.testing.assert_close(left @ right, a, atol=1e-5, rtol=0)


def _check_mimetic_model(model, seed, n_layers):
    """Per block, against targets redrawn from the block's generator and a float64 SVD: the group's first head's
    W_Q W_Kᵀ = its target's best rank-d approximation; every head's W_Q W_Kᵀ = T_h Π (Π the projector on the shared
    W_K's column space: the least-squares fit); Σ_h W_V W_O = the VO target's best rank-(H_kv·d) approximation."""
    cfg = hf_condinit.CondInitConfig(method="mimetic", seed=seed)
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    assert len(blocks) == n_layers
    for ordinal, (_, block) in enumerate(blocks):
        g = layout.geometry(block, model.config)
        projs = layout.projections(block, g)
        gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
        qk = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
              for _ in range(g.n_heads)]
        vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist,
                            gen)
        heads = {r: [w.detach().double() for w in projs[r].heads(projs[r].weight)] for r in "qkvo"}
        group = g.n_heads // g.n_kv_heads
        for h in range(g.n_heads):
            if h % group == 0:
                _, _, vh = torch.linalg.svd(qk[h].double())
                proj = vh[: g.head_dim].T @ vh[: g.head_dim]  # the whole space when d ≥ D
            want = qk[h].double() @ proj  # = exact_truncation(qk[h], d) for the first head of each group
            got = heads["q"][h] @ heads["k"][h // group].T
            assert float((got - want).norm() / want.norm()) <= TOL, (ordinal, h)
        got = sum(heads["v"][h // group] @ heads["o"][h] for h in range(g.n_heads))
        want = exact_truncation(vo, g.n_kv_heads * g.head_dim)
        assert float((got - want).norm() / want.norm()) <= TOL, ordinal


def _llama(hidden, heads, kv_heads, head_dim):
    return LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       num_hidden_layers=1, intermediate_size=64, vocab_size=32)


@pytest.mark.parametrize("hidden,heads,kv_heads,head_dim", [
    (SUBSPACE_MIN_DIM, 8, 2, 64),  # GQA on the subspace path: the least-squares heads
    (SUBSPACE_MIN_DIM, 2, 2, 64),  # multi-head, H·d < D: the VO target is truncated on the subspace path too
    (32, 2, 1, 48),  # d > D: zero-padded factors, W_Q W_Kᵀ = the whole target
])
def test_mimetic_init_products(hidden, heads, kv_heads, head_dim):
    torch.manual_seed(0)
    model = AutoModel.from_config(_llama(hidden, heads, kv_heads, head_dim), condinit={"method": "mimetic", "seed": 4})
    _check_mimetic_model(model, seed=4, n_layers=1)
