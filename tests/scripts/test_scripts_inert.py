"""run_clm.py and run_mlm.py at their defaults on model types hf_condinit has no attention layout for (docs/coverage.md:
no softmax attention, or a layout it cannot prove): the model is built and trained as transformers does it, and a
plugin flag on such a type is one line naming that flag.

Each type is a tiny config trained 2 steps at learning rate 0, so the saved weights are the weights as built; they must
equal a build of the same saved config by transformers with hf_condinit's hooks removed, from the same seed.
"""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, set_seed  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

import hf_condinit  # noqa: E402,F401
from hf_condinit import hooks  # noqa: E402
from hf_condinit.scripts_common import run_main  # noqa: E402

from utils import load_script  # noqa: E402

run_clm = load_script("run_clm.py")
run_mlm = load_script("run_mlm.py")

SEED = 3
#: model type -> --config_overrides of a tiny model. Mamba and RWKV: no softmax attention (state-space / linear
#: recurrent mixers); DiffLlama: differential attention (two softmax maps per head, subtracted), whose layout
#: hf_condinit cannot prove; FNet: Fourier token mixing; ConvBERT: attention whose layout hf_condinit cannot prove.
CLM_TYPES = {
    "mamba": "num_hidden_layers=2,hidden_size=32,state_size=4,intermediate_size=64",
    "rwkv": "num_hidden_layers=2,hidden_size=32,attention_hidden_size=32,intermediate_size=64,context_length=64",
    "diffllama": "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,num_key_value_heads=2,intermediate_size=64",
}
MLM_TYPES = {
    "fnet": "num_hidden_layers=2,hidden_size=32,intermediate_size=64",
    "convbert": "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,embedding_size=32",
}


def _installed(model_type):
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {__import__('transformers').__version__} has no model type {model_type!r}")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    words = "the cat dog sat on a mat and ran far away home big small red blue".split()
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text("".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + "\n" for i in range(80)))
    return str(path)


def _common(tmp_path, out="out"):
    return ["--output_dir", str(tmp_path / out), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true",
            "--seed", str(SEED), "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "4", "--cache_dir", str(tmp_path / "cache")]


def _clm_args(model_type, tmp_path, out="out"):
    return _common(tmp_path, out) + ["--model_type", model_type, "--config_overrides", CLM_TYPES[model_type],
                                     "--synthetic_train_examples", "16", "--synthetic_eval_examples", "8"]


def _mlm_args(model_type, text_file, tmp_path, out="out"):
    return _common(tmp_path, out) + ["--model_type", model_type, "--config_overrides", MLM_TYPES[model_type],
                                     "--train_file", text_file, "--tokenizer_vocab_size", "200",
                                     "--max_seq_length", "16"]


def _assert_built_as_transformers_does(out, auto_class):
    config = json.loads((out / "config.json").read_text())
    assert not any(k.startswith("condinit") for k in config), "a recipe was recorded: the plugin's hooks acted"
    with hooks.uninstalled():
        set_seed(SEED)
        reference = auto_class.from_config(AutoConfig.from_pretrained(out)).state_dict()
    saved = load_file(out / "model.safetensors")
    assert saved and set(saved) <= set(reference)
    for name, tensor in saved.items():
        assert torch.equal(tensor, reference[name]), name


@pytest.mark.parametrize("model_type", sorted(CLM_TYPES))
def test_run_clm_trains_a_type_without_layout_as_transformers_builds_it(model_type, tmp_path):
    _installed(model_type)
    results = run_clm.main(_clm_args(model_type, tmp_path) + ["--learning_rate", "0"])
    assert torch.isfinite(torch.tensor([results["train_loss"], results["eval_loss"]])).all()
    _assert_built_as_transformers_does(tmp_path / "out", AutoModelForCausalLM)


def test_run_clm_default_mamba_learns(tmp_path):
    """With the defaults' learning rate the weights move and the loss stays finite."""
    _installed("mamba")
    results = run_clm.main(_clm_args("mamba", tmp_path))
    assert torch.isfinite(torch.tensor(results["train_loss"]))
    saved = load_file(tmp_path / "out" / "model.safetensors")
    with hooks.uninstalled():
        set_seed(SEED)
        built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "out")).state_dict()
    assert any(not torch.equal(t, built[k]) for k, t in saved.items())


@pytest.mark.parametrize("model_type", sorted(MLM_TYPES))
def test_run_mlm_trains_a_type_without_layout_as_transformers_builds_it(model_type, text_file, tmp_path):
    _installed(model_type)
    run_mlm.main(_mlm_args(model_type, text_file, tmp_path) + ["--learning_rate", "0"])
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert torch.isfinite(torch.tensor([results["train_loss"], results["eval_loss"]])).all()
    _assert_built_as_transformers_does(tmp_path / "out", AutoModelForMaskedLM)


PLUGIN_FLAGS = [
    (["--init", "conditioned"], "--init conditioned"),
    (["--init", "mimetic", "--condinit_seed", "1"], "--init mimetic"),
    (["--attention", "affine_scaled"], "--attention affine_scaled"),
    (["--spectral_lambda", "10"], "--spectral_lambda 10"),
    (["--log_condition_number_every", "5"], "--log_condition_number_every 5"),
]


@pytest.mark.parametrize("flags, named", PLUGIN_FLAGS)
def test_a_plugin_flag_on_a_type_without_layout_is_one_line_naming_it(flags, named, text_file, tmp_path, capsys,
                                                                       monkeypatch):
    _installed("mamba")
    _installed("fnet")

    def boom(*a, **k):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr(run_clm, "load_raw_datasets", boom)
    monkeypatch.setattr(run_clm, "make_mqar_datasets", boom)
    monkeypatch.setattr(run_mlm, "load_raw_datasets", boom)
    for script, prog, argv, model_type in (
        (run_clm, "run_clm.py", _clm_args("mamba", tmp_path), "mamba"),
        (run_mlm, "run_mlm.py", _mlm_args("fnet", text_file, tmp_path), "fnet"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            run_main(script.main, argv + flags, prog=prog)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(f"{prog}: error: {named}: hf_condinit has no attention layout for "), err[0]
        assert f"model_type='{model_type}'" in err[0] and "--attention sdpa" not in err[0], err[0]
        assert not (tmp_path / "out").exists()
