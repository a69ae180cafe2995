"""Binomial intervals (hf_condinit.evaluation.binomial) against scipy and a hand case; the zero-shot cloze
(hf_condinit.evaluation.cloze): item construction, scores against a one-sequence-at-a-time reference, the inputs the
model sees (nothing after the target word), an oracle at 1.0, context-free scorers at chance.

Text: the held-out split (first 5 % of the stories) of the TinyStories sample, as the harness holds it out; models
are tiny GPT-2s over a small BPE trained on that text; nothing is downloaded.
"""

import collections
import random
import types

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_condinit  # noqa: F401
from hf_condinit.data import train_bpe_tokenizer
from hf_condinit.data.documents import documents_dataset, read_documents
from hf_condinit.evaluation.binomial import accuracy_stats, vs_chance, wilson_interval
from hf_condinit.evaluation.cloze import (
    WORD,
    build_cloze_items,
    evaluate_cloze,
    score_cloze,
    summarize_cloze,
    word_occurrences,
)

from utils import TINYSTORIES, mini_config, require

# ------------------------------------------------------------------------------------------------ binomial


def test_wilson_interval_matches_scipy_and_a_hand_case():
    stats = pytest.importorskip("scipy.stats")
    for k, n in [(0, 10), (8, 10), (10, 10), (1, 1), (150, 300), (171, 300), (10_400, 20_100), (3, 1000)]:
        for level in (0.95, 0.99, 0.5):
            ref = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
            assert wilson_interval(k, n, level) == pytest.approx((ref.low, ref.high), abs=1e-12), (k, n, level)
    # by hand: p = 0.8, z = 1.95996, z² = 3.84146; centre (0.8 + 0.19207) / 1.38415 = 0.71674, half-width
    # 1.95996 · √(0.016 + 0.0096037) / 1.38415 = 0.22658 -> (0.4902, 0.9433); 0 of 10: high z² / (n + z²) = 0.2775
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=5e-5)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    for bad in [(1, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError, match="0 <= correct <= n"):
            wilson_interval(*bad)


def test_accuracy_stats_say_where_chance_is():
    at = accuracy_stats(156, 300, 0.5)  # 52 %: the interval (46.4, 57.6) holds 0.5
    assert at["at_chance"] and at["vs_chance"] == "at" and at["ci95"] == list(wilson_interval(156, 300))
    above = accuracy_stats(10_452, 20_100, 0.5)  # 52 % of 20,100: (51.3, 52.7)
    assert not above["at_chance"] and above["vs_chance"] == "above"
    assert accuracy_stats(40, 300, 0.25)["vs_chance"] == "below"
    assert vs_chance(0.4, 0.6, 0.6) == "at" and vs_chance(0.61, 0.7, 0.6) == "above"


# ------------------------------------------------------------------------------------------------ cloze data


@pytest.fixture(scope="module")
def documents():
    """The harness's held-out split of the TinyStories sample (its first 5 % of the stories), first 40 stories."""
    docs = read_documents([str(require(TINYSTORIES))], max_bytes=400_000)
    return list(documents_dataset(docs, 0.05)["validation"]["text"])[:40]


@pytest.fixture(scope="module")
def items(documents):
    return build_cloze_items(documents, n_items=300, n_choices=4, seed=0)


def test_items_are_places_in_the_text(documents, items):
    assert len(items) == 300 and len({(it.document, it.position) for it in items}) == 300
    for it in items:
        doc = documents[it.document]
        assert it.context == doc[: it.position]  # the context ends before the target: nothing after it
        true = it.choices[it.label]
        assert doc[it.position:].startswith(true) and WORD.match(doc, it.position)
        after = doc[it.position + len(true): it.position + len(true) + 1]
        assert after == "" or not (after.isalnum() or after in "_'’-")
        assert len(it.context.split()) >= 8
        low = [c.strip().lower() for c in it.choices]
        assert all(a == b or not b.startswith(a) for a in low for b in low)  # no word a prefix of another
    assert collections.Counter(it.label for it in items).keys() == {0, 1, 2, 3}


def test_items_are_deterministic_given_the_seed(documents, items):
    assert build_cloze_items(documents, n_items=300, seed=0) == items
    assert build_cloze_items(documents, n_items=300, seed=1) != items
    few = build_cloze_items(documents[:1], n_items=10_000, seed=0)  # the text runs out: fewer items
    assert 0 < len(few) < len(word_occurrences(documents[:1]))
    with pytest.raises(ValueError, match="no cloze item"):
        build_cloze_items(["too short to hold a word with eight before it"], n_items=5)
    with pytest.raises(ValueError, match="n_choices >= 2"):
        build_cloze_items(documents, n_choices=1)


def _frequency_pick(items, counts, seed=0):
    """A context-free scorer: the choice whose word is most frequent in the text (ties at random)."""
    right = 0
    for i, it in enumerate(items):
        f = [counts[c.strip()] for c in it.choices]
        best = [j for j, v in enumerate(f) if v == max(f)]
        right += random.Random(seed + i).choice(best) == it.label
    return right


def test_context_free_scorers_are_at_chance(documents):
    """Targets and distractors are drawn from the same occurrence distribution: a scorer that knows the words'
    frequencies (or lengths) but not the context is at 1/k. The same frequency scorer is far above chance against
    distractors drawn uniformly from the word *types* (the construction this test would catch)."""
    many = build_cloze_items(documents, n_items=2000, n_choices=4, seed=3)
    counts = collections.Counter(w for _, _, w in word_occurrences(documents))
    freq = accuracy_stats(_frequency_pick(many, counts), len(many), 0.25)
    assert freq["at_chance"], freq
    short = sum(min(range(4), key=lambda j: (len(it.choices[j]), j)) == it.label for it in many)
    assert accuracy_stats(short, len(many), 0.25)["at_chance"]
    types_ = sorted(counts)
    rng = random.Random(0)
    type_items = []
    for it in many:
        others = [" " + w for w in rng.sample(types_, 12) if w.lower() != it.choices[it.label].strip().lower()][:3]
        type_items.append(types.SimpleNamespace(choices=(it.choices[it.label], *others), label=0))
    assert accuracy_stats(_frequency_pick(type_items, counts), len(many), 0.25)["vs_chance"] == "above"


# ------------------------------------------------------------------------------------------------ cloze scores


@pytest.fixture(scope="module")
def tokenizer(documents):
    return train_bpe_tokenizer(documents, vocab_size=400, model_max_length=64)


def _model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = mini_config("gpt2", vocab_size=len(tokenizer), n_positions=64)
    return AutoModelForCausalLM.from_config(config).eval()


def _expected_ids(tokenizer, it, choice, keep):
    ctx = [tokenizer.eos_token_id] + tokenizer(it.context, add_special_tokens=False)["input_ids"]
    cont = tokenizer(choice, add_special_tokens=False)["input_ids"]
    return ctx[-min(keep, 64 - len(cont)):], cont


def test_scores_equal_one_sequence_at_a_time(tokenizer, items):
    model = _model(tokenizer)
    some = items[:12]
    scores, correct = score_cloze(model, tokenizer, some, max_context_tokens=40, batch_size=5)
    for it, sc, ok in zip(some, scores, correct):
        ref = []
        for choice in it.choices:
            ctx, cont = _expected_ids(tokenizer, it, choice, 40)
            ids = torch.tensor([ctx + cont])
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            ref.append(sum(lp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont)))
        assert sc == pytest.approx(ref, abs=2e-4)
        assert ok == (max(range(4), key=ref.__getitem__) == it.label)
        # the joined text tokenizes the same as context + continuation
        for choice in it.choices:
            apart = tokenizer([it.context, choice], add_special_tokens=False)["input_ids"]
            assert tokenizer(it.context + choice, add_special_tokens=False)["input_ids"] == apart[0] + apart[1]


