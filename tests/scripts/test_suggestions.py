"""A misspelt flag, model type, attention or config name gets the closest known one, in the one
error line (exit 2, before any work); a missing local --model_name_or_path folder says so instead of transformers'
"Repo id must be in the form ...".
"""

import json

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

import hf_condinit  # noqa: F401  (installs the hooks)
from hf_condinit.names import did_you_mean
from hf_condinit.scripts.flag_checks import looks_like_local_path
from hf_condinit.scripts_common import run_main

from utils import REPO, load_script

SCRIPTS = ("run_clm.py", "run_mlm.py", "run_glue.py", "run_image_classification.py")
SCRIPT_ARGS = {"run_glue.py": ["--task_name", "rte"], "run_mlm.py": ["--train_file", "x.txt"],
               "run_image_classification.py": ["--train_file", str(REPO / "tests")]}  # read later than the checks


def _error(script, argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        run_main(load_script(script).main, [*SCRIPT_ARGS.get(script, []), "--output_dir", str(tmp_path / "o"), *argv],
                 prog=script)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"{script}: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    return err


def test_did_you_mean():
    assert did_you_mean("lama", ["qwen3", "llama", "gpt2"]) == " (did you mean 'llama'?)"
    assert did_you_mean("--learnig_rate", ["--learning_rate", "--seed"], quote="") == " (did you mean --learning_rate?)"
    assert did_you_mean("Qwen-3", ["qwen_3", "gpt2"]) == " (did you mean 'qwen_3'?)"  # case and dash slips
    assert did_you_mean("zzzz", ["llama", "gpt2"]) == ""


@pytest.mark.parametrize("script", SCRIPTS)
def test_unknown_flag_gets_the_closest_flag(script, capsys, tmp_path):
    err = _error(script, ["--learnig_rate", "1e-3"], capsys, tmp_path)
    assert "unknown flag --learnig_rate (did you mean --learning_rate?)" in err
    err = _error(script, ["--per_device_train_batchsize=8"], capsys, tmp_path)
    assert "unknown flag --per_device_train_batchsize (did you mean --per_device_train_batch_size?)" in err
    assert "unexpected argument 'stray'" in _error(script, ["stray"], capsys, tmp_path)


def test_unknown_key_of_a_json_argument_file(capsys, tmp_path):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": str(tmp_path / "o"), "learnig_rate": 1e-3}))
    with pytest.raises(SystemExit):
        run_main(load_script("run_clm.py").main, [str(args)], prog="run_clm.py")
    assert "unknown key 'learnig_rate' (did you mean 'learning_rate'?)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--attention", "afine_scaled"], "unknown --attention 'afine_scaled' (did you mean 'affine_scaled'?); choose one "
                                      "of: default, sdpa, eager, affine_scaled, attention_sink, preconditioned"),
    (["--attention", "spectral"], "spectral conditioning is not an attention implementation; pass --spectral_lambda"),
    (["--init", "condtioned"], "unknown --init 'condtioned' (did you mean 'conditioned'?)"),
    (["--model_config", "gpt2-tny"], "--model_config 'gpt2-tny' (did you mean 'gpt2-tiny'?) is not a config"),
    (["--config_overrides", "n_emb=8"], "GPT2Config has no attribute 'n_emb' (did you mean 'n_embd'?)"),
])
def test_misspelt_names_of_the_scripts(argv, says, capsys, tmp_path):
    assert says in _error("run_clm.py", argv, capsys, tmp_path)


def test_attn_implementation_typo_lists_the_plugins_names_and_the_closest():
    config = AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=32)
    with pytest.raises(ValueError) as err:
        AutoModelForCausalLM.from_config(config, attn_implementation="afine_scaled")
    text = str(err.value)
    assert 'attn_implementation="afine_scaled"` is not supported' in text and 'eager' in text  # transformers' list
    assert 'hf_condinit adds "affine_scaled", "attention_sink", "preconditioned"' in text
    assert "condinit={'spectral_lambda': λ}" in text and text.endswith("Did you mean 'affine_scaled'?")
    with pytest.raises(ValueError, match="spectral conditioning is not an attention implementation") as err:
        AutoModelForCausalLM.from_config(config, attn_implementation="spectral")
    assert "Did you mean" not in str(err.value)
    assert AutoModelForCausalLM.from_config(config, attn_implementation="affine_scaled") is not None


@pytest.mark.parametrize("script", SCRIPTS)
def test_missing_local_model_folder_says_so(script, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for value in ("./runs/clm-x", str(tmp_path / "runs" / "clm-x"), "runs/clm-x", "runs/a/b"):
        err = _error(script, ["--model_name_or_path", value], capsys, tmp_path)
        assert f"--model_name_or_path {value}: no such folder; pass the folder of a saved model" in err
        assert "Repo id" not in err


def test_what_looks_like_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for value in ("./m", "../m", "/m", "~/m", "a/b/c", "runs/x", "bad name!"):
        assert looks_like_local_path(value), value
    for value in ("gpt2", "openai-community/gpt2", "org/name"):  # hub ids: left to transformers
        assert not looks_like_local_path(value), value
