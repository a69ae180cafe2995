"""The pieces every script shares (hf_condinit.scripts_common, hf_condinit.callbacks.non_finite): the resume-or-stop
policy, user errors, the non-finite-loss stop, quiet resumes, report_to tensorboard, option applicability, and a
run of run_clm.py as a user starts it (nothing but what a user needs on the terminal)."""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments

import hf_condinit  # noqa: F401
from hf_condinit.callbacks import NonFiniteLossCallback, NonFiniteLossError
from hf_condinit.callbacks.preemption import SIGNALS
from hf_condinit.config import CondInitConfig, check_options_apply
from hf_condinit.scripts_common import CondInitTrainer, UsageError, find_last_checkpoint, run_main, user_errors

from utils import REPO


def _args(output_dir, do_train=True, resume=None):
    return SimpleNamespace(output_dir=str(output_dir), do_train=do_train, resume_from_checkpoint=resume)


def _checkpoint(path):
    """A minimal complete checkpoint folder (as the stock Trainer writes: weights and trainer state, no manifest)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
    (path / "trainer_state.json").write_text("{}")


def test_find_last_checkpoint_resumes_an_unfinished_run_and_refuses_a_finished_one(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0")  # a torch that can resume (the refusal: the test below)
    out = tmp_path / "run"
    assert find_last_checkpoint(_args(out)) is None  # no folder: a fresh run
    out.mkdir()
    assert find_last_checkpoint(_args(out)) is None  # empty folder: a fresh run
    (out / "checkpoint-12").mkdir()  # a save killed half way: skipped
    with caplog.at_level(logging.WARNING):
        assert find_last_checkpoint(_args(out)) is None
    assert "without a complete checkpoint: starting over" in caplog.text
    _checkpoint(out / "checkpoint-3")
    _checkpoint(out / "checkpoint-10")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert find_last_checkpoint(_args(out)) == str(out / "checkpoint-10")
    assert "resuming from" in caplog.text and "pass a new --output_dir" in caplog.text
    assert f"skipping {out / 'checkpoint-12'}: has no trainer_state.json" in caplog.text
    assert find_last_checkpoint(_args(out, do_train=False)) is None
    assert find_last_checkpoint(_args(out, resume="last")) == str(out / "checkpoint-10")
    (out / "train_results.json").write_text("{}")
    with pytest.raises(UsageError, match=r"holds a finished run; pass a new --output_dir .*--resume_from_checkpoint "
                                         r".*checkpoint-10 to continue it"):
        find_last_checkpoint(_args(out))
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_text("")
    with pytest.raises(UsageError, match="holds files but no checkpoint"):
        find_last_checkpoint(_args(other))
    with pytest.raises(UsageError, match="no complete checkpoint-"):
        find_last_checkpoint(_args(other, resume="last"))
    with pytest.raises(UsageError, match="checkpoint-12: has no trainer_state.json"):
        find_last_checkpoint(_args(other, resume=str(out / "checkpoint-12")))
    with pytest.raises(UsageError, match="is not a directory"):
        find_last_checkpoint(_args(other, resume=str(tmp_path / "nope")))


@pytest.mark.parametrize("version", ["2.5.1+cu124", "2.6.0"])
def test_find_last_checkpoint_refuses_a_resume_below_torch_2_6(tmp_path, monkeypatch, version):
    """Transformers refuses to load a checkpoint's optimizer state on torch < 2.6 (CVE-2025-32434), after the model is
    built: the scripts say so before any model work, for an explicit and for an automatic resume."""
    monkeypatch.setattr(torch, "__version__", version)
    out = tmp_path / "run"
    _checkpoint(out / "checkpoint-4")
    for args in (_args(out), _args(out, resume="last"), _args(tmp_path, resume=str(out / "checkpoint-4"))):
        if version.startswith("2.5"):
            with pytest.raises(UsageError, match=r"^resuming from .*checkpoint-4 needs torch>=2\.6 \(found 2\.5\.1\+cu124"):
                find_last_checkpoint(args)
        else:
            assert find_last_checkpoint(args) == str(out / "checkpoint-4")
    assert find_last_checkpoint(_args(tmp_path / "fresh")) is None  # a fresh run is never refused


def test_user_errors_exit_2_in_one_line_and_clean_up(tmp_path, capsys):
    new_dir = tmp_path / "new"

    def main(argv):
        with user_errors(str(new_dir)):
            new_dir.mkdir()
            (new_dir / "bpe_tokenizer").mkdir()
            raise FileNotFoundError("--train_file 'x.txt' does not exist.\nsecond line")

    with pytest.raises(SystemExit) as exit_info:
        run_main(main, [], prog="script.py")
    assert exit_info.value.code == 2 and not new_dir.exists()
    assert capsys.readouterr().err == "script.py: error: --train_file 'x.txt' does not exist. second line\n"
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(UsageError):
        with user_errors(str(kept)):
            raise ValueError("bad")
    assert kept.exists()  # a folder that was there before is never removed


@pytest.mark.parametrize("ending, exit_code, ended", [("return", None, True), ("preempted", 75, True),
                                                      ("usage error", 2, False)])
def test_run_main_ends_the_process_group_where_every_rank_ends(tmp_path, ending, exit_code, ended):
    """A gloo process group left to interpreter finalisation can abort a finished rank (SIGABRT, "terminate called
    without an active exception": a CI run of tests/scripts/test_run_clm_deepspeed.py). run_main ends it where every
    rank ends together (a normal return, a preemption's checkpoint), right after a collective (on torch 2.5 a bare
    destroy there can deadlock on the GIL); a user error, which one rank may hit alone, leaves it."""
    import torch.distributed as dist

    from hf_condinit.callbacks import TrainingPreempted
    from hf_condinit.commands import end_process_group

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def main(argv):
            dist.all_reduce(torch.ones(3), async_op=True).wait()
            if ending == "usage error":
                raise UsageError("bad flag")
            if ending == "preempted":
                raise TrainingPreempted("SIGTERM", "checkpoint-2", 2, 10)
            return "result"

        if exit_code is None:
            assert run_main(main, [], prog="script.py") == "result"
        else:
            with pytest.raises(SystemExit) as exit_info:
                run_main(main, [], prog="script.py")
            assert exit_info.value.code == exit_code
        assert dist.is_initialized() is not ended
    finally:
        end_process_group()  # what a user error left (a no-op after the others)


def _tiny_trainer(tmp_path, **kwargs):
    cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    data = [{"input_ids": torch.arange(8) % 32, "labels": torch.arange(8) % 32} for _ in range(16)]
    args = TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, report_to="none", max_steps=3,
                             per_device_train_batch_size=4, logging_steps=1, save_strategy="no", disable_tqdm=True,
                             **kwargs)
    return CondInitTrainer(model=model, args=args, train_dataset=data)


@pytest.mark.parametrize("nan_filter", [False, True])
def test_non_finite_loss_stops_the_run_with_an_error(tmp_path, nan_filter):
    """a NaN loss must end in an error, also under HF's default logging_nan_inf_filter (which
    hides a NaN step loss; the NaN gradient norm is still logged)."""
    trainer = _tiny_trainer(tmp_path, logging_nan_inf_filter=nan_filter)
    assert any(isinstance(cb, NonFiniteLossCallback) for cb in trainer.callback_handler.callbacks)
    with torch.no_grad():
        trainer.model.transformer.h[0].attn.c_attn.weight.fill_(float("nan"))
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    with pytest.raises(NonFiniteLossError, match=r"(loss|grad_norm) became nan at step 1"):
        trainer.train()
    # the error skipped on_train_end: the preemption handlers go all the same (a notebook's next Ctrl-C is its own)
    assert {s: signal.getsignal(s) for s in SIGNALS} == handlers


def test_a_signal_makes_train_raise_instead_of_returning(tmp_path):
    """A user's own script calls ``CondInitTrainer.train()`` and then saves: a SIGTERM during training must not let
    ``train()`` return as if the run were finished (the stock Trainer returns once the callback stops it, and the
    script would save the partly trained model as the result). It raises ``TrainingPreempted`` naming the complete
    checkpoint it saved; an undisturbed ``train()`` returns as before."""
    from hf_condinit.callbacks import TrainingPreempted
    from hf_condinit.checkpoints import check_checkpoint

    trainer = _tiny_trainer(tmp_path)

    def sigterm_in_step_1(module, args):
        if module.training:
            os.kill(os.getpid(), signal.SIGTERM)

    handle = trainer.model.register_forward_pre_hook(sigterm_in_step_1)
    with pytest.raises(TrainingPreempted) as stop:
        trainer.train()
    handle.remove()
    assert stop.value.step == 1 and stop.value.max_steps == 3
    assert stop.value.checkpoint == str(tmp_path / "t" / "checkpoint-1")
    assert check_checkpoint(stop.value.checkpoint) is None
    assert _tiny_trainer(tmp_path / "again").train().global_step == 3


# A tiny CondInitTrainer run whose second step ends in a Ctrl-C (SIGINT to this process), as a user's would.
CTRL_C_AT_STEP_2 = textwrap.dedent("""
    import os, signal, torch
    from transformers import AutoModelForCausalLM, GPT2Config, TrainerCallback, TrainingArguments
    from hf_condinit.scripts_common import CondInitTrainer

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job starts ignoring it)

    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    def train(out):
        cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32, bos_token_id=0,
                         eos_token_id=0)
        data = [{"input_ids": torch.arange(8) % 32, "labels": torch.arange(8) % 32} for _ in range(16)]
        args = TrainingArguments(output_dir=out, use_cpu=True, report_to="none", max_steps=1000, save_strategy="no",
                                 per_device_train_batch_size=4, disable_tqdm=True)
        CondInitTrainer(model=AutoModelForCausalLM.from_config(cfg), args=args, train_dataset=data,
                        callbacks=[CtrlC()]).train()
