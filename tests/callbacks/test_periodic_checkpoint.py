"""PeriodicCheckpointCallback (``--save_minutes``): a checkpoint at the first step end at least the interval after the
start of training or after the last save, whichever saved it, and none at the last step.

Reference: the steps worked out by hand for a clock that advances one second per optimizer step (a fake clock, so
the test does not depend on how fast the machine is)."""

import os

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_condinit.callbacks import PeriodicCheckpointCallback
from hf_condinit.scripts.arguments import CondInitArguments
from hf_condinit.scripts.trainer import make_periodic_checkpoint_callback


class _Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)}


class _Tick(TrainerCallback):
    """Advances the fake clock by one second at the start of every optimizer step."""

    def __init__(self, clock):
        self.clock = clock

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock[0] += 1.0


def _saved_steps(tmp_path, every_seconds, **args):
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(4, generator=g), "y": torch.randn((), generator=g)} for _ in range(40)]
    clock = [0.0]
    callbacks = [_Tick(clock)]
    if every_seconds:
        callbacks.append(PeriodicCheckpointCallback(every_seconds, clock=lambda: clock[0]))
    kw = dict(output_dir=str(tmp_path), max_steps=10, per_device_train_batch_size=2, report_to=[], use_cpu=True,
              disable_tqdm=True, save_strategy="no", logging_strategy="no", save_only_model=True)
    kw.update(args)
    Trainer(model=_Regression(), args=TrainingArguments(**kw), train_dataset=data, callbacks=callbacks).train()
    return sorted(int(n.split("-")[1]) for n in os.listdir(tmp_path) if n.startswith("checkpoint-"))


def test_a_checkpoint_every_interval_and_none_at_the_last_step(tmp_path):
    assert _saved_steps(tmp_path / "off", 0) == []
    assert _saved_steps(tmp_path / "three", 3) == [3, 6, 9]
    assert _saved_steps(tmp_path / "five", 5) == [5]  # step 10 is the last: the run's own final save follows


def test_any_save_starts_the_interval_again(tmp_path):
    # --save_steps 4 saves at 4, 8 and the last step; the callback at 3 (3 s after the start) and 7 (3 s after step
    # 4's save), not at 11 (3 s after step 8's): the run ends at 10
    assert _saved_steps(tmp_path, 3, save_strategy="steps", save_steps=4) == [3, 4, 7, 8, 10]


def test_the_script_flag(tmp_path):
    trainer = Trainer(model=_Regression(), args=TrainingArguments(output_dir=str(tmp_path), report_to=[],
                                                                  use_cpu=True))
    assert make_periodic_checkpoint_callback(CondInitArguments(), trainer) is None
    callback = make_periodic_checkpoint_callback(CondInitArguments(save_minutes=1.5), trainer)
    assert callback.every_seconds == 90.0 and callback in trainer.callback_handler.callbacks
    with pytest.raises(ValueError, match="every_seconds must be > 0"):
        PeriodicCheckpointCallback(0)


def test_run_clm_saves_by_the_clock(tmp_path):
    """``--save_minutes`` through a script: an interval shorter than any step saves after every step but the last
    (the run's own final save), with ``--save_strategy no``."""
    from utils import load_script

    out = tmp_path / "out"
    load_script("run_clm.py").main([
        "--output_dir", str(out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none", "--seed", "7",
        "--cache_dir", str(tmp_path / "cache"), "--max_steps", "3", "--synthetic_train_examples", "64",
        "--synthetic_eval_examples", "16", "--save_strategy", "no", "--save_minutes", "1e-9",
    ])  # fmt: skip
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    assert (out / "train_results.json").exists()
