"""run_mlm.py: a few steps of Crammed BERT pretraining on real text, the recipe defaults, and bad input."""

import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from utils import REPO as ROOT
from utils import TINYSTORIES
from utils import WIKI_TRAIN as WIKITEXT
from utils import load_script, require

run_mlm = load_script("run_mlm.py")

TINY = "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128"
COMMON = [
    "--config_overrides", TINY, "--tokenizer_vocab_size", "1000", "--max_seq_length", "64",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_steps", "4",
    "--max_eval_samples", "16", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
    "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0",
]


@pytest.fixture(scope="module")
def story_file(tmp_path_factory):
    lines = require(TINYSTORIES).read_text(encoding="utf-8").splitlines()[:400]
    path = tmp_path_factory.mktemp("text") / "stories.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_run_mlm_few_steps_conditioned(story_file, tmp_path):
    out = tmp_path / "mlm"
    trainer = run_mlm.main([
        "--train_file", story_file, "--init", "conditioned", "--attention", "sdpa",
        "--do_train", "--do_eval", "--output_dir", str(out), *COMMON,
    ])
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results["train_loss"]) and math.isfinite(results["eval_loss"])
    assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]), rel=1e-6)
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    assert results["eval_loss"] < math.log(1000) + 1.0  # about uniform over the vocabulary, not diverged
    # crammed recipe defaults
    args = trainer.args
    assert args.learning_rate == 1e-3 and args.adam_beta1 == 0.9 and args.adam_beta2 == 0.98
    assert trainer.data_collator.mlm_probability == 0.25
    assert trainer.model.config._attn_implementation == "sdpa"
    decayed = set(trainer.get_decay_parameter_names(trainer.model))  # CondInitTrainer: no decay on < 2-D params
    assert "crammed_bert.layers.0.attention.query_key_value.weight" in decayed
    assert not {"crammed_bert.embeddings.position_embeddings.scale", "crammed_bert.final_norm.weight"} & decayed
    # triangular (one-cycle) schedule: 0 -> peak at half of training -> 0
    lam = trainer.lr_scheduler.lr_lambdas[0]
    assert [lam(0), lam(2), lam(4)] == [0.0, 1.0, 0.0] and lam(1) == pytest.approx(0.5)
    # saved model + tokenizer reload offline; condinit recorded
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "crammed_bert" and config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    assert config["condinit"]["method"] == "conditioned" and config["condinit"]["seed"] == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.mask_token == "[MASK]" and len(tokenizer) == config["vocab_size"]
    model = AutoModelForMaskedLM.from_pretrained(out)
    enc = tokenizer(["Once upon a time there was a [MASK] cat."], return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], len(tokenizer))


def test_run_mlm_continue_from_checkpoint_on_wikitext(story_file, tmp_path):
    require(WIKITEXT)
    first = tmp_path / "first"
    run_mlm.main(["--train_file", story_file, "--do_train", "--output_dir", str(first), *COMMON])
    before = AutoModelForMaskedLM.from_pretrained(first).state_dict()
    second = tmp_path / "second"
    run_mlm.main([
        "--model_name_or_path", str(first), "--train_file", str(WIKITEXT), "--do_train",
        "--output_dir", str(second), "--max_seq_length", "64", "--per_device_train_batch_size", "8",
        "--max_steps", "2", "--use_cpu", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
    ])
    after = AutoModelForMaskedLM.from_pretrained(second).state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained from the loaded weights


def test_run_mlm_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="needs --train_file"):
        run_mlm.main(["--output_dir", str(tmp_path / "o"), "--do_train"])
    with pytest.raises(ValueError, match=r"--train_file '.*missing\.txt' does not exist"):
        run_mlm.main(["--train_file", str(tmp_path / "missing.txt"), "--do_train", "--output_dir", str(tmp_path / "o")])
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.txt' is empty"):
        run_mlm.main(["--train_file", str(empty), "--do_train", "--output_dir", str(tmp_path / "o")])
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\n")
    with pytest.raises(ValueError, match="only whitespace"):
        run_mlm.main(["--train_file", str(blank), "--do_train", "--output_dir", str(tmp_path / "o")])
    text = tmp_path / "t.txt"
    text.write_text("Some real words here.\nAnd a second line.\n" * 50)
    with pytest.raises(ValueError, match="has no attribute 'num_layers'"):
        run_mlm.main(["--train_file", str(text), "--config_overrides", "num_layers=2", "--do_train",
                      "--output_dir", str(tmp_path / "o")])


