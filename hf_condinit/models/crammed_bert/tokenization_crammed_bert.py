"""WordPiece tokenizer for Crammed BERT, trained offline on the pretraining text with the ``tokenizers`` library.

Cramming trains its own uncased WordPiece vocabulary (32768 entries) on the pretraining corpus; this does the same at
any size. The result is a ``transformers`` fast tokenizer with ``[PAD]``=0, ``[UNK]``, ``[CLS]``, ``[SEP]``,
``[MASK]``, BERT post-processing (``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]``) and no ``token_type_ids`` (Crammed
BERT has no segment embeddings); ``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round-trip offline.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SPECIAL_TOKENS", "train_wordpiece_tokenizer"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece_tokenizer(
    texts: Iterable[str] | Iterable[list[str]],
    vocab_size: int = 32768,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    model_max_length: int | None = None,
):
    """Train an uncased BERT-style WordPiece tokenizer and wrap it for ``transformers``.

    Args:
        texts: strings or batches (lists) of strings (the *training* text only).
        vocab_size (`int`, *optional*, defaults to 32768): target vocabulary size (special tokens included).
        lowercase (`bool`, *optional*, defaults to `True`): BERT normaliser lowercasing (and accent stripping).
        min_frequency (`int`, *optional*, defaults to 2): minimum count of a merged piece.
        model_max_length (`int`, *optional*): stored in the tokenizer config (e.g. the model's max length).

    Returns:
        A ``PreTrainedTokenizerFast`` with ``model_input_names = ["input_ids", "attention_mask"]``.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens.")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS)
    )

    def _flatten():
        for item in texts:
            if isinstance(item, str):
                yield item
            else:
                yield from item

    tok.train_from_iterator(_flatten(), trainer=trainer)
    if tok.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("The WordPiece tokenizer learned no vocabulary: the training text is empty.")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    kwargs = {}
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
        **kwargs,
    )
