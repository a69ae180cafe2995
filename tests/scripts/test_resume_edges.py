"""The edges of a resume, on tiny models and data built in code (no data files): a checkpoint at the last step is the
end of training (a rerun, or ``--resume_from_checkpoint``, finishes the run from it, equal to the uninterrupted run);
a run killed while writing its final files is finished by the rerun; every checkpoint file corrupted at its own size
is refused by name; a non-finite loss just after a resume names the checkpoints; ``train_loss`` is the same bit for
bit however the run was cut."""

import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments
from transformers.trainer_callback import TrainerState

from hf_condinit.callbacks import NonFiniteLossError
from hf_condinit.callbacks.run_totals import STATE_KEY, RunTotalsCallback
from hf_condinit import checkpoints
from hf_condinit.scripts_common import CondInitTrainer, UsageError, find_last_checkpoint, run_main
from utils import load_script, needs_trainer_resume

run_clm = load_script("run_clm.py")

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


@needs_trainer_resume
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
    # the CPU seconds span the segments: the checkpoint's count is carried on
    with open(tmp_path / "full" / f"checkpoint-{last}" / "trainer_state.json") as f:
        saved = json.load(f)["stateful_callbacks"][STATE_KEY]["cpu_seconds"]
    assert 0 < saved <= totals["train_cpu_seconds"]


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


# ---------------------------------------------------------------------------------------- checkpoint content digests


def _corrupt(path, n=4096):
    """``n`` bytes (half the file when smaller) of the file at ``path`` inverted, in its middle: the size is kept."""
    size = os.path.getsize(path)
    n = min(n, max(size // 2, 1))
    with open(path, "r+b") as f:
        f.seek((size - n) // 2)
        data = f.read(n)
        f.seek((size - n) // 2)
        f.write(bytes(b ^ 0xFF for b in data))
    assert os.path.getsize(path) == size


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("digests") / "run"
    _trainer(out, max_steps=3).train()
    return out


def test_every_file_corrupted_at_its_size_is_refused_by_name(three_checkpoints, tmp_path, caplog):
    manifest = json.loads((three_checkpoints / "checkpoint-3" / checkpoints.MANIFEST_NAME).read_text())
    assert set(manifest[checkpoints.DIGEST]) == set(manifest["files"]) >= {"model.safetensors", "optimizer.pt"}
    for rel in [*manifest["files"], checkpoints.MANIFEST_NAME]:
        out = tmp_path / rel.replace(os.sep, "_")
        shutil.copytree(three_checkpoints, out)
        _corrupt(out / "checkpoint-3" / rel)
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert checkpoints.newest_complete_checkpoint(str(out)) == str(out / "checkpoint-2"), rel
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and f"skipping {out / 'checkpoint-3'}: {rel} " in warnings[0], warnings
        with pytest.raises(UsageError, match=f"checkpoint-3: {re.escape(rel)} "):
            find_last_checkpoint(SimpleNamespace(output_dir=str(tmp_path / "new"), do_train=True,
                                                 resume_from_checkpoint=str(out / "checkpoint-3")))


@needs_trainer_resume
def test_a_non_finite_loss_after_a_resume_names_the_checkpoints(three_checkpoints, tmp_path):
    """A checkpoint damaged where no check looks (here: NaN weights written in its format, its manifest gone as in an
    older version's checkpoint) makes the resumed run diverge at once: the error names that checkpoint and the
    previous complete one, not the init."""
    damaged = tmp_path / "run"
    shutil.copytree(three_checkpoints, damaged)
    weights = load_file(damaged / "checkpoint-2" / "model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()},
              str(damaged / "checkpoint-2" / "model.safetensors"), metadata={"format": "pt"})
    os.remove(damaged / "checkpoint-2" / checkpoints.MANIFEST_NAME)
    with pytest.raises(NonFiniteLossError) as err:
        _trainer(tmp_path / "again", max_steps=3).train(resume_from_checkpoint=str(damaged / "checkpoint-2"))
    message = str(err.value)
    assert f"after resuming from {damaged / 'checkpoint-2'}, which may be damaged" in message, message
    assert f"--resume_from_checkpoint {damaged / 'checkpoint-1'}" in message and "check the init" not in message, message


# -------------------------------------------------------------------------- run_clm.py: killed after the last step

def _clm_argv(out, *extra):
    return ["--output_dir", str(out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none", "--seed", "7",
            "--init", "conditioned", "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2",
            "--lr_scheduler_type", "constant", "--per_device_train_batch_size", "8",
            "--synthetic_train_examples", "128", "--synthetic_eval_examples", "32",
            *extra]  # fmt: skip


def _results(out):
    return (load_file(out / "model.safetensors"), json.loads((out / "eval_results.json").read_text())["eval_loss"],
            json.loads((out / "train_results.json").read_text()), json.loads((out / "trainer_state.json").read_text()))


@pytest.fixture(scope="module")
def clm_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("edges") / "reference"
    run_main(run_clm.main, _clm_argv(out), prog="run_clm.py")
    return out


def _truncate(path):
    open(path, "w").close()


KILLED_AFTER_TRAINING = {  # what a kill after checkpoint-4 left of the final files
    "before the final model": lambda out: [os.remove(out / n) for n in (
        "model.safetensors", "train_results.json", "eval_results.json", "all_results.json", "trainer_state.json")],
    "while train_results.json was written": lambda out: (
        _truncate(out / "train_results.json"), _truncate(out / "all_results.json"), os.remove(out / "eval_results.json")),
    "during the evaluation": lambda out: os.remove(out / "eval_results.json"),
}
CLAIM = "import sys; from hf_condinit import locks; locks.lock_output_dir(sys.argv[1])"


@needs_trainer_resume
@pytest.mark.parametrize("when", KILLED_AFTER_TRAINING)
def test_a_run_killed_after_its_last_checkpoint_is_finished_by_the_rerun(clm_reference, tmp_path, when):
    """The rerun resumes from checkpoint-4 (max_steps 4, of 16 steps per epoch), trains nothing (the stock loop trained a
    step 5), writes the final files and ends
    with the uninterrupted run's weights, eval_loss and train_loss, bit for bit."""
    out = tmp_path / "run"
    shutil.copytree(clm_reference, out)
    KILLED_AFTER_TRAINING[when](out)
    subprocess.run([sys.executable, "-c", CLAIM, str(out)], check=True)  # the killed run's lock record is left
    run_main(run_clm.main, _clm_argv(out), prog="run_clm.py")
    _assert_same_run(out, clm_reference)


@needs_trainer_resume
def test_resume_from_the_last_checkpoint_finishes_the_run(clm_reference, tmp_path):
    out = tmp_path / "run"
    run_main(run_clm.main, _clm_argv(out, "--resume_from_checkpoint", str(clm_reference / "checkpoint-4")),
             prog="run_clm.py")
    _assert_same_run(out, clm_reference)


def _assert_same_run(out, reference):
    weights, eval_loss, train, state = _results(out)
    ref_weights, ref_eval_loss, ref_train, _ = _results(reference)
    assert state["global_step"] == 4 and not (out / "checkpoint-5").exists()
    assert weights.keys() == ref_weights.keys() and all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    assert eval_loss == ref_eval_loss and train["train_loss"] == ref_train["train_loss"]


def _model_trainer(out, build, batch, **kwargs):
    torch.manual_seed(0)
    model = build()
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="steps", save_steps=2, max_steps=4, disable_tqdm=True,
                             seed=0, lr_scheduler_type="constant", learning_rate=1e-2, **kwargs)
    return CondInitTrainer(model=model, args=args, train_dataset=[batch(i) for i in range(16)])


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=32, image_size=8, patch_size=4, num_labels=3))


def _vit_batch(i):
    g = torch.Generator().manual_seed(i)
    return {"pixel_values": torch.randn(3, 8, 8, generator=g), "labels": torch.tensor(i % 3)}


def _moe():
    from transformers import Qwen3MoeConfig

    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2))


