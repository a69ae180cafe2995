"""Zero-shot scoring of a causal LM on minimal pairs (BLiMP) and multiple-choice sentence sets.

Data: a folder of ``*.jsonl`` files, one *paradigm* per file (its name without ``.jsonl``), one item per line:

- a minimal pair ``{"sentence_good": ..., "sentence_bad": ...}`` (BLiMP's form), or
- a multiple-choice item ``{"choices": [s0, s1, ...], "label": i}``,

with an optional grouping key (``"field"`` for BLiMP: morphology, syntax, semantics, syntax_semantics; a ``/`` in
a group name is read as ``_``, so BLiMP's one ``"syntax/semantics"`` paradigm, principle_A_case_2, joins
``syntax_semantics``). Other keys are ignored. A pair is the two-choice item ``choices=[good, bad], label=0``.

Score of a sentence: its total log-probability under the model, the sum over its tokens of ``log p(token | prefix +
earlier tokens)`` (natural log). The sentence is tokenized as it is (no leading space, no special tokens added by
the tokenizer), after one *prefix* token:

- ``"eos"`` (default): the tokenizer's EOS token, i.e. the sentence is scored as the start of a new document
  (GPT-2's ``<|endoftext|>``; the project's BPE tokenizers use the same token for BOS and EOS). This is what
  lm-evaluation-harness does for an empty context (its ``prefix_token_id``: the BOS token when the tokenizer has
  one, else EOS, i.e. the same token for GPT-2-style tokenizers);
- ``"bos"``: the tokenizer's BOS token;
- ``"none"``: no prefix; the first token has no context, so its log-probability is **not** scored (the sum runs
  over tokens 2..n). A one-token sentence then scores 0.

An item is right when the labelled choice scores **strictly** higher than every other choice (a pair: good > bad).
Exact ties count as wrong (lm-evaluation-harness's ``argmax`` counts a tie as the first choice, i.e. right for
BLiMP; this only matters for identical sentences, e.g. two pairs of BLiMP's principle_A_case_2).

Batching: sentences are sorted by length, batched, right-padded and given an attention mask; with right padding and
causal attention no real token sees a pad token, and the absolute positions are those of the unpadded sentence,
so batched scores equal one-sentence-at-a-time scores up to float rounding (tested). Token log-probabilities are
computed in float32 (``log_softmax`` of the logits cast to float32) and summed in float64.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from .binomial import INTERVAL, accuracy_stats

__all__ = [
    "PREFIXES",
    "MinimalPairItem",
    "MinimalPairSet",
    "load_minimal_pairs",
    "prefix_token_id",
    "sentence_log_probs",
    "score_items",
    "summarize",
    "summarize_recorded",
    "tail_log_probs",
]

PREFIXES = ("eos", "bos", "none")


@dataclass(frozen=True)
class MinimalPairItem:
    """One item: ``choices`` (sentences), the index ``label`` of the right one, its ``paradigm`` (file name) and
    ``group`` (the grouping key's value, ``None`` without one)."""

    choices: tuple[str, ...]
    label: int
    paradigm: str
    group: str | None = None


@dataclass
class MinimalPairSet:
    """The items of a folder (:func:`load_minimal_pairs`), in file-name order then line order."""

    folder: str
    items: list[MinimalPairItem] = field(default_factory=list)

    @property
    def paradigms(self) -> list[str]:
        return list(dict.fromkeys(it.paradigm for it in self.items))

    def __len__(self) -> int:
        return len(self.items)


def _item_from_record(rec, where: str, paradigm: str, group_key: str | None) -> MinimalPairItem:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: not a JSON object")
    if "sentence_good" in rec and "sentence_bad" in rec:
        choices, label = (rec["sentence_good"], rec["sentence_bad"]), 0
    elif "choices" in rec and "label" in rec:
        choices, label = tuple(rec["choices"]), rec["label"]
        if len(choices) < 2 or not isinstance(label, int) or not 0 <= label < len(choices):
            raise ValueError(f"{where}: 'choices' needs at least 2 sentences and 'label' an index into them")
    else:
        raise ValueError(f"{where}: an item needs 'sentence_good' and 'sentence_bad' (or 'choices' and 'label')")
    if not all(isinstance(c, str) and c.strip() for c in choices):
        raise ValueError(f"{where}: every sentence must be a non-empty string")
    group = rec.get(group_key) if group_key else None
    return MinimalPairItem(tuple(choices), label, paradigm, None if group is None else str(group).replace("/", "_"))


def load_minimal_pairs(folder: str, *, group_key: str | None = "field", paradigms=None) -> MinimalPairSet:
    """Read every ``*.jsonl`` of ``folder`` (module docstring). ``paradigms``: only these file names (without
    ``.jsonl``). Raises ``ValueError`` (one line, naming the file and line) for a missing folder, a folder without
    ``.jsonl`` files, an unknown paradigm or a malformed line."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such folder (expected a folder of *.jsonl minimal-pair files, e.g. "
                         f"../shared/data/blimp)")
    files = sorted(glob.glob(os.path.join(folder, "*.jsonl")))
    if not files:
        raise ValueError(f"{folder}: holds no *.jsonl files (expected one file of minimal pairs per paradigm)")
    by_name = {os.path.basename(f)[: -len(".jsonl")]: f for f in files}
    if paradigms is not None:
        unknown = [p for p in paradigms if p not in by_name]
        if unknown:
            raise ValueError(f"{folder}: no {', '.join(p + '.jsonl' for p in unknown)}")
        by_name = {p: by_name[p] for p in paradigms}
    out = MinimalPairSet(folder)
    for name, path in by_name.items():
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not JSON ({e})") from None
                out.items.append(_item_from_record(rec, where, name, group_key))
    if not out.items:
        raise ValueError(f"{folder}: the *.jsonl files hold no items")
    return out


def prefix_token_id(tokenizer, prefix: str) -> int | None:
    """The id prepended to every sentence for ``prefix`` in :data:`PREFIXES` (``None`` for ``"none"``). Raises
    ``ValueError`` when the tokenizer has no such token."""
    if prefix not in PREFIXES:
        raise ValueError(f"prefix {prefix!r}: choose one of {', '.join(PREFIXES)}")
    if prefix == "none":
        return None
    token_id = getattr(tokenizer, f"{prefix}_token_id", None)
    if token_id is None:
        raise ValueError(f"prefix {prefix!r}: the tokenizer has no {prefix.upper()} token; pass another prefix")
    return int(token_id)


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def context_length(config) -> int | None:
    """The longest sequence a model of ``config`` takes (``n_positions``, ``max_position_embeddings`` or ``n_ctx``,
    the first that is an int), or None for a model without a positional limit."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    return None


def sentence_log_probs(model, tokenizer, sentences, *, batch_size: int = 64, prefix: str = "eos", device=None,
                       show_progress: bool = False, desc: str = "scoring") -> torch.Tensor:
    """Total log-probability of each sentence (module docstring), as a float64 tensor of shape ``(len(sentences),)``.

    ``model``: a causal LM returning ``logits`` of shape (batch, length, vocab); it is run in eval mode under
    ``torch.inference_mode`` (its training mode is restored afterwards) on ``device`` (default: where its
    parameters are; the model is not moved). Sentences longer than the model's context raise ``ValueError``."""
    first = prefix_token_id(tokenizer, prefix)
    encoded = tokenizer(list(sentences), add_special_tokens=False)["input_ids"]
    ids = [([first] if first is not None else []) + list(e) for e in encoded]
    context = context_length(model.config)
    longest = max((len(x) for x in ids), default=0)
    if context is not None and longest > context:
        raise ValueError(f"a sentence has {longest} tokens (with the prefix); the model's context is {context}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (first if first is not None else 0)
    return tail_log_probs(model, ids, [max(len(x) - 1, 0) for x in ids], pad_id=pad_id, batch_size=batch_size,
                          device=device, show_progress=show_progress, desc=desc)


def tail_log_probs(model, sequences, n_scored, *, pad_id: int = 0, batch_size: int = 64, device=None,
                   show_progress: bool = False, desc: str = "scoring") -> torch.Tensor:
    """Sum of ``log p(token | earlier tokens)`` over the last ``n_scored[i]`` tokens of each token-id list
    ``sequences[i]`` (``n_scored[i] <= len(sequences[i]) - 1``: the first token is never scored), as a float64
    tensor of shape ``(len(sequences),)``; what :func:`sentence_log_probs` and the cloze scores
    (:mod:`hf_condinit.evaluation.cloze`) are made of. Batching, padding, precision and the model's mode and device
    as in the module docstring and :func:`sentence_log_probs`; ``pad_id`` fills the right padding (never seen by a
    real token)."""
    if len(n_scored) != len(sequences) or any(not 0 <= n < max(len(s), 1) for s, n in zip(sequences, n_scored)):
        raise ValueError("n_scored: one count per sequence, at most its length minus one")
    device = torch.device(device) if device is not None else _model_device(model)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))  # longest first: memory trouble at once
    scores = torch.zeros(len(sequences), dtype=torch.float64)
    starts = range(0, len(order), batch_size)
    if show_progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in starts:
                rows = [i for i in order[start : start + batch_size] if n_scored[i] > 0]
                if not rows:  # nothing to score, e.g. one token without a prefix
                    continue
                width = max(len(sequences[i]) for i in rows)
                batch = torch.full((len(rows), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                scored = torch.zeros((len(rows), width - 1), dtype=torch.bool)  # scored[r, j]: token j + 1 counts
                for r, i in enumerate(rows):
                    n = len(sequences[i])
                    batch[r, :n] = torch.tensor(sequences[i])
                    mask[r, :n] = 1
                    scored[r, n - 1 - n_scored[i] : n - 1] = True
                batch, mask, scored = batch.to(device), mask.to(device), scored.to(device)
                logits = model(input_ids=batch, attention_mask=mask, use_cache=False).logits[:, :-1].float()
                token_lp = torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]
                scores[rows] = token_lp.masked_fill(~scored, 0.0).double().sum(dim=1).cpu()
    finally:
        model.train(was_training)
    return scores


def score_items(model, tokenizer, items, *, batch_size: int = 64, prefix: str = "eos", device=None,
                show_progress: bool = False) -> tuple[list[list[float]], list[bool]]:
    """Score every choice of every item once (a sentence shared by several items is scored once). Returns
    ``(scores, correct)``: per item the choices' total log-probabilities, and whether the labelled choice is
    strictly the highest."""
    unique = list(dict.fromkeys(s for it in items for s in it.choices))
    position = {s: i for i, s in enumerate(unique)}
    lp = sentence_log_probs(model, tokenizer, unique, batch_size=batch_size, prefix=prefix, device=device,
                            show_progress=show_progress).tolist()
    scores = [[lp[position[s]] for s in it.choices] for it in items]
    correct = [all(sc[it.label] > v for j, v in enumerate(sc) if j != it.label) for it, sc in zip(items, scores)]
    return scores, correct


def _accuracy(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan


def _stats(rows: list[tuple[int, bool]]) -> dict:
    """:func:`~hf_condinit.evaluation.binomial.accuracy_stats` of ``rows`` = [(number of choices, right)]: chance is
    the mean over the items of 1 / (number of choices), 0.5 for minimal pairs."""
    chance = sum(1 / k for k, _ in rows) / len(rows)
    return accuracy_stats(sum(ok for _, ok in rows), len(rows), chance)


def summarize(items, correct, name: str, prefix: str) -> dict:
    """Accuracies (fractions in [0, 1]) of scored items, under keys named ``name``:

    - ``<name>_accuracy`` (over all items), ``<name>_field_accuracy`` ({group: accuracy}; items without a group left
      out; ``{}`` when none has one), ``<name>_paradigm_accuracy`` ({paradigm: accuracy}), ``<name>_n_pairs``
      (items scored), ``<name>_prefix``;
    - with their binomial intervals (:mod:`hf_condinit.evaluation.binomial`: Wilson 95 %, ``<name>_interval``
      names it): ``<name>_n_correct``, ``<name>_chance`` (0.5 for pairs), ``<name>_ci95`` ([low, high]),
      ``<name>_vs_chance`` ("above" / "at" / "below"), ``<name>_at_chance`` (the interval contains chance), and per
      group and per paradigm the same in ``<name>_field_stats`` / ``<name>_paradigm_stats`` ({key: {"n",
      "correct", "accuracy", "ci95", "chance", "vs_chance", "at_chance"}}; per-paradigm flags are not corrected for
      the number of paradigms)."""
    by_group, by_paradigm = defaultdict(list), defaultdict(list)
    for it, ok in zip(items, correct):
        by_paradigm[it.paradigm].append((len(it.choices), bool(ok)))
        if it.group is not None:
            by_group[it.group].append((len(it.choices), bool(ok)))
    overall = _stats([(len(it.choices), bool(ok)) for it, ok in zip(items, correct)]) if items else None
    out = {
        f"{name}_accuracy": _accuracy(list(correct)),
        f"{name}_field_accuracy": {g: _accuracy([ok for _, ok in v]) for g, v in sorted(by_group.items())},
        f"{name}_paradigm_accuracy": {p: _accuracy([ok for _, ok in v]) for p, v in sorted(by_paradigm.items())},
        f"{name}_n_pairs": len(correct),
        f"{name}_prefix": prefix,
        f"{name}_interval": INTERVAL,
        f"{name}_field_stats": {g: _stats(v) for g, v in sorted(by_group.items())},
        f"{name}_paradigm_stats": {p: _stats(v) for p, v in sorted(by_paradigm.items())},
    }
    if overall is not None:
        out[f"{name}_n_correct"] = overall["correct"]
        out.update({f"{name}_{k}": overall[k] for k in ("chance", "ci95", "vs_chance", "at_chance")})
    return out


def summarize_recorded(recorded: dict, pairs: MinimalPairSet, name: str = "blimp") -> dict:
    """:func:`summarize` (intervals included) rebuilt from a record that keeps only accuracies (``<name>_accuracy``
    per paradigm, as the harness records made before the intervals do), given the item set ``pairs`` it was scored
    on: each paradigm's count of right items is its accuracy × its number of items (an exact integer; checked).
    Raises ``ValueError`` when the record's paradigms or counts do not fit ``pairs``."""
    accuracies = recorded.get(f"{name}_paradigm_accuracy") or {}
    by_paradigm = defaultdict(list)
    for it in pairs.items:
        by_paradigm[it.paradigm].append(it)
    if set(accuracies) != set(by_paradigm) or recorded.get(f"{name}_n_pairs") != len(pairs):
        raise ValueError(f"the record's {name} paradigms / pair count do not match the {len(pairs)} items of "
                         f"{pairs.folder}")
    items, correct = [], []
    for paradigm, group in by_paradigm.items():
        k = round(accuracies[paradigm] * len(group))
        if abs(k / len(group) - accuracies[paradigm]) > 1e-9:
            raise ValueError(f"{paradigm}: accuracy {accuracies[paradigm]} is no count out of {len(group)} items")
        items += group
        correct += [True] * k + [False] * (len(group) - k)
    return summarize(items, correct, name, recorded.get(f"{name}_prefix", "eos"))
