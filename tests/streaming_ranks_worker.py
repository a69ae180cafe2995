"""One rank of ``tests/data/test_streaming_ranks.py`` (launched by torchrun, two CPU processes over gloo).

Argv: ``TEXT TOKENIZER OUT GROUP_ROWS BATCH``. Streams ``TEXT`` as ``run_clm.py --streaming`` does (this rank's rows:
``split_by_rank``; packing groups of ``GROUP_ROWS`` rows, blocks of 16 tokens) and writes ``OUT/rank<r>.json``:
``blocks`` (every block of the rank's share, read to its end), ``batches`` (the first three batches of the
``CondInitTrainer``'s training loader) and ``resumed`` (the first batch of that loader resumed after two batches).
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from accelerate import skip_first_batches  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    TrainingArguments,
    default_data_collator,
)

from hf_condinit.data import load_raw_datasets, pack_datasets, tokenize_datasets  # noqa: E402
from hf_condinit.data.streaming import split_by_rank, streamed_splits  # noqa: E402
from hf_condinit.scripts.trainer import CondInitTrainer  # noqa: E402


def main(text, tokenizer_dir, out, group_rows, batch):
    group_rows, batch = int(group_rows), int(batch)
    args = TrainingArguments(output_dir=os.path.join(out, "run"), use_cpu=True, do_train=True, max_steps=4,
                             per_device_train_batch_size=batch, report_to="none", disable_tqdm=True)
    rank, world = args.process_index, args.world_size
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    raw, column = load_raw_datasets(train_file=text, validation_split_percentage=0, streaming=True,
                                    cache_dir=os.path.join(out, f"cache{rank}"))
    raw = split_by_rank(raw, rank, world, group_rows)
    packed = pack_datasets(tokenize_datasets(raw, tokenizer, column, append_eos=True), 16, map_batch_size=group_rows)
    blocks = [block["input_ids"] for block in packed["train"]]
    train, _ = streamed_splits(packed, args)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=len(tokenizer)))
    trainer = CondInitTrainer(model=model, args=args, train_dataset=train, data_collator=default_data_collator)
    loader = iter(trainer.get_train_dataloader())
    batches = [next(loader)["input_ids"].tolist() for _ in range(3)]
    resumed = next(iter(skip_first_batches(trainer.get_train_dataloader(), 2)))["input_ids"].tolist()  # as Trainer resumes
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": world, "blocks": blocks, "batches": batches, "resumed": resumed}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
