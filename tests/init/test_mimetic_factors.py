"""`mimetic_factors`' paths against the exact answer (a float64 SVD), and mimetic init through them.

The requirement: mimetic init is judged by what it is for,
‖A − L R‖_F within 1e-4 relative of the Eckart–Young optimum ‖A − A_r‖_F (A_r the best rank-r truncation, from a
float64 full SVD); with a flat spectrum at the cut the best rank-r product is not unique, so the product itself is
not pinned. Full rank (r ≥ D): L R = A. The draws are unchanged (`mimetic_target` is untouched), and below
`SUBSPACE_MIN_DIM` the CPU weights are bit for bit the original implementation's. The accelerator paths
(`functional._accelerated`) run here on the CPU, patched.
"""

import contextlib
import json
import os


import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig

import hf_condinit
from hf_condinit.init import functional
from hf_condinit.init.functional import SUBSPACE_MIN_DIM, mimetic_factors, mimetic_target
from hf_condinit.layouts import get_layout

SEED_STRIDE = 1_000_003  # documented in hf_condinit.api
TOL = 1e-4


def original_factors(a: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation before: full fp32 SVD, sliced."""
    u, s, vh = torch.linalg.svd(a)
    root = s.sqrt()
    return (u * root)[:, :r], (root[:, None] * vh)[:r]


def eckart_young_excess(a: torch.Tensor, left: torch.Tensor, right: torch.Tensor, rank: int | None = None):
    """‖A − L R‖_F / ‖A − A_r‖_F − 1 per target (r = ``rank``, default L's width; any leading batch dims), float64;
    the optimum from the singular values of a full float64 SVD (Eckart–Young: ‖A − A_r‖_F² = Σ_{i>r} σ_i²)."""
    a = a.double()
    r = left.shape[-1] if rank is None else rank
    optimum = torch.linalg.svdvals(a)[..., r:].square().sum(-1).sqrt()
    return (a - left.double() @ right.double()).norm(dim=(-2, -1)) / optimum - 1


@pytest.fixture
def accelerated(monkeypatch):
    """Run the accelerator paths (batched eigh / float64 Gram) on the CPU, the subspace path from D = 128 on (the
    CPU's full eigensolver is slow at 512), on one thread (see `one_thread`)."""
    monkeypatch.setattr(functional, "_accelerated", lambda device: True)
    monkeypatch.setattr(functional, "SUBSPACE_MIN_DIM", 128)
    with one_thread():
        yield


@contextlib.contextmanager
def one_thread():
    """torch on one thread: on the shared 2-core machine the multi-threaded D = 1280 float64 SVD took 27 s, 1.1 s
    on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# (D, r, α, β, sign, dist): QK targets (β·I added), the VO sign, both distributions, r = D/2 (the path's limit)
TARGETS = [(96, 16, 0.7, 0.7, 1, "uniform"), (96, 48, 0.4, 0.4, -1, "normal"), (160, 32, 0.7, 0.7, 1, "normal")]


@pytest.mark.parametrize("dim,rank,alpha,beta,sign,dist", TARGETS)
def test_subspace_path_matches_exact_truncation(dim, rank, alpha, beta, sign, dist):
    gen = torch.Generator().manual_seed(dim + rank)
    for _ in range(3):
        a = mimetic_target(dim, alpha, beta, sign, dist, gen)
        left, right, precision = functional.top_singular_factors(a, rank)
        assert precision == torch.float32  # well-separated σ_r: the fp32 result was accepted
        assert left.shape == (dim, rank) and right.shape == (rank, dim) and left.dtype == torch.float32
        assert eckart_young_excess(a, left, right) <= TOL
        assert eckart_young_excess(a, *original_factors(a, rank)) <= TOL  # the old path meets it too
        # balanced split: LᵀL = R Rᵀ = Σ_r (the singular values of A, descending)
        sigma = torch.linalg.svdvals(a.double())[:rank]
        torch.testing.assert_close(left.double().T @ left.double(), torch.diag(sigma), atol=1e-5, rtol=0)
        torch.testing.assert_close(right.double() @ right.double().T, torch.diag(sigma), atol=1e-5, rtol=0)


def _near_degenerate(dim: int, rank: int, gen: torch.Generator) -> torch.Tensor:
    """A (dim, dim) fp32 matrix with σ_rank − σ_rank+1 = 1e-6 (0-based: s[rank] = s[rank − 1] − 1e-6)."""
    u, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    s = torch.linspace(2.0, 0.1, dim, dtype=torch.float64)
    s[rank] = s[rank - 1] - 1e-6
    return ((u * s) @ v.T).float()


def test_near_degenerate_split_falls_back_to_float64():
    """σ_r − σ_{r+1} = 1e-6: fp32 cannot tell the two directions apart, the estimate says so, float64 does."""
    dim, rank = 64, 8
    a = _near_degenerate(dim, rank, torch.Generator().manual_seed(0))
    left, right, precision = functional.top_singular_factors(a, rank)
    assert precision == torch.float64
    assert eckart_young_excess(a, left, right) <= TOL


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
    assert eckart_young_excess(a, left, right) <= 1e-5
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
    assert eckart_young_excess(big, left, right) <= TOL
    for got, want in zip(mimetic_factors(big, 320), original_factors(big, 320)):  # 2·r > D: full SVD
        assert torch.equal(got, want)
    # LAPACK's subset solver failing to converge falls back to the full SVD
    def no_convergence(*args, **kwargs):
        raise np.linalg.LinAlgError("did not converge")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(functional, "top_singular_factors", no_convergence)
        for got, want in zip(mimetic_factors(big, 64), original_factors(big, 64)):
            assert torch.equal(got, want)
    # rank above D: zero-padded, L R = A
    a = mimetic_target(12, 0.7, 0.7, 1, "uniform", gen)
    left, right = mimetic_factors(a, 20)
    assert left.shape == (12, 20) and right.shape == (20, 12)
    assert not left[:, 12:].any() and not right[12:].any()
    torch.testing.assert_close(left @ right, a, atol=1e-5, rtol=0)


def low_rank_excess(a: torch.Tensor, left: torch.Tensor, right: torch.Tensor, rank: int) -> float:
    """The criterion for a rank-``rank`` product L R of a (D, D) target: the Eckart–Young excess for rank < D; for
    rank ≥ D (the truncation is A itself, optimum 0) ‖A − L R‖_F / ‖A‖_F."""
    if rank >= a.shape[-1]:
        return float((a.double() - left.double() @ right.double()).norm() / a.double().norm())
    return float(eckart_young_excess(a, left, right, rank))


def check_mimetic_block(block, layout, model_config, ordinal: int, seed: int, heads_checked=None) -> None:
    """One block against targets redrawn from its generator: each KV group's first head's W_Q W_Kᵀ and Σ_h W_V W_O
    meet the Eckart–Young criterion (`low_rank_excess` ≤ TOL); every query head's W_Q W_Kᵀ = T_h Π, Π the projector
    on the shared W_K's column space (the least-squares fit; for a group's first head, the truncation itself).
    ``heads_checked``: the query heads compared (default all), to bound the float64 SVDs' cost."""
    cfg = hf_condinit.CondInitConfig(method="mimetic", seed=seed)
    g = layout.geometry(block, model_config)
    projs = layout.projections(block, g)
    gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
    qk = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
          for _ in range(g.n_heads)]
    vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist, gen)
    heads = {r: [w.detach().double() for w in projs[r].heads(projs[r].weight)] for r in "qkvo"}
    group = g.n_heads // g.n_kv_heads
    for h in range(g.n_heads) if heads_checked is None else heads_checked:
        w_q, w_k = heads["q"][h], heads["k"][h // group]
        if h % group == 0:
            assert low_rank_excess(qk[h], w_q, w_k.T, g.head_dim) <= TOL, (ordinal, h)
        basis = w_k[:, : min(g.head_dim, g.hidden)]
        proj = basis @ torch.linalg.solve(basis.T @ basis, basis.T)
        want = qk[h].double() @ proj
        assert float((w_q @ w_k.T - want).norm() / want.norm()) <= TOL, (ordinal, h)
    w_v = torch.cat([heads["v"][h // group] for h in range(g.n_heads)], dim=1)
    w_o = torch.cat([heads["o"][h] for h in range(g.n_heads)], dim=0)
    # Σ_h W_V^{g(h)} W_O^h = W_V W_O of the expanded (H·d)-wide factors, of rank H_kv·d
    assert low_rank_excess(vo, w_v, w_o, g.n_kv_heads * g.head_dim) <= TOL, ordinal


def _check_mimetic_model(model, seed, n_layers):
    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    assert len(blocks) == n_layers
    for ordinal, (_, block) in enumerate(blocks):
        check_mimetic_block(block, layout, model.config, ordinal, seed)


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


@pytest.mark.parametrize("hidden,heads,kv_heads,head_dim", [
    (128, 8, 2, 16),  # GQA on the batched eigh subspace path (VO rank 32 too)
    (128, 4, 4, 32),  # multi-head: QK on the subspace path, the full-rank VO target on the float64 Gram path
    (64, 4, 4, 8),  # below the subspace path's D: the float64 Gram path for every target
    (32, 2, 1, 48),  # d > D: zero-padded factors
])
def test_mimetic_init_products_accelerated(accelerated, hidden, heads, kv_heads, head_dim):
    """The paths a model built on an accelerator takes (batched eigh of the QK targets, float64 Gram for the rest)."""
    torch.manual_seed(0)
    model = AutoModel.from_config(_llama(hidden, heads, kv_heads, head_dim), condinit={"method": "mimetic", "seed": 4})
    _check_mimetic_model(model, seed=4, n_layers=1)


def test_accelerated_subspace_path_is_batched_and_reruns_only_the_unsplit_target(accelerated):
    """One batched call: three mimetic targets and one with σ_r − σ_{r+1} = 1e-6 (fp32 cannot split it); that one
    reruns in float64, the others keep their fp32 result; all meet the criterion."""
    dim, rank = 128, 16
    gen = torch.Generator().manual_seed(5)
    unsplit = _near_degenerate(dim, rank, gen)
    targets = [mimetic_target(dim, 0.7, 0.7, 1, "uniform", gen) for _ in range(3)]
    batch = torch.stack(targets + [unsplit])
    left, right, precision = functional.top_singular_factors(batch, rank)
    assert precision == torch.float64 and left.shape == (4, dim, rank) and right.shape == (4, rank, dim)
    assert (eckart_young_excess(batch, left, right) <= TOL).all()
    alone, _, alone_precision = functional.top_singular_factors(batch[:3], rank)
    assert alone_precision == torch.float32 and torch.equal(alone, left[:3])
    sigma = torch.linalg.svdvals(batch.double())[..., :rank]  # balanced: LᵀL = Σ_r
    torch.testing.assert_close(left.double().mT @ left.double(), torch.diag_embed(sigma), atol=1e-5, rtol=0)


def test_accelerated_gram_path_and_padding(accelerated):
    gen = torch.Generator().manual_seed(6)
    a = torch.stack([mimetic_target(96, 0.4, 0.4, -1, "normal", gen) for _ in range(2)])
    left, right = mimetic_factors(a, 64)  # 2·r > D
    assert (eckart_young_excess(a, left, right) <= TOL).all()
    left, right = mimetic_factors(a, 120)  # above D: L R = A, zero-padded
    assert left.shape == (2, 96, 120) and not left[..., 96:].any() and not right[:, 96:].any()
    assert float((left.double() @ right.double() - a.double()).norm() / a.double().norm()) <= 1e-6


@pytest.mark.slow
def test_mimetic_criterion_on_a_472m_block():
    """One block of configs/gpt2-472m.json (D = 1280, 20 heads of 64; the model cut to 1 layer and a 64-token
    vocabulary), built on the CPU path: the Eckart–Young criterion on heads 0, 1 and the VO product."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpt2-472m.json")) as f:
        spec = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    config = AutoConfig.for_model(**dict(spec, n_layer=1, vocab_size=64))
    torch.manual_seed(0)
    with one_thread():
        model = AutoModelForCausalLM.from_config(config, condinit={"method": "mimetic", "seed": 2})
        layout = get_layout(model)
        (_, block), = layout.attention_modules(model)
        assert layout.geometry(block, model.config).hidden == 1280
        check_mimetic_block(block, layout, model.config, 0, seed=2, heads_checked=[0, 1])
