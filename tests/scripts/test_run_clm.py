"""run_clm.py end to end, in-process, on CPU: real TinyStories text, the synthetic default, resuming, bad input.

Real text is read from ``../shared/data`` (relative to the repo root; tests skip when it is absent) and a slice is
written to ``tmp_path`` so the runs stay small. Nothing is downloaded.
"""

import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.integrations.deepspeed import unset_hf_deepspeed_config  # noqa: E402

import hf_condinit  # noqa: E402,F401
from hf_condinit.registry import ATTENTION_VARIANTS  # noqa: E402

from hf_condinit.callbacks import NonFiniteLossError  # noqa: E402
from hf_condinit.scripts_common import UsageError, run_main  # noqa: E402

from utils import REPO, TINYSTORIES, gpt2_conditioned_checks, load_script, needs  # noqa: E402

needs_tinystories = needs(TINYSTORIES)
run_clm = load_script("run_clm.py")


def _common(tmp_path, out="out"):
    return [
        "--output_dir", str(tmp_path / out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none",
        "--cache_dir", str(tmp_path / "cache"), "--seed", "7",
    ]  # fmt: skip


def _text_args(ts_file, tmp_path, out="out", steps=4):
    return _common(tmp_path, out) + [
        "--model_config", "gpt2-tiny", "--train_file", ts_file, "--block_size", "64", "--tokenizer_vocab_size", "512",
        "--max_steps", str(steps), "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
        "--max_eval_samples", "16", "--logging_steps", "1", "--save_strategy", "no",
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------- real text


@needs_tinystories
def test_tinystories_few_steps(ts_file, tmp_path):
    results = run_clm.main(_text_args(ts_file, tmp_path) + ["--init", "conditioned", "--learning_rate", "1e-3"])
    out = tmp_path / "out"
    ev = json.loads((out / "eval_results.json").read_text())
    assert math.isfinite(ev["perplexity"]) and ev["perplexity"] == pytest.approx(math.exp(ev["eval_loss"]))
    assert ev["perplexity"] < 512  # better than uniform over the vocabulary after 4 steps at lr 1e-3
    assert "perplexity" in json.loads((out / "all_results.json").read_text())
    tr = json.loads((out / "train_results.json").read_text())
    assert tr["train_tokens_per_second"] > 0 and math.isfinite(tr["train_loss"])
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert any("perplexity" in e for e in state["log_history"]) or results["perplexity"]
    # self-contained checkpoint: the trained BPE is saved with the model
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert len(tok) == model.config.vocab_size <= 512
    assert model.config.condinit["method"] == "conditioned" and model.config.condinit["seed"] == 7
    assert model.config.n_positions == 256 and tok.model_max_length == 256


@needs_tinystories
def test_conditioned_weights_survive_training_loop_save_and_reload(ts_file, tmp_path):
    """lr = 0: the Trainer loop, save_model and from_pretrained must leave the conditioned q/k/v exactly as built."""
    run_clm.main(_text_args(ts_file, tmp_path, steps=2) + ["--init", "conditioned", "--learning_rate", "0", "--do_train"])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    gpt2_conditioned_checks(reloaded)
    fresh = AutoModelForCausalLM.from_config(reloaded.config, condinit=dict(reloaded.config.condinit))
    for a, b in zip(fresh.transformer.h, reloaded.transformer.h):
        assert torch.equal(a.attn.c_attn.weight, b.attn.c_attn.weight)
    assert not (tmp_path / "out" / "eval_results.json").exists()  # --do_train alone: no eval


def _resume_case(ts_file, tmp_path, attention):
    base = _text_args(ts_file, tmp_path, steps=6) + [
        "--init", "conditioned", "--attention", attention, "--learning_rate", "2e-3", "--max_train_samples", "48",
        "--do_train", "--save_strategy", "steps", "--save_steps", "3", "--logging_steps", "1",
    ]  # fmt: skip
    run_clm.main(base)  # uninterrupted: 6 steps, checkpoints at 3 and 6
    ckpt = tmp_path / "out" / "checkpoint-3"
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"):
        assert (ckpt / name).exists(), name
    b_args = [a if a != str(tmp_path / "out") else str(tmp_path / "resumed") for a in base]
    run_clm.main(b_args + ["--resume_from_checkpoint", str(ckpt)])
    full = load_file(tmp_path / "out" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    at3 = load_file(ckpt / "model.safetensors")
    assert full.keys() == resumed.keys()
    assert any(not torch.equal(full[k], at3[k]) for k in full), "training between step 3 and 6 changed nothing"
    diff = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not diff, f"resumed run differs from the uninterrupted one in {diff[:5]}"
    # the resumed log carries steps 1-3 over from the checkpoint and adds 4-6, each once, with the same losses
    logs = {}
    for run in ("out", "resumed"):
        state = json.loads((tmp_path / run / "trainer_state.json").read_text())
        logs[run] = [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]
    assert [s for s, _ in logs["resumed"]] == [1, 2, 3, 4, 5, 6]
    assert logs["resumed"] == logs["out"]
    return full


@needs_tinystories
def test_resume_is_bit_identical(ts_file, tmp_path):
    _resume_case(ts_file, tmp_path, "sdpa")


@needs_tinystories
@pytest.mark.skipif("affine_scaled" not in ATTENTION_VARIANTS, reason="affine_scaled variant not registered")
def test_resume_restores_alpha_ma(ts_file, tmp_path):
    full = _resume_case(ts_file, tmp_path, "affine_scaled")
    alpha = [k for k in full if "alpha_ma" in k]
    assert alpha and any(full[k].abs().sum() > 0 for k in alpha), "α_ma should have moved off 0 during training"


# ------------------------------------------------------------------------------------------------- synthetic default


def test_synthetic_default_runs_and_reports_accuracy(tmp_path):
    argv = _common(tmp_path) + [
        "--init", "conditioned", "--max_steps", "3", "--synthetic_train_examples", "128", "--synthetic_eval_examples", "32",
    ]  # fmt: skip
    run_clm.main(argv)
    ev_file = tmp_path / "out" / "eval_results.json"
    ev = json.loads(ev_file.read_text())
    assert 0.0 <= ev["eval_recall_accuracy"] <= 1.0 and math.isfinite(ev["perplexity"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.config.n_layer == 2 and model.config.vocab_size == 3 + 32 + 32
    # the same command again must not silently redo (and overwrite) the finished run
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    with pytest.raises(UsageError, match=r"already holds a finished run; pass a new --output_dir .* or "
                                         r"--resume_from_checkpoint"):
        run_clm.main(argv)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == before


def test_defaults_apply_only_when_not_given(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:  # every help string must format (a bare '%' breaks argparse)
        run_clm.parse(["--help"])
    assert exit_info.value.code == 0 and "--log_condition_number_every" in capsys.readouterr().out
    (m, d, c, t), _ = run_clm.parse([])
    assert d.synthetic and t.max_steps == 600 and t.do_train and t.do_eval
    assert (t.adam_beta1, t.adam_beta2, t.weight_decay, t.max_grad_norm) == (0.9, 0.95, 0.1, 1.0)
    assert t.lr_scheduler_type == "cosine" and t.warmup_steps == 0.05 and c.init == "default"
    assert t.save_strategy == "no" and not t.logging_nan_inf_filter
    (m, d, c, t), _ = run_clm.parse(["--train_file", "x.txt", "--weight_decay", "0.0", "--adam-beta2", "0.99", "--do_eval"])
    assert t.weight_decay == 0.0 and t.adam_beta2 == 0.99 and t.max_steps == -1
    assert t.do_eval and not t.do_train and t.learning_rate == 3e-4
    cfg = tmp_path / "args.json"
    cfg.write_text(json.dumps({"train_file": "x.txt", "weight_decay": 0.0, "output_dir": str(tmp_path / "o"), "init": "mimetic"}))
    (m, d, c, t), _ = run_clm.parse([str(cfg)])
    assert t.weight_decay == 0.0 and t.adam_beta2 == 0.95 and t.lr_scheduler_type == "cosine" and c.init == "mimetic"
    assert t.output_dir == str(tmp_path / "o")


def test_each_arm_gets_its_own_default_output_dir():
    """every --init/--attention/spectral arm had the same default folder (runs/clm-default)."""
    dirs = {run_clm.parse(arm)[0][3].output_dir for arm in (
        [], ["--init", "conditioned"], ["--init", "mimetic"], ["--attention", "affine_scaled"],
        ["--init", "conditioned", "--spectral_lambda", "10"],
    )}  # fmt: skip
    assert len(dirs) == 5 and "runs/clm-synthetic-conditioned-sdpa" in dirs
    assert run_clm.parse(["--train_file", "x.txt", "--init", "conditioned"])[0][3].output_dir == "runs/clm-conditioned-sdpa"


def test_a_flag_given_takes_effect_over_the_embedded_defaults():
    """--save_steps 20 alone saved nothing on the embedded default (its save_strategy 'no')."""
    t = run_clm.parse(["--save_steps", "20"])[0][3]
    assert t.save_strategy == "steps" and t.save_steps == 20
    t = run_clm.parse(["--eval_steps", "5"])[0][3]
    assert t.eval_strategy == "steps" and t.eval_steps == 5
    t = run_clm.parse(["--save_steps", "20", "--save_strategy", "epoch"])[0][3]
    assert t.save_strategy == "epoch"  # an explicit strategy still wins


def test_no_decay_groups(tmp_path):
    from transformers import GPT2Config, TrainingArguments

    from hf_condinit.scripts_common import CondInitTrainer

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=0)
    attention = "attention_sink" if "attention_sink" in ATTENTION_VARIANTS else "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "conditioned", "seed": 0}, attn_implementation=attention)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, weight_decay=0.1, report_to="none")
    trainer = CondInitTrainer(model=model, args=args)
    opt = trainer.create_optimizer()
    by_id = {id(p): n for n, p in model.named_parameters()}
    decayed = {by_id[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    kept = {by_id[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert "transformer.h.0.attn.c_attn.weight" in decayed and "transformer.h.0.attn.c_attn.bias" in kept
    assert "transformer.h.0.ln_1.weight" in kept and "transformer.ln_f.bias" in kept
    assert not any("condinit_" in n for n in decayed)
    if attention != "sdpa":
        assert any("condinit_" in n for n in kept)


@needs_tinystories
def test_condition_number_logging(ts_file, tmp_path):
    run_clm.main(_text_args(ts_file, tmp_path, steps=2) + [
        "--init", "conditioned", "--do_train", "--log_condition_number_every", "2",
        "--condition_number_probe_size", "1", "--condition_number_probe_length", "8",
    ])  # fmt: skip
    lines = (tmp_path / "out" / "condition_number.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 2]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert any(any(k.startswith("kappa") for k in e) for e in state["log_history"])


# ------------------------------------------------------------------------------------------------- bad input


@pytest.fixture
def no_work(monkeypatch, deepspeed_in_process):
    """Fail the test if a bad-input run gets as far as tokenizer training or model construction."""

    def boom(*a, **k):
        raise AssertionError("work started before the input was validated")

    monkeypatch.setattr(run_clm, "train_bpe_tokenizer", boom)
    monkeypatch.setattr(run_clm.AutoModelForCausalLM, "from_config", boom)
    monkeypatch.setattr(run_clm, "load_raw_datasets", boom)


def test_bad_input_errors(tmp_path, no_work):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 50)
    ds_bf16 = tmp_path / "ds.json"
    ds = json.load(open(os.path.join(REPO, "ds_configs", "zero2.json")))
    ds["bf16"] = {"enabled": True}
    ds_bf16.write_text(json.dumps(ds))
    cases = [
        (["--train_file", str(tmp_path / "missing.txt")], "does not exist"),
        (["--train_file", str(empty)], "is empty"),
        (["--train_file", str(text), "--validation_file", str(empty)], "is empty"),
        (["--train_file", str(text), "--model_config", "gpt2-tiny", "--block_size", "512"], "larger than the model's context"),
        (["--train_file", str(text), "--model_config", "no-such-config"], "not a config"),
        (["--init", "fancy"], r"unknown --init 'fancy'; choose one of: default, mimetic, conditioned, orthogonal "
                              r"\(alias of conditioned\)"),
        # options the method / attention never reads
        (["--init", "mimetic", "--value_init", "per_head"], "value_init is read by method 'conditioned' only"),
        (["--init", "conditioned", "--mimetic_beta1", "0.2"], "mimetic_beta1 is read by method 'mimetic' only"),
        (["--affine_rho", "0.5"], "affine_rho is read by attention 'affine_scaled' only, not 'default'"),
        (["--spectral_mode", "svd"], "spectral_mode is read only with spectral_lambda set"),
        # attention implementations that cannot run here / on GPT-2
        (["--attention", "flash_attention_2"], "needs a GPU"),
        (["--attention", "flex_attention"], "GPT2LMHeadModel does not support .*flex_attention"),
        (["--attention", "paged|eager"], "continuous batching"),
        # a loaded model is never re-initialised
        (["--model_name_or_path", str(tmp_path), "--train_file", str(text), "--init", "conditioned"],
         "--init cannot be used with --model_name_or_path"),
        (["--model_name_or_path", str(tmp_path), "--train_file", str(text), "--qk_gain", "2"],
         "--qk_gain cannot be used with --model_name_or_path"),
        (["--train_file", str(text), "--torch_dtype", "bfloat16"], "--torch_dtype is for loading a model"),
        (["--attention", "flashy"], "unknown --attention"),
        (["--init", "conditioned", "--value_init", "diagonal"], "value_init"),
        (["--train_file", str(text), "--deepspeed", str(ds_bf16)], "bf16"),
        (["--block_size", "64"], "synthetic corpus"),
        (["--tokenizer_name", "gpt2"], "synthetic corpus"),
        (["--train_file", str(text), "--dataset_name", "wikitext"], "not both"),
        (["--validation_file", str(text)], "needs --train_file"),
        (["--train_file", str(text), "--resume_from_checkpoint", str(tmp_path / "nope")], "not a directory"),
    ]
    for argv, message in cases:
        with pytest.raises(UsageError, match=message):
            run_clm.main(_common(tmp_path) + argv)
        unset_hf_deepspeed_config()
        assert not (tmp_path / "out").exists()


def test_bad_data_gets_one_line_naming_the_file_and_leaves_nothing(tmp_path, capsys, monkeypatch,
                                                                 deepspeed_in_process):
    """random bytes, a 5-line file, a malformed DeepSpeed JSON and a JSONL with too few
    tokens each print one line naming the file, exit 2, build no model and leave no output folder."""

    def boom(*a, **k):
        raise AssertionError("a model was built before the data was validated")

    monkeypatch.setattr(run_clm.AutoModelForCausalLM, "from_config", boom)
    random_bytes = tmp_path / "random.txt"
    random_bytes.write_bytes(bytes(range(256)) * 8)
    five = tmp_path / "five.txt"
    five.write_text("".join(f"line {i} of a tiny file\n" for i in range(5)))
    bad_ds = tmp_path / "ds.json"
    bad_ds.write_text('{"zero_optimization": {"stage": 2,}}')
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(100)))
    text_flags = ["--model_config", "gpt2-tiny", "--block_size", "64", "--tokenizer_vocab_size", "300"]
    cases = [
        (["--train_file", str(random_bytes)], r"--train_file '.*random\.txt' is not UTF-8 text \(bad byte at offset 128\)"),
        (["--train_file", str(five)], r"--train_file '.*five\.txt' has 5 rows, so 5 % held out for validation is no row"),
        (["--train_file", str(five), "--deepspeed", str(bad_ds)], r"--deepspeed '.*ds\.json' is not valid JSON"),
        (["--train_file", str(rows)], r"--train_file '.*rows\.jsonl'.* has \d+ tokens, fewer than one block of 64"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            run_main(run_clm.main, _common(tmp_path) + text_flags + argv, prog="run_clm.py")
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, err
        assert err[0].startswith("run_clm.py: error: ") and __import__("re").search(message, err[0]), err[0]
        assert not (tmp_path / "out").exists(), f"{argv} left {list((tmp_path / 'out').rglob('*'))}"


def test_a_real_bug_keeps_its_traceback(monkeypatch):
    def bug(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr(run_clm, "parse", bug)
    with pytest.raises(KeyError):
        run_main(run_clm.main, [], prog="run_clm.py")


def test_deepspeed_without_accelerator_takes_the_cpu_path(tmp_path, capsys, deepspeed_in_process):
    """without --use_cpu on a machine with no GPU, DeepSpeed failed on a batch-size mismatch."""
    from hf_condinit.scripts_common import has_accelerator

    if has_accelerator():
        pytest.skip("this machine has an accelerator")
    (m, d, c, t), _ = run_clm.parse(["--train_file", "x.txt", "--deepspeed", str(REPO / "ds_configs" / "zero2.json"),
                                     "--output_dir", str(tmp_path)])
    assert t.use_cpu and not t.dataloader_pin_memory
    assert "No GPU found: running DeepSpeed on the CPU" in capsys.readouterr().err


def test_non_finite_option_never_ends_in_success(tmp_path):
    """--qk_gain nan exited 0 with "perplexity": NaN. It must be refused (UsageError) or stop the run
    (NonFiniteLossError), and write no results."""
    with pytest.raises((UsageError, NonFiniteLossError)):
        run_clm.main(_common(tmp_path) + [
            "--init", "conditioned", "--qk_gain", "nan", "--max_steps", "2", "--logging_steps", "1",
            "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16",
        ])  # fmt: skip
    assert not (tmp_path / "out" / "eval_results.json").exists()


@needs_tinystories
def test_continue_pretraining_from_a_saved_model(ts_file, tmp_path):
    """--model_name_or_path (and --torch_dtype) continue a saved run on new data, with its own
    tokenizer and its weights as loaded (lr 0: the result equals the loaded model bit for bit)."""
    run_clm.main(_text_args(ts_file, tmp_path, out="first", steps=2) + ["--init", "conditioned", "--do_train"])
    second = [a for a in _text_args(ts_file, tmp_path, out="second", steps=2) if a not in ("gpt2-tiny", "--model_config")]
    second = [a for i, a in enumerate(second) if not (a == "--tokenizer_vocab_size" or second[i - 1] == "--tokenizer_vocab_size")]
    run_clm.main(second + ["--model_name_or_path", str(tmp_path / "first"), "--torch_dtype", "float32",
                           "--learning_rate", "0", "--do_train"])
    first = load_file(tmp_path / "first" / "model.safetensors")
    after = load_file(tmp_path / "second" / "model.safetensors")
    assert first.keys() == after.keys() and all(torch.equal(first[k], after[k]) for k in first)
    assert not (tmp_path / "second" / "bpe_tokenizer").exists()  # the model's own tokenizer was used
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "second").config.condinit["method"] == "conditioned"


def test_torch_compile_trains_with_run_clms_own_set_up(tmp_path):
    """``--torch_compile`` through run_clm.py's own model set-up (the conditioned init, spectral
    conditioning's forward hooks, the throughput callback) trains compiled, with no graph break. The ``aot_eager``
    backend runs dynamo and AOTAutograd (what breaks a graph) without inductor's C++ build. Accelerate's regional
    compilation, for every variant: the test below; the attention variants' compile per model in
    tests/attention/test_compile.py, per block in tests/attention/test_compile_blocks.py."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run_clm.main(_common(tmp_path) + [
        "--init", "conditioned", "--spectral_lambda", "10", "--max_steps", "2", "--synthetic_train_examples", "32",
        "--synthetic_eval_examples", "8", "--do_train", "--logging_steps", "1", "--save_strategy", "no",
        "--torch_compile", "--torch_compile_backend", "aot_eager",
    ])  # fmt: skip
    try:
        assert counters["stats"]["unique_graphs"] >= 1  # the model ran compiled
        assert not counters["graph_break"], dict(counters["graph_break"])
        state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
        losses = [e["loss"] for e in state["log_history"] if "loss" in e]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    finally:
        torch._dynamo.reset()
        for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE"):  # set by TrainingArguments
            os.environ.pop(var, None)


@pytest.mark.parametrize("variant", [["--attention", "affine_scaled", "--spectral_lambda", "10"],
                                     ["--attention", "attention_sink"], ["--attention", "preconditioned"]],
                         ids=["affine_scaled+spectral", "attention_sink", "preconditioned"])
def test_regional_compilation_trains_every_variant_without_a_graph_break(tmp_path, monkeypatch, variant):
    """``--torch_compile`` with accelerate's regional compilation
    (``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1``, docs/pretraining.md "Compiling"), each attention variant
    (spectral conditioning with affine_scaled): 0 graph breaks, and 6 graphs, one per region: wte, wpe, drop, the
    two blocks (one graph), ln_f, lm_head (compiled as a whole the model is 1 graph). Before, every variant
    broke each compiled block 4 times (transformers' output collector read in the attention function)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    torch._dynamo.reset()
    counters.clear()
    try:
        run_clm.main(_common(tmp_path) + variant + [
            "--max_steps", "2", "--synthetic_train_examples", "16", "--do_train", "--save_strategy", "no",
            "--torch_compile", "--torch_compile_backend", "aot_eager",
        ])  # fmt: skip
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 6
    finally:
        torch._dynamo.reset()
        for var in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE"):  # set by TrainingArguments
            os.environ.pop(var, None)
