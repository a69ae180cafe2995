"""The edges of a resume, on a tiny GPT-2 built in code (CondInitTrainer, no data files): a checkpoint at the last
step is the end of training; the run's ``train_loss`` is the same bit for bit however the run was cut."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments
from transformers.trainer_callback import TrainerState

from hf_condinit.callbacks.run_totals import STATE_KEY, RunTotalsCallback
from hf_condinit.scripts_common import CondInitTrainer

STEPS_PER_EPOCH = 4  # 16 samples, batches of 4


def _trainer(out, **kwargs):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    data = [{"input_ids": (torch.arange(8) * (i + 1)) % 32, "labels": (torch.arange(8) * (i + 1)) % 32}
            for i in range(16)]
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="steps", save_steps=1, disable_tqdm=True, seed=0,
                             lr_scheduler_type="constant", learning_rate=1e-2, **kwargs)
    return CondInitTrainer(model=model, args=args, train_dataset=data)


@pytest.mark.parametrize("length, last", [({"max_steps": 3}, 3), ({"num_train_epochs": 1.5}, 6),
                                          ({"num_train_epochs": 2}, 8)])
def test_a_checkpoint_at_the_last_step_trains_nothing(tmp_path, length, last):
    """Resumed from its last checkpoint, the stock loop skipped the trained batches and trained one step past
    ``max_steps`` (also for a fractional epoch count); here it stops at once with the checkpoint's weights and totals."""
    full = _trainer(tmp_path / "full", **length)
    full.train()
    reference = {k: v.clone() for k, v in full.model.state_dict().items()}
    ref_loss = full.run_totals.metrics(full.state.global_step)["train_loss"]
    assert full.state.global_step == last
    again = _trainer(tmp_path / "again", **length)
    again.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{last}"))
    assert again.state.global_step == last
    assert not (tmp_path / "again" / f"checkpoint-{last + 1}").exists()
    assert all(torch.equal(v, reference[k]) for k, v in again.model.state_dict().items())
    totals = again.run_totals.metrics(again.state.global_step)
    assert totals["train_loss"] == ref_loss and totals["train_segments"] == 2


def _losses(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [t for t in (torch.rand(n, generator=g, dtype=torch.float32) * 9 + 1)]


def _uninterrupted(losses):
    cb = RunTotalsCallback()
    cb.on_train_begin(None, TrainerState(global_step=0), None)
    for loss in losses:
        cb.add_loss(loss)
    return cb.metrics(len(losses))["train_loss"]


def _cut(losses, cuts):
    """The run cut at each step of ``cuts``: each segment starts from the last one's snapshot, read back from JSON as
    a checkpoint's ``trainer_state.json`` holds it."""
    state = TrainerState(global_step=0)
    bounds = [0, *cuts, len(losses)]
    for start, end in zip(bounds, bounds[1:]):
        cb = RunTotalsCallback()
        cb.on_train_begin(None, state, None)
        for loss in losses[start:end]:
            cb.add_loss(loss)
        saved = json.loads(json.dumps({STATE_KEY: cb.snapshot()}))
        state = TrainerState(global_step=end, stateful_callbacks=saved)
    return cb.metrics(len(losses))["train_loss"]


@pytest.mark.parametrize("cuts", [[30], [7, 31, 52], list(range(1, 60))])
def test_train_loss_is_the_same_bit_for_bit_however_the_run_was_cut(cuts):
    losses = _losses(60)
    assert _cut(losses, cuts) == _uninterrupted(losses)
