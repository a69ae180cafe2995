"""The shipped DeepSpeed configs validate through the Trainer's path, and contradictions are caught early.

Path under test (what ``Trainer`` does): ``TrainingArguments(deepspeed=...)`` → ``HfTrainerDeepSpeedConfig``
(``trainer_config_process``) → ``trainer_config_finalize(args, model, num_training_steps)`` → DeepSpeed's own
``DeepSpeedConfig`` parser. Single process, no training, nothing compiled.
"""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, TrainingArguments  # noqa: E402
from transformers.integrations.deepspeed import unset_hf_deepspeed_config  # noqa: E402

from hf_condinit.scripts_common import CondInitArguments, validate_deepspeed_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DS = {name: os.path.join(REPO, "ds_configs", f"{name}.json") for name in ("zero2", "zero3", "zero3_offload")}


@pytest.fixture(autouse=True)
def _no_global_ds_config():
    # TrainingArguments(deepspeed=...) registers a global weakref that switches from_config to zero.Init; make sure no
    # test leaks it to the rest of the session.
    yield
    unset_hf_deepspeed_config()


def _args(tmp_path, ds, **kw):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=1e-3, max_grad_norm=1.0)
    base.update(kw)
    return TrainingArguments(deepspeed=ds, **base)


def _tiny_model():
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("name", sorted(DS))
def test_ds_config_validates(tmp_path, name):
    from deepspeed.runtime.config import DeepSpeedConfig

    raw = json.load(open(DS[name]))
    assert "optimizer" not in raw, "a DeepSpeed optimizer block would JIT-compile and drop the no-decay groups"
    model = _tiny_model()
    args = _args(tmp_path, DS[name], bf16=(name == "zero3_offload"))
    validate_deepspeed_config(args, CondInitArguments(init="conditioned"))  # no contradiction
    hf_ds = args.hf_deepspeed_config
    hf_ds.trainer_config_finalize(args, model, num_training_steps=100)
    assert "auto" not in json.dumps(hf_ds.config), hf_ds.config
    ds = DeepSpeedConfig(hf_ds.config)
    assert ds.zero_optimization_stage == (2 if name == "zero2" else 3)
    assert ds.train_micro_batch_size_per_gpu == 4 and ds.gradient_accumulation_steps == 2
    assert ds.train_batch_size == 8 and ds.gradient_clipping == 1.0
    if hasattr(ds, "bfloat16_config"):  # newer DeepSpeed (0.19); 0.16 (the floor): bfloat16_enabled / fp16_enabled
        bf16, fp16 = ds.bfloat16_config.enabled, ds.float16_config.enabled
    else:
        bf16, fp16 = ds.bfloat16_enabled, ds.fp16_enabled
    assert bf16 == (name == "zero3_offload") and not fp16
    assert hf_ds.config["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    if name == "zero3_offload":
        assert ds.zero_config.offload_optimizer.device == "cpu" and ds.zero_config.offload_param.device == "cpu"
        assert hf_ds.is_offload()
    if name.startswith("zero3"):
        assert ds.zero_config.gather_16bit_weights_on_model_save  # save_model writes full weights
        assert hf_ds.config["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * 64


def _write(tmp_path, name, cfg):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_contradicting_bf16_is_caught_before_training(tmp_path):
    cfg = json.load(open(DS["zero2"]))
    cfg["bf16"] = {"enabled": True}
    args = _args(tmp_path, _write(tmp_path, "bf16.json", cfg))  # no --bf16
    with pytest.raises(ValueError, match="bf16"):
        validate_deepspeed_config(args)


@pytest.mark.parametrize(
    "key,value,flag",
    [("train_micro_batch_size_per_gpu", 16, "per_device_train_batch_size"), ("gradient_clipping", 0.5, "max_grad_norm")],
)
def test_contradicting_values_are_caught(tmp_path, key, value, flag):
    cfg = json.load(open(DS["zero3"]))
    cfg[key] = value
    args = _args(tmp_path, _write(tmp_path, "bad.json", cfg))
    with pytest.raises(ValueError, match=flag):
        validate_deepspeed_config(args)


def test_optimizer_block_with_holders_is_refused(tmp_path):
    cfg = json.load(open(DS["zero2"]))
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
    args = _args(tmp_path, _write(tmp_path, "opt.json", cfg))
    validate_deepspeed_config(args, CondInitArguments(init="conditioned"))  # plain attention: warning only
    with pytest.raises(ValueError, match="optimizer"):
        validate_deepspeed_config(args, CondInitArguments(init="default", spectral_lambda=10.0))


def test_bad_stage(tmp_path):
    cfg = json.load(open(DS["zero2"]))
    cfg["zero_optimization"]["stage"] = 5
    args = _args(tmp_path, _write(tmp_path, "s5.json", cfg))
    with pytest.raises(ValueError, match="stage"):
        validate_deepspeed_config(args)


@pytest.mark.parametrize("name,layers,width,heads,non_embedding", [
    ("gpt2-472m", 24, 1280, 20, 471_859_200),
    ("gpt2-1.72b", 48, 1728, 27, 1_719_926_784),
])
def test_paper_size_configs(name, layers, width, heads, non_embedding):
    """The assumed shapes of docs/methods.md §7, counted on the meta device (no memory)."""
    cfg = AutoConfig.from_pretrained(os.path.join(REPO, "configs", f"{name}.json"))
    assert "ASSUMED" in cfg._comment
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions) == (layers, width, heads, 1024)
    assert cfg.n_embd // cfg.n_head == 64
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    blocks = sum(p.numel() for n, p in model.named_parameters() if ".h." in n and p.ndim == 2)
    assert blocks == non_embedding  # the 12·L·D² of the papers' naming (matrices of the blocks)


@pytest.mark.parametrize("name", ["gpt2-tiny", "gpt2-small-cpu"])
def test_cpu_configs_load(name):
    cfg = AutoConfig.from_pretrained(os.path.join(REPO, "configs", f"{name}.json"))
    assert cfg.model_type == "gpt2" and cfg.n_embd % cfg.n_head == 0