def test_the_model_sees_the_context_and_one_choice_only(tokenizer, items):
    """Every row the model gets is EOS + the (left-cut) context + one choice: no token of what follows the
    target word in the document."""
    model = _model(tokenizer)
    seen = []

    def grab(module, args, kwargs):
        for row, mask in zip(kwargs["input_ids"], kwargs["attention_mask"]):
            seen.append(row[mask.bool()].tolist())

    handle = model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        score_cloze(model, tokenizer, items[:20], max_context_tokens=30, batch_size=7)
    finally:
        handle.remove()
    expected = [sum(_expected_ids(tokenizer, it, c, 30), []) for it in items[:20] for c in it.choices]
    assert sorted(seen) == sorted(expected)


class _Oracle(torch.nn.Module):
    """A causal 'model' that knows the true continuations: at each position it puts a logit of 100 on the token that
    follows this exact prefix in one of ``sequences`` (EOS + context + true choice), 0 elsewhere. It reads only the
    prefix up to the position."""

    def __init__(self, sequences, vocab, n_positions=64):
        super().__init__()
        self.config = types.SimpleNamespace(n_positions=n_positions)
        self.vocab = vocab
        self.next = {tuple(s[:j]): s[j] for s in sequences for j in range(1, len(s))}

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for b, row in enumerate(input_ids.tolist()):
            for j in range(len(row)):
                token = self.next.get(tuple(row[: j + 1]))
                if token is not None:
                    logits[b, j, token] = 100.0
        return types.SimpleNamespace(logits=logits)


class _Uniform(torch.nn.Module):
    """Equal logits for every token: every choice of a given token length scores the same."""

    def __init__(self, vocab):
        super().__init__()
        self.config = types.SimpleNamespace(n_positions=64)
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return types.SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


def test_an_oracle_scores_one_and_uniform_or_random_models_chance(tokenizer, items):
    true_rows = [sum(_expected_ids(tokenizer, it, it.choices[it.label], 32), []) for it in items]
    _, correct = score_cloze(_Oracle(true_rows, len(tokenizer)), tokenizer, items, max_context_tokens=32)
    assert all(correct)
    out = summarize_cloze(items, correct)
    assert out["cloze_accuracy"] == 1.0 and out["cloze_vs_chance"] == "above" and out["cloze_chance"] == 0.25
    _, uniform = score_cloze(_Uniform(len(tokenizer)), tokenizer, items, max_context_tokens=32, seed=0)
    assert summarize_cloze(items, uniform)["cloze_at_chance"]
    assert score_cloze(_Uniform(len(tokenizer)), tokenizer, items, max_context_tokens=32, seed=0)[1] == uniform
    _, random_init = score_cloze(_model(tokenizer, seed=4), tokenizer, items, max_context_tokens=32)
    assert summarize_cloze(items, random_init)["cloze_at_chance"]


def test_evaluate_cloze_records_its_settings(tokenizer, documents):
    out = evaluate_cloze(_model(tokenizer), tokenizer, documents, n_items=20, n_choices=3, seed=5,
                         max_context_tokens=24)
    assert out["cloze_n_items"] == 20 and out["cloze_n_choices"] == 3 and out["cloze_chance"] == pytest.approx(1 / 3)
    assert out["cloze_seed"] == 5 and out["cloze_max_context_tokens"] == 24 and out["cloze_interval"] == "wilson 95%"
    assert out["cloze_ci95"] == list(wilson_interval(out["cloze_n_correct"], 20))
    with pytest.raises(ValueError, match="max_context_tokens"):
        evaluate_cloze(_model(tokenizer), tokenizer, documents, n_items=2, max_context_tokens=0)
