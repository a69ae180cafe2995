"""Offline tokenizers: train a byte-level BPE on the training text and wrap it for ``transformers``.

Used when the hub (and the GPT-2 BPE) is unreachable: the scripts train a tokenizer on the *training* split only
(never validation) and save it with the model (``trainer.save_model`` saves ``processing_class``), so a
checkpoint is self-contained and reloads with ``AutoTokenizer.from_pretrained(output_dir)``.

Note: in transformers 5, ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently builds an empty
tokenizer; build from a ``tokenizers.Tokenizer`` object (``tokenizer_object=``) or ``from_pretrained(dir)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["train_bpe_tokenizer", "batch_iterator"]


def batch_iterator(dataset, text_column: str = "text", batch_size: int = 1000) -> Iterator[list[str]]:
    """Yield lists of strings from a ``datasets.Dataset`` or ``IterableDataset`` column (or any sequence of
    dicts/strings)."""
    if hasattr(dataset, "num_rows"):
        for i in range(0, len(dataset), batch_size):
            yield dataset[i : i + batch_size][text_column]
    elif hasattr(dataset, "iter"):
        for batch in dataset.iter(batch_size=batch_size):
            yield batch[text_column]
    else:
        batch: list[str] = []
        for row in dataset:
            batch.append(row[text_column] if isinstance(row, dict) else row)
            if len(batch) == batch_size:
                yield batch
                batch = []
        if batch:
            yield batch


def train_bpe_tokenizer(
    texts: Iterable[str] | Iterable[list[str]],
    vocab_size: int = 8192,
    *,
    min_frequency: int = 2,
    special_tokens: tuple[str, ...] = ("<|endoftext|>",),
    bos_token: str | None = "<|endoftext|>",
    eos_token: str | None = "<|endoftext|>",
    unk_token: str | None = "<|endoftext|>",
    pad_token: str | None = None,
    extra_special: dict[str, str] | None = None,
    add_prefix_space: bool = False,
    model_max_length: int | None = None,
    length: int | None = None,
):
    """Train a GPT-2-style byte-level BPE and return it as a ``PreTrainedTokenizerFast``.

    Args:
        texts: strings, or batches (lists) of strings, e.g. :func:`batch_iterator` over the training split.
        vocab_size (`int`, *optional*, defaults to 8192): target vocabulary size, special tokens and the 256 byte
            symbols included. Must exceed ``256 + len(special_tokens)``.
        min_frequency (`int`, *optional*, defaults to 2): minimum pair count for a merge.
        special_tokens: tokens added first (ids 0, 1, ...), never split. For MLM pass e.g.
            ``("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")`` and map them with ``extra_special``.
        bos_token / eos_token / unk_token / pad_token: names for the ``transformers`` wrapper (``None``: unset).
        extra_special: more wrapper kwargs, e.g. ``{"mask_token": "[MASK]", "cls_token": "[CLS]"}``.
        add_prefix_space (`bool`, *optional*, defaults to False): GPT-2 behaviour is False.
        model_max_length: stored in the tokenizer config (e.g. the model's ``n_positions``).
        length: number of sequences, for the progress bar only.

    Byte-level BPE needs no unknown token (every byte is in the alphabet); ``unk_token`` defaults to the
    end-of-text token as in GPT-2. Training is deterministic for a given input order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = tuple(dict.fromkeys(special_tokens))  # dedupe, keep order
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size <= len(alphabet) + len(special_tokens):
        raise ValueError(
            f"tokenizer_vocab_size={vocab_size} is too small for a byte-level BPE: it must exceed the "
            f"{len(alphabet)} byte symbols + {len(special_tokens)} special tokens."
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=alphabet,
        show_progress=False,
    )

    def _flat() -> Iterator[str]:
        for item in texts:
            if isinstance(item, str):
                yield item
            else:
                yield from item

    tok.train_from_iterator(_flat(), trainer=trainer, length=length)
    if tok.get_vocab_size() <= len(alphabet) + len(special_tokens):
        raise ValueError("the tokenizer training text is empty: no merges could be learned")
    kwargs = dict(extra_special or {})
    for name, value in (("bos_token", bos_token), ("eos_token", eos_token), ("unk_token", unk_token), ("pad_token", pad_token)):
        if value is not None:
            kwargs[name] = value
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