""")


def test_ctrl_c_stops_the_test_session(tmp_path):
    """A user's Ctrl-C during a test that trains in this process ends the pytest session (KeyboardInterrupt, exit
    code 2, the next test never starts) rather than being taken as a preemption (a checkpoint, a failed test, and the
    session going on). The session loads this folder's conftest.py, as README's test command does."""
    test_file = tmp_path / "test_ctrl_c.py"
    test_file.write_text(CTRL_C_AT_STEP_2 + textwrap.dedent("""
        def test_trains():
            train(os.environ["RUN_DIR"])

        def test_next():
            open(os.environ["NEXT_TEST_RAN"], "w").close()
    """))
    env = dict(os.environ, RUN_DIR=str(tmp_path / "run"), NEXT_TEST_RAN=str(tmp_path / "next"),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(tmp_path), str(test_file)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "KeyboardInterrupt" in proc.stdout and not (tmp_path / "next").exists()
    assert not (tmp_path / "run" / "checkpoint-2").exists()  # what the preemption would have saved


def test_ctrl_c_in_a_script_still_saves_and_stops(tmp_path):
    """Outside pytest a first Ctrl-C during ``train()`` is a preemption, as docs/pretraining.md says: a checkpoint at
    the end of that step, then ``TrainingPreempted`` naming it."""
    script = CTRL_C_AT_STEP_2 + textwrap.dedent("""
        import sys
        from hf_condinit.callbacks import TrainingPreempted
        try:
            train(sys.argv[1])
        except TrainingPreempted as stop:
            print("stopped:", stop.signal_name, stop.step, stop.checkpoint)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == f"stopped: SIGINT 2 {out / 'checkpoint-2'}"
    assert sorted(os.listdir(out)) == ["checkpoint-2"]


