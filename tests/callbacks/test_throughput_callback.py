"""ThroughputCallback in a real (tiny, CPU) Trainer run, and the shared FLOPs / peak accounting of hf_condinit.perf."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

from hf_condinit import perf
from hf_condinit.callbacks import ThroughputCallback, add_throughput_callback
from utils import mini_config

BATCH, SEQ = 2, 12


class _Reporter(TrainerCallback):
    """Stands for a report_to integration: passed in ``callbacks=``, it reads the logs dict in on_log."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(dict(logs or {}))


def _model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(mini_config("gpt2"))


def _rows(n=8):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(1, 64, (SEQ,), generator=g).tolist()), "labels": ids} for _ in range(n)]


def test_matmul_parameters_counts_tied_head_once_and_skips_lookups():
    model = _model()
    total = sum(p.numel() for p in model.parameters())  # wte (tied with lm_head) + wpe + blocks + ln_f
    assert perf.matmul_parameters(model) == total - model.transformer.wpe.weight.numel()
    n, layers, width = perf.model_flops_shape(model)
    assert (layers, width) == (2, 32)
    # 6·N per token + 12·L·D·T per token
    assert perf.training_flops(n, layers, width, 3, 5) == 6 * n * 15 + 12 * layers * width * 15 * 5


def test_peak_table():
    assert perf.peak_bf16_flops_for_name("NVIDIA H200") == 989e12
    assert perf.peak_bf16_flops_for_name("NVIDIA H200 NVL") == 835e12  # not the SXM part's 989
    assert perf.peak_bf16_flops_for_name("NVIDIA H100 80GB HBM3") == 989e12
    assert perf.peak_bf16_flops_for_name("NVIDIA A100-SXM4-80GB") == 312e12
    assert perf.peak_bf16_flops_for_name("NVIDIA H100 PCIe") is None
    assert perf.peak_bf16_flops_for_name("NVIDIA GeForce RTX 4090") is None
    assert perf.peak_bf16_flops("cpu") is None and perf.accelerator_memory("cpu") is None
    assert perf.mfu(1e12, 2.0, None) is None and perf.mfu(1e12, 2.0, 1e12) == 0.5


def test_callback_in_trainer_run(tmp_path):
    model = _model()
    reporter = _Reporter()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, max_steps=4,
                             logging_steps=2, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_rows(), callbacks=[reporter])
    callback = add_throughput_callback(trainer, ThroughputCallback(peak_flops=1e12))
    assert trainer.callback_handler.callbacks[0] is callback  # before every reporter
    trainer.train()

    logged = [r for r in reporter.seen if "loss" in r]
    assert len(logged) == 2
    n, layers, width = perf.model_flops_shape(model)
    for row in logged:
        tps, sps = row["throughput/tokens_per_second"], row["throughput/seconds_per_step"]
        # 2 steps per window, BATCH×SEQ tokens per step (padding-free rows)
        assert tps * sps * 2 == pytest.approx(2 * BATCH * SEQ, rel=1e-9)
        flops_per_token = perf.training_flops(n, layers, width, BATCH, SEQ) / (BATCH * SEQ)
        assert row["throughput/tflops"] * 1e12 == pytest.approx(tps * flops_per_token, rel=1e-9)
        assert row["throughput/mfu"] == pytest.approx(row["throughput/tflops"], rel=1e-9)  # peak 1 TFLOP/s
        assert "throughput/peak_memory_gib" not in row  # CPU: no accelerator counters
    # the same keys land in log_history, hence trainer_state.json (what compare/reporting read)
    trainer.state.save_to_json(os.path.join(tmp_path, "state.json"))
    with open(os.path.join(tmp_path, "state.json")) as f:
        history = [h for h in json.load(f)["log_history"] if "loss" in h]
    assert [h["throughput/tokens_per_second"] for h in history] == [r["throughput/tokens_per_second"] for r in logged]
    assert not any(k.startswith("throughput/") for k in reporter.seen[-1])  # the final summary log is left alone
    assert not model._forward_pre_hooks  # the counting hook is removed at the end of training


def test_eval_forwards_are_not_counted():
    model = _model()
    callback = ThroughputCallback()
    callback._shape = perf.model_flops_shape(model)
    handle = model.register_forward_pre_hook(callback._count, with_kwargs=True)
    ids = torch.ones(BATCH, SEQ, dtype=torch.long)
    model.eval()
    model(input_ids=ids)
    assert callback._tokens == 0
    model.train()
    model(input_ids=ids)
    assert callback._tokens == BATCH * SEQ
    handle.remove()


def test_script_flag_adds_callback_first(tmp_path):
    from transformers import HfArgumentParser

    from hf_condinit.scripts_common import CondInitArguments, make_throughput_callback

    (on,) = HfArgumentParser(CondInitArguments).parse_args_into_dataclasses(["--log_throughput"])
    (off,) = HfArgumentParser(CondInitArguments).parse_args_into_dataclasses([])
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=_model(), args=args)
    assert make_throughput_callback(off, trainer) is None
    callback = make_throughput_callback(on, trainer)
    assert isinstance(callback, ThroughputCallback) and trainer.callback_handler.callbacks[0] is callback


def test_run_clm_log_throughput_reaches_trainer_state(tmp_path):
    """``run_clm.py --log_throughput``: the keys are in every training entry of trainer_state.json's log_history."""
    from utils import load_script

    run_clm = load_script("run_clm.py")
    out = tmp_path / "out"
    run_clm.main([
        "--output_dir", str(out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none", "--seed", "0",
        "--max_steps", "2", "--logging_steps", "1", "--synthetic_train_examples", "32",
        "--synthetic_eval_examples", "8", "--do_train", "--log_throughput",
    ])  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    train = [h for h in history if "loss" in h]
    assert len(train) == 2
    for h in train:
        assert h["throughput/tokens_per_second"] > 0 and h["throughput/seconds_per_step"] > 0
        assert "throughput/mfu" not in h  # CPU: no known peak, so no MFU
