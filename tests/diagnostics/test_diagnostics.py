"""Tests of the attention-Jacobian diagnostic: pure math (jacobian.py, condition_number.py) and the model-level API
(probes.py)."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from hf_condinit.diagnostics import (
    attention_head_gram,
    attention_head_jacobian,
    attention_head_output,
    attention_jacobian_condition_number,
    attention_probabilities,
    capture_attention_inputs,
    head_condition_number,
    pseudo_condition_number,
    softmax_jacobian_condition_number,
)
from hf_condinit.diagnostics.condition_number import singular_values

F64 = torch.float64
PHI2 = (3 + math.sqrt(5)) / 2  # golden ratio squared


def _rand(*shape, scale=1.0, gen=None):
    return torch.randn(*shape, dtype=F64, generator=gen) * scale


def brute_force_jacobian(X, Wq, Wk, Wv, bq, bk, bv, scaling, causal, kpm):
    """Autograd Jacobian of the head output, rows/cols in the module's vec convention (column-major)."""
    B, N = (X.shape[0], X.shape[1]) if X.dim() == 3 else (1, X.shape[0])
    valid = torch.ones(B, N, dtype=torch.bool) if kpm is None else torch.as_tensor(kpm).bool().reshape(B, N)

    def f(wq, wk, wv):
        A = attention_head_output(X, wq, wk, wv, bq, bk, bv, scaling=scaling, causal=causal, key_padding_mask=kpm)
        A = A.reshape(B, N, -1)
        return torch.cat([A[b][valid[b]].T.reshape(-1) for b in range(B)])  # vec = column-major

    jacs = torch.autograd.functional.jacobian(f, (Wq, Wk, Wv))
    # jac[..., a, i] -> column i*D + a
    return torch.cat([j.permute(0, 2, 1).reshape(j.shape[0], -1) for j in jacs], dim=1)


def _case(seed, B=2, N=5, D=6, d=3, wscale=0.5):
    g = torch.Generator().manual_seed(seed)
    X = _rand(B, N, D, gen=g)
    W = [_rand(D, d, scale=wscale, gen=g) for _ in range(3)]
    b = [_rand(d, scale=0.1, gen=g) for _ in range(3)]
    return X, W, b


PADDING = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]])  # right padding, left padding


