"""Streamed text data (``--streaming``): the rows, blocks and splits of :mod:`.text` as ``datasets.IterableDataset``.

The streamed pipeline is the cached one with ``IterableDataset`` in place of ``Dataset``: the same rows (the
validation split is the same contiguous first ``validation_split_percentage`` % of the rows, from a row count made
in one pass without tokenizing: :func:`hf_condinit.data.text.split_validation`), the same blank-row filter, the same
tokenization, and packing over the same groups of ``map_batch_size`` rows (:func:`.text.pack_datasets`). A
streamed run therefore yields the same blocks in the same order as the packed ``Dataset`` of a run without
``--streaming`` (single preprocessing worker; with ``--preprocessing_num_workers N`` each of the N shards of a
cached run starts its own group of rows). Nothing of the training split is written to disk; the validation blocks
are (:func:`materialize`: evaluation needs a sized set, and its metrics are then those of the cached run).

Under DDP, FSDP or DeepSpeed each rank reads its own share of the training stream (:func:`split_by_rank`): whole
packing groups of ``PACK_GROUP_ROWS`` rows, group ``g`` to rank ``g mod W`` (``W`` the world size), so each rank
tokenizes and packs only its ``1/W`` of the text, the ranks' blocks are disjoint and together the blocks of the
one-process stream, each block packed from the same rows. The Trainer loads such a stream as it is on every rank
(:func:`mark_rows_of_rank`, :meth:`hf_condinit.scripts.trainer.CondInitTrainer.get_train_dataloader`): accelerate
neither dispatches it from rank 0 nor shards it again. Step ``s`` on rank ``r`` trains on blocks ``[s·B, (s+1)·B)``
of rank ``r``'s share (``B`` the per-device batch). A resumed run skips, on every rank, the blocks of the steps
already done (the Trainer's ``skip_first_batches``) and lands on the same next block, as long as no rank has gone
past the end of its share once.
"""

from __future__ import annotations

__all__ = ["PACK_GROUP_ROWS", "count_rows", "split_by_rank", "mark_rows_of_rank", "rows_of_rank",
           "check_first_blocks", "materialize", "streamed_splits"]

#: Rows packed together (:func:`hf_condinit.data.text.pack_datasets`' ``map_batch_size``, HF ``run_clm``'s 1000): each
#: group drops its own remainder, so a group's blocks depend on its rows alone.
PACK_GROUP_ROWS = 1000
_RANK_ATTR = "_condinit_rows_of_rank"


def count_rows(stream, batch_size: int = 10_000) -> int:
    """The number of rows of an ``IterableDataset``, read once in batches of ``batch_size`` (nothing tokenized)."""
    return sum(len(next(iter(batch.values()))) for batch in stream.iter(batch_size=batch_size))


def split_by_rank(raw, rank: int, world_size: int, group_rows: int = PACK_GROUP_ROWS):
    """The training rows rank ``rank`` of ``world_size`` reads of a streamed ``IterableDatasetDict`` ``raw``: the
    ``train`` split's packing groups ``g ≡ rank (mod world_size)`` (rows ``[g·group_rows, (g+1)·group_rows)``),
    whole, in order; the other splits as they are. Apply it after training a tokenizer on the whole split and
    before tokenizing, with ``group_rows`` the packing's ``map_batch_size``: the rank's blocks are then exactly the
    one-process stream's blocks of those groups. Returns ``raw`` with its ``train`` split replaced, or unchanged
    for one process or a map-style ``DatasetDict`` (the Trainer's sampler splits those)."""
    if world_size == 1 or hasattr(raw["train"], "num_rows"):
        return raw

    def keep(batch, indices):  # a batch is one group: its rows are kept or dropped together
        return [indices[0] // group_rows % world_size == rank] * len(indices)

    raw["train"] = raw["train"].filter(keep, with_indices=True, batched=True, batch_size=group_rows)
    return raw


def mark_rows_of_rank(stream, rank: int, world_size: int):
    """Mark ``stream`` as rank ``rank``'s own share (:func:`split_by_rank`), to be loaded as it is; returns it."""
    setattr(stream, _RANK_ATTR, (rank, world_size))
    return stream


def rows_of_rank(dataset) -> tuple[int, int] | None:
    """``(rank, world_size)`` of a stream marked by :func:`mark_rows_of_rank`, else ``None``."""
    return getattr(dataset, _RANK_ATTR, None)


def check_first_blocks(packed, block_size: int, sources: dict[str, str] | None = None) -> None:
    """Raise ``ValueError`` naming the split's source (``sources``: split → how to name it) when a streamed split
    yields no block of ``block_size`` tokens. Reads (and tokenizes) the split only up to its first block; a file
    that cannot be parsed fails here too, with the reader's message."""
    for split, stream in packed.items():
        if next(iter(stream), None) is None:
            source = (sources or {}).get(split, f"the {split} split")
            raise ValueError(f"{source} gives no block of {block_size} tokens while streaming; give more text or a "
                             f"smaller block size (--block_size / --max_seq_length).")


def materialize(stream, limit: int | None = None, cache_dir: str | None = None):
    """The blocks of ``stream`` (the first ``limit`` of them) as a map-style ``Dataset`` written to the ``datasets``
    cache (``cache_dir``), for evaluation."""
    from datasets import Dataset

    source = stream.take(limit) if limit is not None else stream
    return Dataset.from_generator(_rows, gen_kwargs={"stream": source}, cache_dir=cache_dir,
                                  features=stream.features)


def _rows(stream):
    yield from stream


def streamed_splits(lm_datasets, training_args, max_train_samples: int | None = None,
                    max_eval_samples: int | None = None, cache_dir: str | None = None):
    """``(train_dataset, eval_dataset)`` of a streamed run, as :func:`hf_condinit.scripts.lifecycle.select_splits`
    gives them for a cached one: the training stream cut to ``--max_train_samples`` blocks (``take``), the
    validation blocks (cut to ``--max_eval_samples``) made a ``Dataset`` (:func:`materialize`); ``None`` for a split
    the run does not use. Raises ``ValueError`` when evaluation has no data."""
    train_dataset = eval_dataset = None
    if training_args.do_train:
        world_size = training_args.world_size
        train_dataset = lm_datasets["train"]
        if max_train_samples is not None:
            train_dataset = train_dataset.take(-(-max_train_samples // world_size))
        if world_size > 1:
            mark_rows_of_rank(train_dataset, training_args.process_index, world_size)
    if training_args.do_eval:
        if "validation" not in lm_datasets:
            raise ValueError("--do_eval needs validation data: pass --validation_file or "
                             "--validation_split_percentage > 0")
        with training_args.main_process_first(desc="writing the validation blocks"):
            eval_dataset = materialize(lm_datasets["validation"], max_eval_samples, cache_dir)
    return train_dataset, eval_dataset
