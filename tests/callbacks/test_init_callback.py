"""ConditionedInitCallback: applies the init when training starts at step 0, never on resume."""

import pytest
import torch
from packaging.version import Version
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, Trainer, TrainerState, TrainingArguments

import hf_condinit
from utils import mini_config

# A Trainer resume torch.loads the checkpoint's optimizer, scheduler and RNG state; transformers refuses that below
# torch 2.6 (CVE-2025-32434: torch.load(weights_only=True) could run code until torch 2.6), with its own error
RESUME_REFUSED = Version(torch.__version__).release < (2, 6)


class _Tokens(Dataset):
    def __init__(self, n=8, seq=8, vocab=64):
        self.data = torch.randint(3, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def _trainer(model, tmp_path, callback, **kw):
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, report_to="none", use_cpu=True,
        save_strategy="steps", save_steps=2, logging_steps=1, seed=0, **kw,
    )
    return Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback])


def test_applies_at_start_of_training(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    callback = hf_condinit.ConditionedInitCallback({"method": "conditioned", "seed": 4})
    # learning rate 0: the weights after training are the weights the callback wrote
    _trainer(model, tmp_path, callback, max_steps=1, learning_rate=0.0, warmup_steps=0).train()
    torch.manual_seed(0)
    expected = AutoModelForCausalLM.from_config(mini_config("gpt2"), condinit={"method": "conditioned", "seed": 4})
    assert torch.equal(model.transformer.h[1].attn.c_attn.weight, expected.transformer.h[1].attn.c_attn.weight)
    assert callback.report is not None and callback.report.method == "conditioned"
    assert model.config.condinit["seed"] == 4


def test_does_nothing_on_resume(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    callback = hf_condinit.ConditionedInitCallback("conditioned")
    _trainer(model, tmp_path, callback, max_steps=2, learning_rate=1e-3).train()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    resumed_callback = hf_condinit.ConditionedInitCallback("conditioned")
    state = TrainerState(global_step=2)
    resumed_callback.on_train_begin(None, state, None, model=model)
    assert resumed_callback.report is None
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    # a real resume through the Trainer: the checkpoint's weights are what training continues from
    fresh = AutoModelForCausalLM.from_config(mini_config("gpt2"))
    trainer = _trainer(fresh, tmp_path, resumed_callback, max_steps=2, learning_rate=1e-3)
    if RESUME_REFUSED:  # refused by transformers before training starts: the callback never runs
        with pytest.raises(ValueError, match=r"upgrade torch to at least v2\.6"):
            trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
        assert resumed_callback.report is None
        return
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed_callback.report is None
    assert all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())


def test_refuses_to_overwrite_pretrained_weights(tmp_path):
    AutoModelForCausalLM.from_config(mini_config("gpt2")).save_pretrained(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    callback = hf_condinit.ConditionedInitCallback("conditioned")
    with pytest.raises(ValueError, match="overwrite_loaded=True"):
        callback.on_train_begin(None, TrainerState(global_step=0), None, model=loaded)
    with pytest.raises(ValueError, match="needs an init"):
        hf_condinit.ConditionedInitCallback(False)
