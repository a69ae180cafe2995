"""Embedded synthetic corpus: multi-query associative recall (MQAR).

MQAR (Arora et al., "Zoology", 2023) is a standard probe of what attention can do: a sequence first lists
``n_pairs`` key-value pairs, then asks ``n_queries`` of the keys again; after each queried key the model must
produce the value that key was paired with earlier in the same sequence. Only attention over the context can
solve it (the pairs are drawn fresh per sequence), which makes it a quick, meaningful target for comparing
attention initialisations offline.

One example, as text (``n_pairs=3, n_queries=3``)::

    k7 v2 k0 v9 k4 v4 | k0 v9 k7 v2 k4 v4 <|endoftext|>

Every example has exactly ``2 * n_pairs + 2 * n_queries + 2`` tokens under :func:`mqar_tokenizer`
(word-level: one token per key, value, separator and end-of-text), so examples are never packed across
boundaries and the positions of the recalled values are fixed: :func:`mqar_value_positions`.

Everything is generated from a seed with :class:`random.Random`; nothing is read from disk or downloaded.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"
SEP_TOKEN = "|"

__all__ = [
    "EOS_TOKEN",
    "MQARSpec",
    "make_mqar_texts",
    "make_mqar_datasets",
    "mqar_tokenizer",
    "mqar_value_positions",
    "mqar_recall_accuracy",
]


@dataclass(frozen=True)
class MQARSpec:
    """Shape of the MQAR corpus.

    Args:
        n_pairs (`int`, *optional*, defaults to 8): key-value pairs listed per sequence.
        n_queries (`int`, *optional*, defaults to 8): queried keys per sequence (drawn from the listed keys,
            without repetition while possible).
        n_keys (`int`, *optional*, defaults to 32): size of the key vocabulary (``k0`` ... ``k{n_keys-1}``).
        n_values (`int`, *optional*, defaults to 32): size of the value vocabulary (``v0`` ...).
    """

    n_pairs: int = 8
    n_queries: int = 8
    n_keys: int = 32
    n_values: int = 32

    def __post_init__(self):
        if self.n_pairs < 1 or self.n_queries < 1:
            raise ValueError(f"MQAR needs n_pairs >= 1 and n_queries >= 1, got {self.n_pairs}, {self.n_queries}")
        if self.n_pairs > self.n_keys:
            raise ValueError(f"MQAR keys are distinct within a sequence: n_pairs={self.n_pairs} > n_keys={self.n_keys}")
        if self.n_values < 1:
            raise ValueError("MQAR needs n_values >= 1")

    @property
    def seq_len(self) -> int:
        """Tokens per example (pairs, separator, queries, end-of-text)."""
        return 2 * self.n_pairs + 1 + 2 * self.n_queries + 1

    def to_dict(self) -> dict:
        return asdict(self)


def _one_example(rng: random.Random, spec: MQARSpec) -> str:
    keys = rng.sample(range(spec.n_keys), spec.n_pairs)
    values = [rng.randrange(spec.n_values) for _ in keys]
    pairs = dict(zip(keys, values))
    queries: list[int] = []
    while len(queries) < spec.n_queries:
        order = keys[:]
        rng.shuffle(order)
        queries.extend(order[: spec.n_queries - len(queries)])
    parts = [f"k{k} v{pairs[k]}" for k in keys] + [SEP_TOKEN] + [f"k{q} v{pairs[q]}" for q in queries] + [EOS_TOKEN]
    return " ".join(parts)


def make_mqar_texts(n: int, spec: MQARSpec = MQARSpec(), seed: int = 0) -> list[str]:
    """``n`` MQAR examples as text lines, a pure function of ``(n, spec, seed)``."""
    rng = random.Random(f"mqar-{seed}")
    return [_one_example(rng, spec) for _ in range(n)]


def make_mqar_datasets(
    n_train: int = 20000, n_eval: int = 512, spec: MQARSpec = MQARSpec(), seed: int = 0
):
    """A ``datasets.DatasetDict`` with ``train`` and ``validation`` splits of MQAR text (column ``text``).

    The two splits use different generator streams (``seed`` and ``seed + 1_000_003``), so no example is shared
    except by chance.
    """
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        train=Dataset.from_dict({"text": make_mqar_texts(n_train, spec, seed)}),
        validation=Dataset.from_dict({"text": make_mqar_texts(n_eval, spec, seed + 1_000_003)}),
    )


def mqar_tokenizer(spec: MQARSpec = MQARSpec(), model_max_length: int | None = None):
    """Word-level tokenizer over the MQAR vocabulary, as a ``PreTrainedTokenizerFast``.

    Ids: ``<|endoftext|>`` = 0, ``<unk>`` = 1, ``|`` = 2, keys 3 .. 3+n_keys-1, then values. Built, not trained:
    it is a function of the spec only, and is saved with the model like any other tokenizer.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1, SEP_TOKEN: 2}
    for i in range(spec.n_keys):
        vocab[f"k{i}"] = len(vocab)
    for i in range(spec.n_values):
        vocab[f"v{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs = {}
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN, **kwargs
    )


def mqar_value_positions(spec: MQARSpec = MQARSpec()) -> np.ndarray:
    """Token positions (within one example) of the recalled values in the query part."""
    start = 2 * spec.n_pairs + 1  # first query key
    return np.arange(start + 1, start + 2 * spec.n_queries, 2)


def mqar_recall_accuracy(predictions: np.ndarray, labels: np.ndarray, spec: MQARSpec = MQARSpec()) -> float:
    """Fraction of queried values predicted exactly.

    Args:
        predictions: (batch, seq) argmax token ids, ``predictions[:, t]`` being the model's guess for token t+1
            (the raw causal-LM output, not shifted).
        labels: (batch, seq) the input ids.
    """
    predictions = np.asarray(predictions)
    labels = np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 2 or predictions.shape[1] != spec.seq_len:
        raise ValueError(
            f"expected predictions and labels of shape (batch, {spec.seq_len}), got {predictions.shape} and {labels.shape}"
        )
    pos = mqar_value_positions(spec)
    return float((predictions[:, pos - 1] == labels[:, pos]).mean())
