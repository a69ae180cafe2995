"""Zero-shot cloze on held-out text: which of ``k`` words comes next?

An **item** is a place in a held-out document where a word follows a space: the *context* is the document before
that space, the *choices* are ``k`` continuations ``" " + word``: the word that is there and ``k − 1`` distractors,
words found elsewhere in the same held-out text. A model gets the item right when the true continuation has the
highest total log-probability after the context (summed over its tokens); chance is ``1 / k``.

Eligible words (targets and distractors alike): a maximal run of ASCII letters ``[A-Za-z]+`` that follows one space
after a non-space character, is not followed by a letter, digit, ``_``, apostrophe or hyphen (so ``don't``,
``well-known``, ``x2`` are skipped), and has at least ``min_context_words`` whitespace-separated words before it in
its document. Only the word is scored, not what follows it.

Sampling (``seed``; deterministic): the eligible occurrences are shuffled; each in turn is a candidate target, with
``k − 1`` distractor occurrences drawn uniformly (with replacement) from all eligible occurrences; the whole draw is
kept when no two of the ``k`` words are equal or a prefix of one another (case-insensitive), and dropped otherwise
(a new target is tried). So target and distractors come from the same distribution, that of word occurrences in
the text, and the kept ``k`` words are exchangeable: any scorer that ignores the context (word frequency, length,
a uniform model) is right with probability exactly ``1 / k``. Above chance means the model uses the context. The
prefix rule keeps a distractor such as ``" park"`` from beating a true ``" parked"`` only because its sum has fewer
terms. The true word's place among the choices is drawn uniformly.

No leakage, no future: items are built from text the model was not trained on (the harness uses the held-out split
of its own training data: the first 5 % of the documents, ``hf_condinit.data.documents_dataset``); the model sees
the context and one continuation, nothing after the target word.

Tokens: the context gets the tokenizer's EOS token in front (the token before every document in training) and is
cut from the left to its last ``max_context_tokens`` tokens (the EOS goes first when it is cut); context and
continuation are tokenized separately and concatenated (for byte-level BPE and a continuation that starts with a
space this equals tokenizing the joined text). Exact ties between the best choices (a uniform model) are broken
uniformly at random (a generator seeded by ``seed`` and the item's index), so a model that cannot tell the choices
apart is at chance, not below it. Accuracy comes with its Wilson 95 % interval (:mod:`.binomial`).
"""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass

from .binomial import INTERVAL, accuracy_stats
from .minimal_pairs import context_length, prefix_token_id, tail_log_probs

__all__ = ["ClozeItem", "build_cloze_items", "evaluate_cloze", "score_cloze", "summarize_cloze", "word_occurrences"]

WORD = re.compile(r"(?<=\S) ([A-Za-z]+)(?![\w'’-])")


@dataclass(frozen=True)
class ClozeItem:
    """One cloze item: ``context`` (its document's text up to, not including, the space before the target word),
    ``choices`` (continuations ``" " + word``; ``choices[label]`` is the word that is there), the ``document``
    (index) and ``position`` (character offset of that space in the document)."""

    context: str
    choices: tuple[str, ...]
    label: int
    document: int
    position: int


def word_occurrences(documents, min_context_words: int = 8) -> list[tuple[int, int, str]]:
    """Every eligible word occurrence (module docstring) of ``documents`` as ``(document, position of the space
    before it, word)``, in document then text order."""
    out = []
    for d, text in enumerate(documents):
        word_starts = [m.start() for m in re.finditer(r"\S+", text)]
        for m in WORD.finditer(text):
            if bisect.bisect_left(word_starts, m.start()) >= min_context_words:
                out.append((d, m.start(), m.group(1)))
    return out


def _compatible(words: list[str]) -> bool:
    """No two words equal or a prefix of one another, case-insensitively."""
    low = sorted(w.lower() for w in words)
    return all(not b.startswith(a) for a, b in zip(low, low[1:]))


def build_cloze_items(documents, *, n_items: int = 1000, n_choices: int = 4, seed: int = 0,
                      min_context_words: int = 8) -> list[ClozeItem]:
    """Up to ``n_items`` cloze items of ``n_choices`` choices from ``documents`` (a list of strings; module
    docstring), fewer when the text runs out of eligible targets. Raises ``ValueError`` when none can be built."""
    if n_choices < 2 or n_items < 1:
        raise ValueError(f"a cloze needs n_choices >= 2 and n_items >= 1, got {n_choices} and {n_items}")
    documents = list(documents)
    pool = word_occurrences(documents, min_context_words)
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    items = []
    for t in order:
        if len(items) == n_items:
            break
        others = [pool[rng.randrange(len(pool))][2] for _ in range(n_choices - 1)]
        doc, pos, word = pool[t]
        if not _compatible([word, *others]):
            continue
        label = rng.randrange(n_choices)
        words = others[:label] + [word] + others[label:]
        items.append(ClozeItem(documents[doc][:pos], tuple(" " + w for w in words), label, doc, pos))
    if not items:
        raise ValueError(f"no cloze item of {n_choices} choices can be built from {len(documents)} documents "
                         f"({len(pool)} eligible words with {min_context_words} words before them)")
    return items