@pytest.mark.parametrize("shape", [(40, 300), (300, 40), (50, 60)])
def test_singular_values_through_qr_are_the_matrixs_own(shape):
    """A matrix built from known singular values (1 down to 1e-10, orthonormal factors from QR of random
    matrices): the QR route gives them to float64 rounding of σ_max, in either orientation, and the smallest, 1e-10,
    to 1e-4 relative (an SVD of the explicit matrix resolves no better)."""
    g = torch.Generator().manual_seed(0)
    m, n = shape
    k = min(m, n)
    sigma = torch.logspace(0, -10, k, dtype=F64)
    U = torch.linalg.qr(torch.randn(m, k, dtype=F64, generator=g))[0]
    V = torch.linalg.qr(torch.randn(n, k, dtype=F64, generator=g))[0]
    M = U @ torch.diag(sigma) @ V.T
    got = singular_values(M)
    assert got.shape == (k,)
    assert float((got - sigma).abs().max()) < 1e-14
    assert float(got[-1]) == pytest.approx(1e-10, rel=1e-4)
    torch.testing.assert_close(got, torch.linalg.svdvals(M), rtol=0, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kpm", [None, PADDING], ids=["nopad", "pad"])
def test_closed_form_matches_autograd(causal, kpm):
    X, W, b = _case(0)
    s = 3 ** -0.5
    Jb = brute_force_jacobian(X, *W, *b, s, causal, kpm)
    J = attention_head_jacobian(X, *W, *b, scaling=s, causal=causal, key_padding_mask=kpm)
    G = attention_head_gram(X, *W, *b, scaling=s, causal=causal, key_padding_mask=kpm)
    assert J.shape == Jb.shape
    torch.testing.assert_close(J, Jb, rtol=0, atol=1e-13)
    torch.testing.assert_close(G, Jb @ Jb.T, rtol=0, atol=1e-12)

    sv = torch.linalg.svdvals(Jb)
    kappa_ref = float(sv[0] / sv[-1])  # J is full row rank here
    eig = head_condition_number(X, *W, *b, scaling=s, causal=causal, key_padding_mask=kpm)
    svd = head_condition_number(X, *W, *b, scaling=s, causal=causal, key_padding_mask=kpm, method="svd")
    assert eig.n_rows == Jb.shape[0] and eig.n_cols == Jb.shape[1]
    assert svd.n_below_tol == 0 and not svd.saturated
    assert svd.kappa == pytest.approx(kappa_ref, rel=1e-9)
    if eig.n_below_tol == 0:  # resolvable by eig: agree to what κ² · eps allows
        assert eig.kappa == pytest.approx(kappa_ref, rel=max(1e-8, 1e-14 * kappa_ref**2))
    assert eig.lambda_max == pytest.approx(float(sv[0]) ** 2, rel=1e-12)


def test_closed_form_detects_a_wrong_transpose():
    """The brute force is sensitive to orientation: W_q.T-shaped mistakes must show (guards the test itself)."""
    X, W, b = _case(1, B=1, N=4, D=3, d=3)
    J = attention_head_jacobian(X[0], *W, *b, scaling=0.5)
    Jwrong = brute_force_jacobian(X[0], W[0].T.contiguous(), W[1], W[2], *b, 0.5, False, None)
    assert (J - Jwrong).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_value_block_is_kron_identity_px(causal):
    X, W, b = _case(2, B=2, N=5, D=6, d=3)
    J = attention_head_jacobian(X, *W, *b, scaling=0.5, causal=causal)
    P = attention_probabilities(X, W[0], W[1], b[0], b[1], scaling=0.5, causal=causal)
    D, d, N = 6, 3, 5
    Jv = J[:, 2 * D * d:]
    for bidx in range(2):
        expected = torch.kron(torch.eye(d, dtype=F64), P[bidx] @ X[bidx])
        torch.testing.assert_close(Jv[bidx * N * d:(bidx + 1) * N * d], expected, rtol=0, atol=1e-14)
    # the Kronecker factor order is the column-major one: I_d ⊗ (P X), not (P X) ⊗ I_d
    wrong = torch.kron(P[0] @ X[0], torch.eye(d, dtype=F64))
    assert (Jv[: N * d] - wrong).abs().max() > 1e-3


def test_hand_computed_causal_uniform_attention():
    """W_Q = W_K = 0 → P is the causal average; J = I_d ⊗ (P X). N = 2, orthonormal rows of X: κ(J) = κ(P) = φ²."""
    D, d = 5, 2
    X = torch.linalg.qr(_rand(D, D, gen=torch.Generator().manual_seed(3)))[0][:2]  # (2, D), orthonormal rows
    zeros = torch.zeros(D, d, dtype=F64)
    Wv = torch.linalg.qr(_rand(D, d, gen=torch.Generator().manual_seed(4)))[0]
    for method in ("eig", "svd"):
        hc = head_condition_number(X, zeros, zeros, Wv, scaling=1.0, causal=True, method=method)
        # P = [[1, 0], [1/2, 1/2]]: P Pᵀ has eigenvalues (3 ± √5)/4, so κ(P) = (3 + √5)/2
        assert hc.kappa == pytest.approx(PHI2, rel=1e-12)
        assert hc.kappa_p == pytest.approx(PHI2, rel=1e-12)
        assert hc.kappa_x == pytest.approx(1.0, rel=1e-12)
        assert hc.n_below_tol == 0 and not hc.saturated
        assert hc.lambda_max == pytest.approx((3 + math.sqrt(5)) / 4, rel=1e-12)
    # tiny (not zero) W_Q, W_K: P ≈ causal average, κ → φ²
    eps = 1e-6
    g = torch.Generator().manual_seed(5)
    hc = head_condition_number(X, _rand(D, d, scale=eps, gen=g), _rand(D, d, scale=eps, gen=g), Wv, scaling=1.0,
                               causal=True)
    assert hc.kappa == pytest.approx(PHI2, rel=1e-6)


def test_hand_computed_uniform_bidirectional_is_rank_d():
    """W_Q = W_K = 0 without mask: P = 11ᵀ/N, J = I_d ⊗ 1 x̄ᵀ has d equal singular values: κ = 1, the rest are 0."""
    N, D, d = 4, 6, 2
    X = _rand(N, D, gen=torch.Generator().manual_seed(6))
    zeros = torch.zeros(D, d, dtype=F64)
    hc = head_condition_number(X, zeros, zeros, torch.eye(D, d, dtype=F64), scaling=1.0)
    assert hc.kappa == pytest.approx(1.0, rel=1e-9)
    assert hc.n_below_tol == (N - 1) * d
    assert hc.saturated  # exact rank deficiency is indistinguishable from unresolvable ill-conditioning
    xbar = X.mean(0)
    # J_V = I_d ⊗ (1 x̄ᵀ): σ² = N |x̄|²
    assert hc.lambda_max == pytest.approx(N * float(xbar.norm()) ** 2, rel=1e-12)


def test_uniform_attention_kappa_is_kappa_px_and_below_second_term():
    """Proven case of the bound: W_Q = W_K = 0, causal (P invertible), X full row rank: κ = κ(PX) ≤ κ(P) κ(X)."""
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        N, D, d = 6, 9, 2
        X = _rand(N, D, gen=g)
        zeros = torch.zeros(D, d, dtype=F64)
        hc = head_condition_number(X, zeros, zeros, _rand(D, d, gen=g), scaling=0.3, causal=True, method="svd")
        assert hc.kappa == pytest.approx(hc.kappa_px, rel=1e-9)
        assert hc.kappa <= hc.kappa_p * hc.kappa_x * (1 + 1e-9)


def test_lambda_min_at_least_sigma_min_px_squared():
    """G ⪰ J_V J_Vᵀ = I_d ⊗ (PX)(PX)ᵀ, so λ_min(G) ≥ σ_min(PX)² when PX has full row rank (T ≤ D)."""
    checked = 0
    for seed in range(10):
        X, W, b = _case(10 + seed, B=2, N=3, D=8, d=2, wscale=0.3)
        hc = head_condition_number(X, *W, *b, scaling=0.7, causal=bool(seed % 2), method="svd")
        P = attention_probabilities(X, W[0], W[1], b[0], b[1], scaling=0.7, causal=bool(seed % 2))
        PX = torch.cat([P[i] @ X[i] for i in range(2)])
        sv = torch.linalg.svdvals(PX)
        if sv[-1] < 1e-6 * sv[0]:  # premise (full row rank) fails: a saturated softmax makes P singular
            continue
        checked += 1
        assert hc.n_below_tol == 0
        assert hc.lambda_min >= float(sv[-1]) ** 2 * (1 - 1e-9)
    assert checked >= 8


def test_bound_is_not_a_theorem():
    """The surrogate bound fails on some random probes with more tokens than width (documented in
    condition_number.py)."""
    violations = 0
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        N, D, d = 6, 3, 1
        X = _rand(N, D, scale=5.0, gen=g)
        W = [_rand(D, d, scale=0.03, gen=g) for _ in range(3)]
        hc = head_condition_number(X, *W, scaling=1.0, causal=True, method="svd")
        if not hc.saturated and hc.kappa > 1.5 * hc.bound:
            violations += 1
            break
    assert violations > 0


def test_bound_formula():
    X, W, b = _case(7)
    hc = head_condition_number(X, *W, *b, scaling=0.5, causal=True)
    expected = hc.kappa_x ** 3 * hc.kappa_lambda * hc.kappa_wv * (hc.kappa_wq + hc.kappa_wk) + hc.kappa_x * hc.kappa_p
    assert hc.bound == pytest.approx(expected, rel=1e-12)
    assert hc.kappa_wq == pytest.approx(pseudo_condition_number(W[0]), rel=1e-12)
    on_cpu = head_condition_number(X, *W, *b, scaling=0.5, causal=True, device="cpu")
    assert on_cpu.kappa == pytest.approx(hc.kappa, rel=1e-12)


def test_softmax_jacobian_condition_number_by_hand():
    # p = (1/2, 1/2): Λ = [[1/4, -1/4], [-1/4, 1/4]], non-zero eigenvalue 1/2 only → κ = 1
    assert softmax_jacobian_condition_number(torch.tensor([[0.5, 0.5]], dtype=F64)) == pytest.approx(1.0)
    # pooled over rows: p = (1/2, 1/2) (eigenvalue 1/2) and p = (0.9, 0.1) (eigenvalue 2·0.09 = 0.18)
    P = torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=F64)
    assert softmax_jacobian_condition_number(P) == pytest.approx(0.5 / 0.18, rel=1e-12)
    # a one-hot row has Λ = 0 and does not count
    P = torch.tensor([[1.0, 0.0], [0.9, 0.1]], dtype=F64)
    assert softmax_jacobian_condition_number(P) == pytest.approx(1.0)