@pytest.mark.slow
def test_run_mlm_deepspeed_zero2_passes_through(story_file, tmp_path):
    """--deepspeed ds_configs/zero2.json goes through TrainingArguments (one CPU process over gloo)."""
    import socket
    import subprocess

    config = ROOT / "ds_configs" / "zero2.json"
    if not config.is_file():
        pytest.skip(f"{config} not found")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=port)
    out = tmp_path / "ds"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run_mlm.py"), "--train_file", story_file, "--init", "conditioned",
         "--deepspeed", str(config), "--do_train", "--output_dir", str(out), "--log_level", "info",
         *[a if a != "4" else "2" for a in COMMON]],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    logs = proc.stdout + proc.stderr
    assert "zero2.json" in logs  # the TrainingArguments logged at start
    assert "launched by python: world size 1, device cpu, DeepSpeed ZeRO-2" in logs, logs[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results["train_loss"])


def test_parse_config_overrides_casts_with_the_reference_types():
    """Values take the type of the reference attribute; bad items name the flag and the problem."""
    from hf_condinit.models.crammed_bert import CrammedBertConfig
    from hf_condinit.scripts_common import parse_config_overrides

    ref = CrammedBertConfig()
    ref.extra_none = None
    got = parse_config_overrides("num_hidden_layers=3, tie_word_embeddings=FALSE,,layer_norm_eps=1e-6,extra_none=2.5",
                                 ref)
    assert got == {"num_hidden_layers": 3, "tie_word_embeddings": False, "layer_norm_eps": 1e-6, "extra_none": 2.5}
    assert type(got["num_hidden_layers"]) is int and type(got["layer_norm_eps"]) is float
    for bad, message in [("num_hidden_layers", "not of the form key=value"),
                         ("tie_word_embeddings=maybe", "is not a boolean"),
                         ("num_hidden_layers=two", "is not int")]:
        with pytest.raises(ValueError, match=message):
            parse_config_overrides(bad, ref)


def test_default_output_dir_per_arm_and_loaded_model_flags(tmp_path):
    """For run_mlm.py / run_glue.py: one default folder per arm (HF's default was the
    shared 'trainer_output'); --init with a loaded model is refused instead of ignored with a warning."""
    from hf_condinit.scripts_common import UsageError

    run_glue = load_script("run_glue.py")
    assert run_mlm.parse(["--train_file", "x.txt"])[0][3].output_dir == "runs/mlm-default-sdpa"
    assert run_mlm.parse(["--train_file", "x.txt", "--init", "conditioned", "--attention", "affine_scaled"])[0][3] \
        .output_dir == "runs/mlm-conditioned-affine_scaled"
    assert run_glue.parse(["--task_name", "rte", "--model_name_or_path", "out/mlm_c"])[0][3].output_dir \
        == "runs/glue-rte-from-mlm_c-sdpa"
    assert run_glue.parse(["--glue_suite"])[0][3].output_dir == "runs/glue-suite-default-sdpa"
    with pytest.raises(UsageError, match="--init cannot be used with --model_name_or_path"):
        run_glue.parse(["--task_name", "rte", "--model_name_or_path", "out/mlm_c", "--init", "conditioned"])
    with pytest.raises(UsageError, match="--init cannot be used with --model_name_or_path"):
        run_mlm.main(["--train_file", "x.txt", "--model_name_or_path", "out/mlm_c", "--init", "mimetic",
                      "--output_dir", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="value_init is read by method 'conditioned' only"):
        run_glue.parse(["--task_name", "rte", "--init", "mimetic", "--value_init", "per_head"])