def _lm_batch(i):
    ids = (torch.arange(8) * (i + 1)) % 32
    return {"input_ids": ids, "labels": ids}


@needs_trainer_resume
@pytest.mark.parametrize("build, batch", [(_vit, _vit_batch), (_moe, _lm_batch)], ids=["vit-renamed", "moe-fused"])
def test_a_checkpoint_in_the_original_format_resumes_exactly(tmp_path, build, batch):
    """transformers saves these models under their original names (ViT's renamed modules; MoE experts one per
    expert), which the stock resume cannot load: it warned and trained on from the new model's weights. The resumed
    run ends with the uninterrupted run's weights, bit for bit."""
    full = _model_trainer(tmp_path / "full", build, batch)
    full.train()
    saved = load_file(str(tmp_path / "full" / "checkpoint-2" / "model.safetensors"))
    assert not set(saved) <= set(full.model.state_dict())  # the checkpoint really is in another format
    again = _model_trainer(tmp_path / "again", build, batch)
    again.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    reference = full.model.state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in again.model.state_dict().items())


@needs_trainer_resume
def test_a_checkpoint_that_leaves_a_weight_unset_is_refused(tmp_path):
    full = _trainer(tmp_path / "full", max_steps=2)
    full.train()
    folder = tmp_path / "full" / "checkpoint-1"
    weights = load_file(str(folder / "model.safetensors"))
    weights.pop("transformer.h.0.attn.c_attn.weight")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"checkpoint-1 holds no weights for 1 parameters .*c_attn.weight"):
        _trainer(tmp_path / "again", max_steps=2).train(resume_from_checkpoint=str(folder))