def test_saturation_on_near_singular_probe():
    """Two causal sequences equal up to 1e-9: rows of J nearly repeat; eig cannot resolve κ, svd can."""
    g = torch.Generator().manual_seed(8)
    N, D, d = 4, 6, 2
    x = _rand(N, D, gen=g)
    X = torch.stack([x, x + 1e-9 * _rand(N, D, gen=g)])
    W = [_rand(D, d, scale=0.5, gen=g) for _ in range(3)]
    raw = head_condition_number(X, *W, scaling=0.5, causal=True, refine=False)
    assert raw.saturated and raw.n_below_tol >= d and raw.n_structural == 0
    assert raw.kappa < 1e7 and raw.kappa_is_lower_bound  # the resolvable part only, and said so
    svd = head_condition_number(X, *W, scaling=0.5, causal=True, method="svd")
    assert svd.kappa > 1e7 and not svd.saturated and not svd.kappa_is_lower_bound
    assert raw.kappa <= svd.kappa  # an honest lower bound
    hc = head_condition_number(X, *W, scaling=0.5, causal=True)  # default eig: refined with svd (small J)
    assert hc.refined and hc.method == "svd" and not hc.kappa_is_lower_bound
    assert hc.kappa == pytest.approx(svd.kappa, rel=1e-9)
    # the same probe without the near-duplicate is fine
    ok = head_condition_number(x, *W, scaling=0.5, causal=True)
    assert not ok.saturated and ok.n_below_tol == 0


