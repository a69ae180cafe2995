"""ConditionNumberCallback inside a real (tiny, CPU) Trainer run."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

from hf_condinit.callbacks import ConditionNumberCallback, build_probe


def _tiny_gpt2():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                               bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(cfg)


def _dataset(n=8, length=16, same_first_token=True):
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        ids = torch.randint(1, 64, (length,), generator=g)
        if same_first_token:
            ids[0] = 1  # like a BOS token: the probe builder must avoid repeating it
        rows.append({"input_ids": ids.tolist(), "labels": ids.tolist()})
    return rows


class _LogSpy(TrainerCallback):
    """Runs after the reporters, like a report_to integration would see on_log."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(dict(logs or {}))


def _args(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, report_to="none",
                             use_cpu=True, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, **kw)


def test_callback_logs_every_step(tmp_path):
    model = _tiny_gpt2()
    ds = _dataset()
    cb = ConditionNumberCallback(probe_size=2, probe_length=8, every_n_steps=1)  # probe from trainer.train_dataset
    spy = _LogSpy()
    trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=ds, callbacks=[cb, spy])
    cb.bind(trainer)
    trainer.train()

    # the probe avoided the shared first token
    assert cb.probe_input_ids.shape == (2, 8)
    assert cb.probe_input_ids[0, 0] != cb.probe_input_ids[1, 0]

    lines = (tmp_path / "condition_number.jsonl").read_text().strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert r["log"]["kappa/layer_0/mean"] > 0 and len(r["layers"]) == 2
        assert len(r["layers"][1]["heads"]) == 2

    kappa_steps = [e["step"] for e in trainer.state.log_history if "kappa/layer_0/mean" in e]
    assert kappa_steps == [0, 1, 2, 3]
    for e in trainer.state.log_history:
        if "kappa/layer_0/mean" in e:
            assert {"kappa/layer_0/max", "kappa/layer_0/bound", "kappa/layer_1/mean", "kappa/mean"} <= set(e)
    # values logged == values written
    first = next(e for e in trainer.state.log_history if "kappa/layer_0/mean" in e)
    assert first["kappa/layer_0/mean"] == records[0]["log"]["kappa/layer_0/mean"]
    # a later callback (as a report_to integration) saw the kappa logs through on_log
    assert sum("kappa/layer_0/mean" in logs for logs in spy.seen) == 4
    # weights changed, so κ changed
    assert records[0]["log"]["kappa/layer_0/mean"] != records[3]["log"]["kappa/layer_0/mean"]


def test_callback_interval_and_unbound_fallback(tmp_path):
    model = _tiny_gpt2()
    ds = _dataset(same_first_token=False)
    ids, mask = build_probe(ds, 2, 8)
    path = tmp_path / "sub" / "k.jsonl"
    cb = ConditionNumberCallback(ids, mask, every_n_steps=2, layers=[-1], heads=[0], jsonl_path=str(path))
    trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=ds, callbacks=[cb])  # not bound
    trainer.train()
    records = [json.loads(line) for line in path.read_text().strip().splitlines()]
    assert [r["step"] for r in records] == [0, 2]
    assert [lc["layer"] for lc in records[0]["layers"]] == [1]
    steps = [e["step"] for e in trainer.state.log_history if "kappa/layer_1/mean" in e]
    assert steps == [0, 2]


def test_callback_argument_checks():
    with pytest.raises(ValueError, match="at most one"):
        ConditionNumberCallback(torch.ones(2, 4, dtype=torch.long), dataset=[{"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match=">= 0"):
        ConditionNumberCallback(every_n_steps=-1)
    with pytest.raises(ValueError, match="no probe"):  # neither probe nor dataset nor bound trainer
        ConditionNumberCallback()._probe(_tiny_gpt2())


def test_build_probe_pads_short_examples():
    ds = [{"input_ids": [5, 6, 7]}, {"input_ids": torch.tensor([8, 9, 10, 11, 12])}]
    ids, mask = build_probe(ds, 2, 4, pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_a_resume_drops_the_lines_written_after_its_checkpoint(tmp_path):
    """A run killed after its checkpoint at step 5 had measured step 10 and was cut short writing the next line: the
    resumed run (training begins at step 5) keeps steps 0 and 5 only, and measures the rest again. A run that begins
    at step 0 leaves the file alone."""
    from transformers import TrainerControl, TrainerState

    from hf_condinit.reporting.runs import read_kappa_records

    path = tmp_path / "condition_number.jsonl"
    lines = [json.dumps({"step": s, "log": {"kappa/mean": float(s + 1)}}) + "\n" for s in (0, 5, 10)]
    written = "".join(lines) + lines[-1][:9]
    cb = ConditionNumberCallback(probe_input_ids=torch.ones(2, 4, dtype=torch.long), every_n_steps=3,
                                 at_train_begin=False)
    state = TrainerState()
    whole_but_newline = lines[0] + lines[1][:-1]  # a kill between a record and its newline: the newline is added
    for step, before, left in ((0, written, written), (5, written, lines[0] + lines[1]),
                               (5, whole_but_newline, lines[0] + lines[1])):
        path.write_text(before)
        state.global_step = step
        cb.on_train_begin(_args(tmp_path), state, TrainerControl())
        assert path.read_text() == left, step
    assert [r.step for r in read_kappa_records(str(path))] == [0, 5]
