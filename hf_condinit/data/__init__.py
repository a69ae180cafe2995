"""Data helpers shared by the example scripts (``run_clm.py``, ``run_mlm.py``).

- :mod:`.synthetic`: the embedded offline corpus (multi-query associative recall), generated from a seed.
- :mod:`.text`: local/hub text loading with validation, blank-line handling, validation split and packing.
- :mod:`.streaming`: the same rows and blocks as ``IterableDataset`` (``--streaming``).
- :mod:`.tokenizer`: train a byte-level BPE offline and wrap it as a ``PreTrainedTokenizerFast``.

Nothing here downloads anything unless a hub dataset name is passed explicitly.
"""

from .synthetic import (
    MQARSpec,
    make_mqar_datasets,
    make_mqar_texts,
    mqar_recall_accuracy,
    mqar_tokenizer,
    mqar_value_positions,
)
from .text import (
    check_data_file,
    drop_blank_rows,
    group_texts,
    load_raw_datasets,
    pack_datasets,
    split_sources,
    tokenize_datasets,
)
from .streaming import materialize, streamed_splits
from .tokenizer import batch_iterator, train_bpe_tokenizer

__all__ = [
    "MQARSpec",
    "make_mqar_datasets",
    "make_mqar_texts",
    "mqar_recall_accuracy",
    "mqar_tokenizer",
    "mqar_value_positions",
    "check_data_file",
    "drop_blank_rows",
    "group_texts",
    "load_raw_datasets",
    "pack_datasets",
    "split_sources",
    "tokenize_datasets",
    "materialize",
    "streamed_splits",
    "batch_iterator",
    "train_bpe_tokenizer",
]