@pytest.mark.parametrize("query_bias", [False, True])
@pytest.mark.parametrize("method", ["svd", "eig"])
def test_structural_deficit_is_not_saturation(query_bias, method):
    """More output rows than parameters: the a-priori deficit (shape − gauge symmetry) is not flagged."""
    g = torch.Generator().manual_seed(9)
    N, D, d = 10, 3, 2
    X = _rand(N, D, gen=g)
    W = [_rand(D, d, scale=0.5, gen=g) for _ in range(3)]
    b_q = _rand(d, gen=g) if query_bias else None
    hc = head_condition_number(X, *W, b_q, scaling=1.0, method=method)
    gauge = d * (d - 1) if query_bias else d * d  # (W_Q, W_K) -> (W_Q E, W_K E^-T) leaves A unchanged
    assert hc.n_structural == N * d - (3 * D * d - gauge)
    assert hc.n_below_tol == hc.n_structural and not hc.saturated
    # the gauge directions really are null: perturb along one and A does not move to first order
    E = _rand(d, d, gen=g)
    if query_bias:  # b_Qᵀ E = 0 needed
        E = E - torch.outer(b_q, b_q @ E) / (b_q @ b_q)
    t = 1e-6
    A0 = attention_head_output(X, W[0], W[1], W[2], b_q, scaling=1.0)
    A1 = attention_head_output(X, W[0] @ (torch.eye(d, dtype=F64) + t * E), W[1] @ (torch.eye(d, dtype=F64) - t * E.T),
                               W[2], b_q, scaling=1.0)
    assert (A1 - A0).abs().max() < 1e-9


def test_input_validation():
    X = _rand(3, 4)
    W = _rand(4, 2)
    with pytest.raises(ValueError, match="math orientation"):
        head_condition_number(X, W.T, W, W, scaling=1.0)
    with pytest.raises(ValueError, match="method"):
        head_condition_number(X, W, W, W, scaling=1.0, method="jacrev")
    with pytest.raises(ValueError, match="sees no key"):
        head_condition_number(X, W, W, W, scaling=1.0, attn_mask=torch.zeros(3, 3, dtype=torch.bool))


# ------------------------------------------------------------------------------------------------------------------
# model level
# ------------------------------------------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402


def _probe(vocab, B=2, N=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, N), generator=g)
    ids[:, 0] = torch.arange(1, B + 1)  # distinct first tokens
    return ids


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                               bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(cfg)


