"""Crammed BERT: shapes, registry, attention through HF's registry, masking, sparse MLM loss, save/load, init."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_condinit
from hf_condinit.models.crammed_bert import (
    CrammedBertAttention,
    CrammedBertConfig,
    CrammedBertForMaskedLM,
    CrammedBertForSequenceClassification,
    CrammedBertModel,
    register,
)
from hf_condinit.models.crammed_bert.modeling_crammed_bert import sinusoidal_table

VOCAB, D, H, L = 97, 64, 4, 2
HEAD_DIM = D // H


def tiny_config(**kwargs) -> CrammedBertConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=128,
        max_position_embeddings=32,
    )
    base.update(kwargs)
    return CrammedBertConfig(**base)


def ids(batch=2, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, VOCAB, (batch, length), generator=g)


VARIANTS = [name for name in ("affine_scaled", "attention_sink", "preconditioned") if name in ALL_ATTENTION_FUNCTIONS]


# ---------------------------------------------------------------------------------------------------------------------


def test_config_validation_and_defaults():
    cfg = CrammedBertConfig()
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == (16, 768, 12, 3072)
    assert cfg.max_position_embeddings == 128 and cfg.tie_word_embeddings and cfg.sparse_prediction
    with pytest.raises(Exception, match="multiple of num_attention_heads"):
        CrammedBertConfig(hidden_size=66, num_attention_heads=4)
    with pytest.raises(Exception, match="must be even"):
        CrammedBertConfig(intermediate_size=127)


def test_auto_registration_is_idempotent():
    register()
    register()
    cfg = tiny_config()
    assert isinstance(AutoConfig.for_model("crammed_bert"), CrammedBertConfig)
    assert type(AutoModel.from_config(cfg)) is CrammedBertModel
    assert type(AutoModelForMaskedLM.from_config(cfg)) is CrammedBertForMaskedLM
    assert type(AutoModelForSequenceClassification.from_config(cfg)) is CrammedBertForSequenceClassification


def test_shapes_and_structure():
    torch.manual_seed(0)
    cfg = tiny_config(num_labels=3)
    x = ids()
    base = CrammedBertModel(cfg).eval()
    out = base(x, output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 10, D)
    assert len(out.hidden_states) == L + 1
    mlm = CrammedBertForMaskedLM(cfg).eval()
    assert mlm(x).logits.shape == (2, 10, VOCAB)
    cls = CrammedBertForSequenceClassification(cfg).eval()
    assert cls(x).logits.shape == (2, 3)
    # no biases in the encoder, tied decoder
    for name, p in mlm.crammed_bert.named_parameters():
        assert not name.endswith(".bias"), name
    assert mlm.decoder.weight is mlm.crammed_bert.embeddings.word_embeddings.weight
    attn = mlm.crammed_bert.layers[0].attention
    assert attn.query_key_value.weight.shape == (3 * D, D) and attn.query_key_value.bias is None
    assert attn.is_causal is False and attn.head_dim == HEAD_DIM and attn.num_heads == H
    assert attn.scaling == pytest.approx(HEAD_DIM**-0.5)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        base(ids(length=40))


def _manual_attention(attn: CrammedBertAttention, x: torch.Tensor) -> torch.Tensor:
    """Reference: per-head [q_h; k_h; v_h] row blocks of the fused weight, softmax attention, output projection."""
    W = attn.query_key_value.weight
    d = attn.head_dim
    heads = []
    for h in range(attn.num_heads):
        wq, wk, wv = W[h * 3 * d : h * 3 * d + d], W[h * 3 * d + d : h * 3 * d + 2 * d], W[h * 3 * d + 2 * d : (h + 1) * 3 * d]
        q, k, v = x @ wq.t(), x @ wk.t(), x @ wv.t()
        heads.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ attn.dense.weight.t()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_fused_qkv_is_interleaved_per_head(impl):
    torch.manual_seed(0)
    model = CrammedBertModel(tiny_config(attn_implementation=impl)).eval()
    assert model.config._attn_implementation == impl
    attn = model.layers[0].attention
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        torch.testing.assert_close(attn(x)[0], _manual_attention(attn, x), atol=1e-5, rtol=1e-5)


def test_custom_attention_goes_through_registry():
    calls = []

    def recorder(module, query, key, value, attention_mask, **kwargs):
        calls.append((type(module).__name__, tuple(query.shape), None if attention_mask is None else tuple(attention_mask.shape)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("crammed_test_recorder", recorder)
    AttentionMaskInterface.register("crammed_test_recorder", sdpa_mask)
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config(), attn_implementation="crammed_test_recorder").eval()
    x = ids()
    mask = torch.ones_like(x)
    mask[1, 6:] = 0
    with torch.no_grad():
        model(x, attention_mask=mask)
    assert calls == [("CrammedBertAttention", (2, H, 10, HEAD_DIM), (2, 1, 10, 10))] * L


@pytest.mark.parametrize("impl", ["eager", "sdpa", *VARIANTS])
def test_padding_does_not_change_unpadded_outputs(impl):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config(), attn_implementation=impl).eval()
    short, long = ids(1, 6, seed=1), ids(1, 10, seed=2)
    batch = torch.zeros(2, 10, dtype=torch.long)
    batch[0, :6], batch[1] = short[0], long[0]
    mask = torch.zeros_like(batch)
    mask[0, :6], mask[1] = 1, 1
    with torch.no_grad():
        padded = model(batch, attention_mask=mask).logits
        alone_short = model(short).logits
        alone_long = model(long).logits
    torch.testing.assert_close(padded[0, :6], alone_short[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(padded[1], alone_long[0], atol=1e-4, rtol=1e-4)
    if impl in ("eager", "sdpa"):
        # and the pad tokens do matter when they are not masked out (the test can fail)
        with torch.no_grad():
            unmasked = model(batch).logits
        assert not torch.allclose(unmasked[0, :6], alone_short[0], atol=1e-4)


@pytest.mark.parametrize("sparse", [True, False])
def test_mlm_loss_only_on_masked_tokens(sparse):
    torch.manual_seed(0)
    model = CrammedBertForMaskedLM(tiny_config(sparse_prediction=sparse)).eval()
    x = ids(2, 10)
    labels = torch.full_like(x, -100)
    positions = [(0, 1), (0, 7), (1, 0), (1, 4), (1, 9)]
    for b, t in positions:
        labels[b, t] = int(x[b, t])
    with torch.no_grad():
        dense = model(x).logits  # (2, 10, V) without labels
        out = model(x, labels=labels)
    mask = labels != -100
    manual = F.cross_entropy(dense[mask], labels[mask])
    torch.testing.assert_close(out.loss, manual, atol=1e-5, rtol=1e-5)
    if sparse:
        assert out.logits.shape == (len(positions), VOCAB)
        torch.testing.assert_close(out.logits, dense[mask], atol=1e-5, rtol=1e-5)
    else:
        assert out.logits.shape == (2, 10, VOCAB)
    # a loss over every position would differ
    everything = F.cross_entropy(dense.reshape(-1, VOCAB), x.reshape(-1))
    assert not torch.allclose(out.loss, everything)
    # no masked token: zero loss, still differentiable
    none = model(x, labels=torch.full_like(x, -100)).loss
    assert float(none.detach()) == 0.0 and none.requires_grad


def test_classification_and_regression_losses():
    torch.manual_seed(0)
    x = ids(3, 8)
    cls = CrammedBertForSequenceClassification(tiny_config(num_labels=3)).eval()
    labels = torch.tensor([0, 2, 1])
    out = cls(x, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    reg = CrammedBertForSequenceClassification(tiny_config(num_labels=1, problem_type="regression")).eval()
    target = torch.tensor([0.5, 4.0, 2.5])
    out = reg(x, labels=target)
    assert out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), target))


def test_default_init_values():
    torch.manual_seed(0)
    model = CrammedBertForMaskedLM(tiny_config(num_hidden_layers=4, hidden_size=128, intermediate_size=512))
    qkv = torch.cat([m.query_key_value.weight.detach().flatten() for m in model.modules() if isinstance(m, CrammedBertAttention)])
    assert abs(float(qkv.std()) - 0.02) < 0.001 and abs(float(qkv.mean())) < 0.001
    emb = model.crammed_bert.embeddings
    assert abs(float(emb.word_embeddings.weight.detach().std()) - 0.02) < 0.001
    assert torch.equal(model.crammed_bert.final_norm.weight, torch.ones(128))
    assert float(emb.position_embeddings.scale.detach()) == pytest.approx(1 / math.sqrt(128))
    assert torch.equal(emb.position_embeddings.pe, sinusoidal_table(32, 128))
    torch.manual_seed(0)
    again = CrammedBertForMaskedLM(tiny_config(num_hidden_layers=4, hidden_size=128, intermediate_size=512))
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("method", ["default", "conditioned"])
def test_save_load_round_trip_bit_identical(tmp_path, method):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config(), condinit={"method": method, "seed": 3}).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is CrammedBertForMaskedLM
    _assert_same_state(model, loaded)
    assert loaded.decoder.weight is loaded.crammed_bert.embeddings.word_embeddings.weight
    assert torch.equal(loaded.crammed_bert.embeddings.position_embeddings.pe, sinusoidal_table(32, D))
    assert loaded.config.condinit["method"] == method
    x = ids()
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)
    # the encoder of an MLM checkpoint loads unchanged into the classifier
    cls = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    enc_a, enc_b = model.crammed_bert.state_dict(), cls.crammed_bert.state_dict()
    for k in enc_a:
        assert torch.equal(enc_a[k], enc_b[k]), k


def _semi_orthogonal_error(w: torch.Tensor) -> float:
    return float((w.t() @ w - torch.eye(w.shape[1])).abs().max())


def test_conditioned_init_through_layout():
    cfg = tiny_config()
    torch.manual_seed(0)
    default = AutoModelForMaskedLM.from_config(cfg, condinit={"method": "default", "seed": 0})
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(cfg, condinit={"method": "conditioned", "seed": 0})
    layout = hf_condinit.get_layout(model)
    modules = layout.attention_modules(model)
    assert [type(m).__name__ for _, m in modules] == ["CrammedBertAttention"] * L
    for _, module in modules:
        projs = layout.projections(module)
        W = module.query_key_value.weight.detach()
        for role in ("q", "k"):
            heads = projs[role].heads(projs[role].weight.detach())
            assert len(heads) == H and heads[0].shape == (D, HEAD_DIM)
            for w in heads:
                assert _semi_orthogonal_error(w) < 1e-5
        # value block identity, read straight from the interleaved storage (independent of the layout code)
        v_rows = torch.cat([W[h * 3 * HEAD_DIM + 2 * HEAD_DIM : (h + 1) * 3 * HEAD_DIM] for h in range(H)])
        assert torch.equal(v_rows, torch.eye(D))
        q_rows = W[0:HEAD_DIM]  # q_0 in storage = first d rows
        assert _semi_orthogonal_error(q_rows.t()) < 1e-5
        # Q and K differ (fresh draws)
        assert not torch.allclose(W[0:HEAD_DIM], W[HEAD_DIM : 2 * HEAD_DIM])
    # everything else is the default init (same global seed): W_O, FFN, embeddings
    for (name, p_def), (_, p_cond) in zip(default.named_parameters(), model.named_parameters()):
        if "query_key_value" in name:
            assert not torch.equal(p_def, p_cond), name
        else:
            assert torch.equal(p_def, p_cond), name


def test_mimetic_init_runs_and_changes_qkvo():
    torch.manual_seed(0)
    default = AutoModelForMaskedLM.from_config(tiny_config(), condinit={"method": "default", "seed": 0})
    torch.manual_seed(0)
    mimetic = AutoModelForMaskedLM.from_config(tiny_config(), condinit={"method": "mimetic", "seed": 0})
    a, b = default.crammed_bert.layers[0].attention, mimetic.crammed_bert.layers[0].attention
    assert not torch.equal(a.query_key_value.weight, b.query_key_value.weight)
    assert torch.equal(default.crammed_bert.layers[0].ffn.dense_in.weight, mimetic.crammed_bert.layers[0].ffn.dense_in.weight)


def test_training_step_with_gradient_checkpointing():
    torch.manual_seed(0)
    model = CrammedBertForMaskedLM(tiny_config())
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    model.train()
    x = ids()
    labels = x.clone()
    labels[:, ::2] = -100
    loss = model(x, labels=labels).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