def _item_sequences(tokenizer, items, max_context_tokens: int, model_context: int | None):
    """Token ids of every (item, choice) as ``(sequences, n_scored)``: EOS + context (cut from the left), then the
    continuation; ``n_scored`` = the continuation's length."""
    eos = prefix_token_id(tokenizer, "eos")
    contexts = tokenizer([it.context for it in items], add_special_tokens=False)["input_ids"]
    choices = list(dict.fromkeys(c for it in items for c in it.choices))
    choice_ids = dict(zip(choices, tokenizer(choices, add_special_tokens=False)["input_ids"]))
    sequences, n_scored = [], []
    for it, ctx in zip(items, contexts):
        for c in it.choices:
            cont = choice_ids[c]
            keep = max_context_tokens if model_context is None else min(max_context_tokens, model_context - len(cont))
            if keep < 1:
                raise ValueError(f"continuation {c!r} has {len(cont)} tokens: no room for a context in the model's "
                                 f"{model_context}")
            sequences.append(([eos] + list(ctx))[-keep:] + list(cont))
            n_scored.append(len(cont))
    return sequences, n_scored


def score_cloze(model, tokenizer, items, *, seed: int = 0, max_context_tokens: int = 128, batch_size: int = 64,
                device=None, show_progress: bool = False) -> tuple[list[list[float]], list[bool]]:
    """Score every choice of every item (module docstring). Returns ``(scores, correct)``: per item the choices'
    total log-probabilities after the context, and whether the true choice wins (exact ties among the best broken
    by ``random.Random(seed * 1_000_003 + index)``). ``model``, ``batch_size``, ``device``: as in
    :func:`~hf_condinit.evaluation.minimal_pairs.sentence_log_probs`."""
    if max_context_tokens < 1:
        raise ValueError(f"max_context_tokens must be at least 1, got {max_context_tokens}")
    sequences, n_scored = _item_sequences(tokenizer, items, max_context_tokens, context_length(model.config))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else sequences[0][0]
    flat = tail_log_probs(model, sequences, n_scored, pad_id=pad_id, batch_size=batch_size, device=device,
                          show_progress=show_progress, desc="cloze").tolist()
    scores, correct, at = [], [], 0
    for index, it in enumerate(items):
        sc = flat[at : at + len(it.choices)]
        at += len(it.choices)
        best = [j for j, v in enumerate(sc) if v == max(sc)]
        pick = best[0] if len(best) == 1 else random.Random(seed * 1_000_003 + index).choice(best)
        scores.append(sc)
        correct.append(pick == it.label)
    return scores, correct


def summarize_cloze(items, correct, name: str = "cloze") -> dict:
    """``<name>_accuracy`` (0-1), ``<name>_n_items``, ``<name>_n_correct``, ``<name>_n_choices``, ``<name>_chance``
    (1 / k), ``<name>_ci95`` ([low, high], ``<name>_interval`` names the method), ``<name>_vs_chance`` ("above",
    "at", "below") and ``<name>_at_chance`` (the interval contains chance)."""
    ks = {len(it.choices) for it in items}
    if len(ks) != 1 or len(items) != len(correct) or not items:
        raise ValueError("summarize_cloze: one result per item, every item with the same number of choices")
    k = ks.pop()
    s = accuracy_stats(sum(bool(c) for c in correct), len(items), 1 / k)
    return {f"{name}_accuracy": s["accuracy"], f"{name}_n_items": s["n"], f"{name}_n_correct": s["correct"],
            f"{name}_n_choices": k, f"{name}_chance": s["chance"], f"{name}_ci95": s["ci95"],
            f"{name}_interval": INTERVAL, f"{name}_vs_chance": s["vs_chance"], f"{name}_at_chance": s["at_chance"]}


def evaluate_cloze(model, tokenizer, documents, *, n_items: int = 1000, n_choices: int = 4, seed: int = 0,
                   min_context_words: int = 8, max_context_tokens: int = 128, batch_size: int = 64, device=None,
                   show_progress: bool = False, name: str = "cloze") -> dict:
    """Cloze accuracy of ``model`` on held-out ``documents`` (strings): :func:`build_cloze_items`,
    :func:`score_cloze`, :func:`summarize_cloze`, plus the settings (``<name>_seed``, ``<name>_min_context_words``,
    ``<name>_max_context_tokens``) so that a record says how it was made."""
    items = build_cloze_items(documents, n_items=n_items, n_choices=n_choices, seed=seed,
                              min_context_words=min_context_words)
    _, correct = score_cloze(model, tokenizer, items, seed=seed, max_context_tokens=max_context_tokens,
                             batch_size=batch_size, device=device, show_progress=show_progress)
    out = summarize_cloze(items, correct, name)
    out.update({f"{name}_seed": seed, f"{name}_min_context_words": min_context_words,
                f"{name}_max_context_tokens": max_context_tokens})
    return out