def test_capture_matches_ln1_output(gpt2):
    ids = _probe(64)
    ln_out = {}
    handles = [blk.ln_1.register_forward_hook(lambda m, a, o, i=i: ln_out.__setitem__(i, o.detach()))
               for i, blk in enumerate(gpt2.transformer.h)]
    gpt2.eval()  # no dropout in the reference either
    try:
        with torch.no_grad():
            gpt2(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    gpt2.train()
    X = capture_attention_inputs(gpt2, ids)
    assert gpt2.training  # mode restored
    assert sorted(X) == [0, 1]
    for i in range(2):
        torch.testing.assert_close(X[i], ln_out[i], rtol=0, atol=0)
    assert all(not m._forward_pre_hooks for m in gpt2.modules())  # hooks removed
    assert sorted(capture_attention_inputs(gpt2, ids, layers=[-1])) == [1]


def test_gpt2_report_matches_pure_function(gpt2):
    ids = _probe(64)
    rep = attention_jacobian_condition_number(gpt2, ids, include_unmasked=True)
    X = capture_attention_inputs(gpt2, ids)
    D, H = 32, 2
    d = D // H
    for lc in rep.layers:
        attn = gpt2.transformer.h[lc.layer].attn
        assert lc.causal is True
        assert lc.scaling == pytest.approx(d ** -0.5)
        W, bias = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()  # Conv1D: (in, out) = math orientation
        kappas = []
        for h in range(H):
            sl = [slice(r * D + h * d, r * D + (h + 1) * d) for r in range(3)]
            hc = head_condition_number(X[lc.layer], *(W[:, s] for s in sl), *(bias[s] for s in sl),
                                       scaling=d ** -0.5, causal=True)
            kappas.append(hc.kappa)
            assert lc.heads[h].kappa == pytest.approx(hc.kappa, rel=1e-12)
            assert lc.heads[h].n_rows == 2 * 8 * d
        assert lc.mean == pytest.approx(sum(kappas) / H, rel=1e-12)
        assert lc.max == pytest.approx(max(kappas), rel=1e-12)
        assert lc.unmasked is not None and lc.unmasked[0].kappa != pytest.approx(lc.heads[0].kappa)
    log = rep.to_log_dict()
    for key in ("kappa/layer_0/mean", "kappa/layer_0/max", "kappa/layer_0/bound", "kappa/layer_1/mean",
                "kappa/layer_0/unmasked_mean", "kappa/mean", "kappa/max"):
        assert key in log and isinstance(log[key], float)
    assert log["kappa/layer_1/max"] == rep.layers[1].max
    import json

    d = json.loads(json.dumps(rep.to_dict()))
    assert d["layers"][0]["heads"][1]["head"] == 1 and len(d["layers"]) == 2
    # selection and forced mask
    sub = attention_jacobian_condition_number(gpt2, ids, layers=[1], heads=[0], causal=False)
    assert [lc.layer for lc in sub.layers] == [1] and sub.layers[0].head_ids == [0]
    assert sub.layers[0].heads[0].kappa == pytest.approx(rep.layers[1].unmasked[0].kappa, rel=1e-12)


def test_gpt2_shared_first_token_warns(gpt2):
    ids = _probe(64)
    ids[1, 0] = ids[0, 0]
    with pytest.warns(UserWarning, match="same token"):
        attention_jacobian_condition_number(gpt2, ids, layers=[0], heads=[0])


def test_bert_bidirectional_with_padding():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, vocab_size=64, max_position_embeddings=32)
    model = AutoModel.from_config(cfg)
    ids = _probe(64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    rep = attention_jacobian_condition_number(model, ids, mask, include_unmasked=True)
    X = capture_attention_inputs(model, ids, mask)
    d = 16
    for lc in rep.layers:
        assert lc.causal is False
        sa = model.encoder.layer[lc.layer].attention.self
        for h in range(2):
            sl = slice(h * d, (h + 1) * d)
            ws = [m.weight.detach()[sl].T for m in (sa.query, sa.key, sa.value)]  # Linear: (out, in)
            bs = [m.bias.detach()[sl] for m in (sa.query, sa.key, sa.value)]
            hc = head_condition_number(X[lc.layer], *ws, *bs, scaling=d ** -0.5, key_padding_mask=mask)
            assert lc.heads[h].kappa == pytest.approx(hc.kappa, rel=1e-12)
            assert lc.heads[h].n_rows == (8 + 5) * d  # padded queries left out
            assert lc.unmasked[h].kappa == pytest.approx(hc.kappa, rel=1e-12)  # bidirectional: same mask
        # padding matters
        hc_nopad = head_condition_number(X[lc.layer], *ws, *bs, scaling=d ** -0.5)
        assert hc_nopad.kappa != pytest.approx(lc.heads[1].kappa, rel=1e-6)


def test_llama_gqa():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                               max_position_embeddings=32)
    model = AutoModelForCausalLM.from_config(cfg)
    ids = _probe(64)
    rep = attention_jacobian_condition_number(model, ids)
    X = capture_attention_inputs(model, ids)
    d = 8
    for lc in rep.layers:
        assert lc.causal is True and len(lc.heads) == 4
        at = model.model.layers[lc.layer].self_attn
        for h in range(4):
            kv = h // 2
            wq = at.q_proj.weight.detach()[h * d:(h + 1) * d].T
            wk = at.k_proj.weight.detach()[kv * d:(kv + 1) * d].T
            wv = at.v_proj.weight.detach()[kv * d:(kv + 1) * d].T
            hc = head_condition_number(X[lc.layer], wq, wk, wv, scaling=d ** -0.5, causal=True)
            assert lc.heads[h].kappa == pytest.approx(hc.kappa, rel=1e-12)
        # heads 0 and 1 share K/V but not Q: different κ
        assert lc.heads[0].kappa != pytest.approx(lc.heads[1].kappa, rel=1e-6)


