"""Worker of tests/attention/test_affine_scaled_sync.py: a tiny affine_scaled GPT-2 trained on fixed global batches.

``--mode single`` (no launcher) trains on the whole global batch in one process; ``--mode ddp`` (under torchrun; then
again with each rank's α_ma statistic reduced over that rank alone, ``ddp-local``, the behaviour before the fix) and
``--mode deepspeed`` (under the deepspeed launcher; ZeRO-1, 2 and 3 one after the other, each from the same fresh
model) give rank r the r-th slice of every global batch. The loss is the sum of token losses divided by the global
number of target tokens (× world size, since DDP and DeepSpeed average gradients over ranks), so every mode takes
the same SGD steps. The sequences are right-padded to different lengths, so the ranks hold different numbers of
real tokens. Each process saves its final ``state_dict`` (α_ma included) to ``OUT/<mode>-rank<r>.pt``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, GPT2Config

import hf_condinit  # noqa: F401
from hf_condinit.attention.reference import randomise_holders

STEPS, GLOBAL_BATCH, SEQ, VOCAB, LR = 4, 4, 16, 64, 0.05


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="affine_scaled")
    randomise_holders(model, seed=0)  # W_a ≠ 0: α depends on the tokens from the first step on
    return model


def global_batches():
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        ids = torch.randint(1, VOCAB, (GLOBAL_BATCH, SEQ), generator=gen)
        lengths = torch.randint(3, SEQ + 1, (GLOBAL_BATCH,), generator=gen)
        yield ids, (torch.arange(SEQ) < lengths[:, None]).long()


def train(forward, step, rank: int = 0, world: int = 1) -> None:
    per = GLOBAL_BATCH // world
    for ids, mask in global_batches():
        n_global = int(mask[:, 1:].sum())
        ids, mask = ids[rank * per:(rank + 1) * per], mask[rank * per:(rank + 1) * per]
        logits = forward(input_ids=ids, attention_mask=mask).logits[:, :-1]
        labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
        step(loss / n_global * world)


def sgd_step(optimizer):
    def step(loss):
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def state(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def run_single(rank: int = 0, world: int = 1) -> dict:
    model = build().train()
    train(model, sgd_step(torch.optim.SGD(model.parameters(), lr=LR)), rank, world)
    return state(model)


def run_ddp(out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hf_condinit.attention.affine_scaled import AffineScaledHolder

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    own_group = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    for tag, group in (("ddp", None), ("ddp-local", own_group)):  # "ddp-local": α_ma reduced over this rank only
        AffineScaledHolder.process_group = group
        model = build().train()
        ddp = DistributedDataParallel(model)
        train(ddp, sgd_step(torch.optim.SGD(ddp.parameters(), lr=LR)), rank, world)
        torch.save(state(model), os.path.join(out, f"{tag}-rank{rank}.pt"))
    AffineScaledHolder.process_group = None
    dist.destroy_process_group()


def run_deepspeed(out: str) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for stage in (1, 2, 3):
        model = build().train()
        config = {
            "train_batch_size": GLOBAL_BATCH, "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0, "steps_per_print": 10**9,
        }  # fmt: skip
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                          config=config)

        def step(loss):
            engine.backward(loss)
            engine.step()

        train(engine, step, rank, world)
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            torch.save(state(model), os.path.join(out, f"zero{stage}-rank{rank}.pt"))
        engine.destroy()
    torch.distributed.destroy_process_group()
    # every file is written: leave without the interpreter's teardown, where DeepSpeed's CPU threads aborted the
    # process in ~1 run of 4 ("terminate called without an active exception"; torch 2.13, 2026-12-05)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("single", "ddp", "deepspeed"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=-1)  # passed by the deepspeed launcher
    args = parser.parse_args()
    if args.mode == "single":
        torch.save(run_single(), os.path.join(args.out, "single-rank0.pt"))
    elif args.mode == "ddp":
        run_ddp(args.out)
    else:
        run_deepspeed(args.out)
