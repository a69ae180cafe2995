"""The speed levers through ``run_clm.py`` (docs/pretraining.md, "Speed levers"), on CPU, synthetic corpus:

- ``--pad_vocab_to_multiple_of`` and ``--lm_head_ce chunked``, alone and together, train the same losses as the
  default run of the same seed (the padded model is built unpadded, then padded: same initial weights), and the
  saved model reports the padded rows in ``config.vocab_size``, the tokenizer its own size, and suppresses the padded
  ids in ``generation_config``;
- HF's own levers are taken as they are: ``--torch_compile`` (whole model) + ``--optim adamw_torch_fused`` with both
  levers above trains compiled without a graph break, with a fused AdamW, and so does the model's own loss without
  them; ``--tf32`` sets torch's TF32 precision where CUDA has it and is one line and exit 2 where it does not;
- what a lever cannot take is refused before any work: ``--lm_head_ce chunked`` under ZeRO-3, or for a model whose
  logits are transformed after the head.
"""

import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # noqa: E402

from hf_condinit.attention.compile_guard import COMPILE_MIN_TORCH  # noqa: E402
from hf_condinit.scripts_common import UsageError  # noqa: E402

from utils import load_script  # noqa: E402

run_clm = load_script("run_clm.py")
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _args(tmp_path, out, *extra):
    return ["--output_dir", str(tmp_path / out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none",
            "--seed", "5", "--max_steps", "3", "--synthetic_train_examples", "48", "--synthetic_eval_examples", "16",
            "--logging_steps", "1", "--save_strategy", "no", *extra]


def _losses(folder):
    state = json.loads((folder / "trainer_state.json").read_text())
    return [e["loss"] for e in state["log_history"] if "loss" in e]


LEVERS = {
    "pad": ["--pad_vocab_to_multiple_of", "64"],
    "chunked": ["--lm_head_ce", "chunked"],
    "pad+chunked": ["--pad_vocab_to_multiple_of", "64", "--lm_head_ce", "chunked"],
}


def test_levers_train_the_default_runs_losses_and_save_a_padded_model(tmp_path):
    base = run_clm.main(_args(tmp_path, "default"))
    real = len(AutoTokenizer.from_pretrained(tmp_path / "default"))
    padded_size = -(-real // 64) * 64
    assert AutoConfig.from_pretrained(tmp_path / "default").vocab_size == real < padded_size  # 67 -> 128
    for name, flags in LEVERS.items():
        results = run_clm.main(_args(tmp_path, name, *flags))
        losses = _losses(tmp_path / name)
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
        assert losses == pytest.approx(_losses(tmp_path / "default"), rel=1e-5), name
        assert results["eval_loss"] == pytest.approx(base["eval_loss"], rel=1e-5), name
        padded = "pad" in name
        assert AutoConfig.from_pretrained(tmp_path / name).vocab_size == (padded_size if padded else real), name
        assert len(AutoTokenizer.from_pretrained(tmp_path / name)) == real, name
        suppressed = GenerationConfig.from_pretrained(tmp_path / name).suppress_tokens
        assert suppressed == (list(range(real, padded_size)) if padded else None), name


@pytest.mark.skipif(TORCH < COMPILE_MIN_TORCH, reason="dynamo of torch < 2.7 cannot trace transformers' forward")
def test_hf_levers_whole_model_compile_and_fused_adamw_with_both_levers(tmp_path, monkeypatch):
    """``--torch_compile`` (whole model, ``aot_eager``: dynamo and AOTAutograd without inductor's C++ build) and
    ``--optim adamw_torch_fused`` with the padded vocabulary and the chunked loss: compiled, no graph break, the
    optimizer fused, and the losses of the eager run with the same levers."""
    import torch._dynamo
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.utils import counters

    trainers = []

    class Recording(run_clm.CondInitTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    monkeypatch.setattr(run_clm, "CondInitTrainer", Recording)
    flags = [*LEVERS["pad+chunked"], "--optim", "adamw_torch_fused", "--do_train"]
    run_clm.main(_args(tmp_path, "eager", *flags))
    torch._dynamo.reset()
    counters.clear()
    try:
        run_clm.main(_args(tmp_path, "compiled", *flags, "--torch_compile", "--torch_compile_backend", "aot_eager"))
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] >= 1
    finally:
        torch._dynamo.reset()
        for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE"):  # set by TrainingArguments
            os.environ.pop(var, None)
    eager, compiled = trainers
    ids = torch.arange(8)[None]
    assert eager.model.train()(input_ids=ids, labels=ids).logits is None  # the chunked loss is in place
    assert not isinstance(eager.model_wrapped, OptimizedModule) and isinstance(compiled.model_wrapped, OptimizedModule)
    for trainer in trainers:
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True
    assert _losses(tmp_path / "compiled") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-5)


@pytest.mark.skipif(TORCH < COMPILE_MIN_TORCH, reason="dynamo of torch < 2.7 cannot trace transformers' forward")
def test_whole_model_compile_of_the_models_own_loss_has_no_graph_break(tmp_path):
    """``--torch_compile`` (whole model) of the default run, no lever: the model's own loss (GPT-2's, which
    transformers reaches through a logged fallback unless the model names it) traces without a graph break."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        run_clm.main(_args(tmp_path, "compiled", "--do_train", "--torch_compile", "--torch_compile_backend",
                           "aot_eager"))
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] >= 1
    finally:
        torch._dynamo.reset()
        for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE"):  # set by TrainingArguments
            os.environ.pop(var, None)


def test_tf32_flag_sets_torchs_tf32_precision_where_cuda_has_it(tmp_path, monkeypatch):
    """transformers' ``--tf32`` on torch >= 2.9 sets ``torch.backends.fp32_precision = "tf32"`` (the API that
    replaced ``allow_tf32``; reading the legacy flag after it raises), before 2.9 the legacy flags. On a machine
    without TF32: one line, exit 2."""
    import transformers.training_args as training_args_module

    with pytest.raises(UsageError, match="--tf32 requires Ampere"):
        run_clm.parse(_args(tmp_path, "cpu", "--tf32", "true"))
    new_api = hasattr(torch.backends, "fp32_precision")
    before = (torch.backends.fp32_precision if new_api
              else (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
    monkeypatch.setattr(training_args_module, "is_torch_tf32_available", lambda: True)
    try:
        run_clm.parse(_args(tmp_path, "tf32", "--tf32", "true"))
        if new_api:
            assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "tf32"
        else:
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        if new_api:
            torch.backends.fp32_precision = before
        else:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("extra, message", [
    (["--fsdp", "full_shard", "--fsdp_config", '{"fsdp_version": 1}'], "tested under FSDP2 only"),
    (["--model_type", "cohere"], "needs logits = lm_head.*logit_scale"),  # Cohere scales its logits
    (["--pad_vocab_to_multiple_of", "0"], "pad_vocab_to_multiple_of"),
], ids=["fsdp1", "transformed-logits", "pad-0"])
def test_levers_refused_before_any_work(tmp_path, monkeypatch, extra, message):
    def boom(*args, **kwargs):
        raise AssertionError("model or data work started")

    monkeypatch.setattr(run_clm, "prepare_data", boom)
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # the FSDP arguments set it: restored after the test
    with pytest.raises(UsageError, match=message):
        run_clm.main(_args(tmp_path, "refused", "--lm_head_ce", "chunked", *extra))
    assert not (tmp_path / "refused").exists()


def test_resume_with_another_vocabulary_size_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    """A run trained with ``--pad_vocab_to_multiple_of 64`` (67 tokens -> 128 rows), resumed without the flag (67) or
    with 32 (96), would die in the Trainer's checkpoint load with a shape mismatch: one line and exit 2 before the
    model is built. Resumed with 64, or 128 (the same 128 rows), it gets past the check to the model."""
    from hf_condinit.scripts_common import run_main

    trained = _args(tmp_path, "padded", *LEVERS["pad"], "--do_train", "--max_steps", "2", "--save_strategy", "steps",
                    "--save_steps", "2")
    run_clm.main(trained)
    checkpoint = tmp_path / "padded" / "checkpoint-2"
    assert json.loads((checkpoint / "config.json").read_text())["vocab_size"] == 128

    def boom(*args, **kwargs):
        raise AssertionError("model work started")

    monkeypatch.setattr(run_clm, "build_model", boom)
    resume = [*_args(tmp_path, "padded", "--do_train"), "--resume_from_checkpoint", str(checkpoint)]
    for flags, size, built in (([], 67, "67 rows, unpadded"), (["--pad_vocab_to_multiple_of", "32"], 96,
                                                               "67 rows padded to a multiple of 32")):
        with pytest.raises(SystemExit) as stop:
            run_main(run_clm.main, [*resume, *flags], prog="run_clm.py")
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (f"run_clm.py: error: cannot resume from {checkpoint}: its model has a vocabulary of 128 "
                           f"rows (trained with --pad_vocab_to_multiple_of), this run's would have {size} ({built}); "
                           "resume with the --pad_vocab_to_multiple_of it was trained with, or pass a new "
                           "--output_dir to start over."), err
    for multiple in ("64", "128"):
        with pytest.raises(AssertionError, match="model work started"):
            run_clm.main([*resume, "--pad_vocab_to_multiple_of", multiple])