def test_non_finite_callback_reads_every_loss_key():
    cb = NonFiniteLossCallback()
    state = SimpleNamespace(global_step=5)
    cb.on_log(None, state, None, logs={"loss": 1.0, "grad_norm": 2.0, "eval_loss": 3.0, "learning_rate": float("nan")})
    for key in ("loss", "grad_norm", "eval_loss", "train_loss"):
        with pytest.raises(NonFiniteLossError, match=f"{key} became inf at step 5"):
            cb.on_log(None, state, None, logs={key: float("inf")})


def test_resume_of_tied_weights_is_quiet(tmp_path):
    """resuming GPT-2 warned "missing keys ['lm_head.weight']" (tied to wte; saved once); a real gap is refused."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    trainer = _tiny_trainer(tmp_path)
    result = trainer.model.load_state_dict(
        {k: v for k, v in trainer.model.state_dict().items() if k != "lm_head.weight"}, strict=False
    )
    assert result.missing_keys == ["lm_head.weight"]
    hf_logging.set_verbosity_warning()
    try:
        with CaptureLogger(hf_logging.get_logger("transformers.trainer")) as captured:
            trainer._issue_warnings_after_load(result)
    finally:
        hf_logging.set_verbosity_error()
    assert "lm_head" not in captured.out
    with pytest.raises(UsageError, match=r"holds no weights for 1 parameters of this model \(transformer.wpe.weight\)"):
        trainer._issue_warnings_after_load(result._replace(missing_keys=["transformer.wpe.weight"]))
    assert trainer.model.lm_head.weight is trainer.model.transformer.wte.weight


def test_report_to_tensorboard_works(tmp_path):
    """TensorBoardCallback requires tensorboard, now a dependency (pyproject.toml)."""
    from transformers.integrations import TensorBoardCallback

    trainer = _tiny_trainer(tmp_path)
    trainer.add_callback(TensorBoardCallback())
    trainer.train()
    assert list((tmp_path / "t").rglob("events.out.tfevents.*"))


def test_options_the_method_does_not_read_are_refused():
    """For library users' condinit dicts (an option at its default value is never refused, so a
    stored config.condinit, which holds every option, still loads)."""
    with pytest.raises(ValueError, match="value_init is read by method 'conditioned' only, not 'mimetic'"):
        check_options_apply({"method": "mimetic", "value_init": "per_head"})
    with pytest.raises(ValueError, match="precond_eps is read by attention 'preconditioned' only"):
        check_options_apply({"method": "default", "precond_eps": 1e-3}, attention="sdpa")
    check_options_apply({"method": "orthogonal", "value_init": "per_head", "qk_gain": 2.0})
    check_options_apply({**CondInitConfig(method="mimetic").to_dict()}, attention="sdpa")
    check_options_apply({"method": "default", "precond_eps": 1e-3})  # attention unknown: not judged
    with pytest.raises(ValueError, match=r"'conditioned', 'orthogonal' \(alias of 'conditioned'\)"):
        CondInitConfig(method="fancy")


def test_a_run_prints_what_a_user_needs(tmp_path):
    """As a user runs it: no pin_memory / loss_type / DeepSpeed lines, DeepSpeed not imported
    without --deepspeed; the result line is there."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    code = (
        "import sys, runpy; sys.argv = sys.argv[1:]\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n    print('DEEPSPEED_IMPORTED', 'deepspeed' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "run_clm.py"), "--max_steps", "1", "--synthetic_train_examples", "32",
         "--synthetic_eval_examples", "8", "--output_dir", str(tmp_path / "out"), "--report_to", "none"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0, logs[-3000:]
    for noise in ("pin_memory", "loss_type", "Setting accelerator", "missing keys", "Traceback"):
        assert noise not in logs, logs
    assert "DEEPSPEED_IMPORTED False" in logs and "run_clm result (default, sdpa)" in logs
    assert proc.stdout.count("run_clm.py: launched by python: world size 1, device cpu") == 1
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert math.isfinite(results["perplexity"])