def _forward_weights(attn, D):
    """The (D, d) q/k/v weights of a 1-head GPT-2 attention *as its forward uses them*: the autograd Jacobian of the
    hooked c_attn (spectral C included) with respect to its input, minus nothing (the bias does not depend on x)."""
    x0 = torch.zeros(1, 1, D)
    jac = torch.autograd.functional.jacobian(lambda x: attn.c_attn(x), x0).reshape(3 * D, D)  # (out, in)
    W = jac.T.to(F64)  # math orientation (D, 3D)
    return W[:, :D], W[:, D : 2 * D], W[:, 2 * D :]


@pytest.mark.parametrize(
    "impl, lam",
    [("sdpa", 1.0), ("sdpa", 10.0), ("affine_scaled", 1.0), ("attention_sink", None), ("preconditioned", None)],
)
def test_kappa_measures_the_forward_weights_of_every_variant(impl, lam):
    """κ(J) equals an autograd Jacobian of the attention output w.r.t. the weights the forward uses (W + C)."""
    from transformers import AutoModelForCausalLM, GPT2Config

    import hf_condinit  # noqa: F401

    torch.manual_seed(0)
    config = GPT2Config(n_embd=4, n_head=1, n_layer=1, vocab_size=16, n_positions=8, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0)
    condinit = {"method": "default", "spectral_lambda": lam}
    model = AutoModelForCausalLM.from_config(config, condinit=condinit, attn_implementation=impl).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7], [3, 8, 4, 11, 6]])
    rep = attention_jacobian_condition_number(model, ids, method="svd")
    X = capture_attention_inputs(model, ids)[0].to(F64)
    attn = model.transformer.h[0].attn
    Wq, Wk, Wv = _forward_weights(attn, 4)
    bq, bk, bv = (t.detach().to(F64) for t in attn.c_attn.bias.split(4))
    J = brute_force_jacobian(X, Wq, Wk, Wv, bq, bk, bv, 0.5, True, None)
    sv = torch.linalg.svdvals(J)
    kept = sv[sv > max(J.shape) * torch.finfo(F64).eps * sv[0]]
    expected = float(kept[0] / kept[-1])
    head = rep.layers[0].heads[0]
    assert head.kappa == pytest.approx(expected, rel=1e-3)
    # the default (eig) cannot resolve κ ~ 1e10 from G = J Jᵀ: it is refined with svd on a J this small
    default = attention_jacobian_condition_number(model, ids).layers[0]
    assert default.heads[0].refined and default.heads[0].kappa == pytest.approx(expected, rel=1e-3)
    assert default.to_dict()["n_lower_bound"] == int(default.heads[0].kappa_is_lower_bound)


def test_spectral_kappa_depends_on_lambda():
    from transformers import AutoModelForCausalLM, GPT2Config

    import hf_condinit  # noqa: F401

    ids = torch.tensor([[1, 5, 9, 2, 7], [3, 8, 4, 11, 6]])
    kappas = []
    for lam in (1.0, 10.0):
        torch.manual_seed(0)
        config = GPT2Config(n_embd=4, n_head=1, n_layer=1, vocab_size=16, n_positions=8)
        model = AutoModelForCausalLM.from_config(config, condinit={"method": "default", "spectral_lambda": lam})
        kappas.append(attention_jacobian_condition_number(model, ids, method="svd").layers[0].heads[0].kappa)
    assert kappas[0] != pytest.approx(kappas[1], rel=1e-2)
