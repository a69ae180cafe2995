"""In all four scripts through the shared code (hf_condinit.scripts): every numeric and choice
flag checked before any work (one line, exit 2, no output folder), the run modes (train and evaluate by default,
nothing-to-do refused), and the launch line (launcher, world size, device; a multi-process launch that got one
process says so)."""

import dataclasses
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hf_condinit.scripts.flag_checks import FLAG_RANGES, FREE_NUMERIC_FLAGS, numeric_fields
from hf_condinit.scripts.launch import launch_summary, launcher_name, single_process_warning
from hf_condinit.scripts_common import run_main

from utils import REPO, load_script

SCRIPTS = ("run_clm.py", "run_mlm.py", "run_glue.py", "run_image_classification.py")
# the minimum each script needs to get past its own flag checks (nothing is loaded before the numeric check)
SCRIPT_ARGS = {"run_glue.py": ["--task_name", "rte"], "run_mlm.py": ["--train_file", "x.txt"],
               "run_image_classification.py": ["--train_file", str(REPO / "tests")]}  # a folder: checked later


class _Parsed(Exception):
    pass


def _dataclass_types(script: str, monkeypatch) -> tuple:
    """The dataclasses ``script`` hands to ``parse_and_set_up`` (its flags), recorded from a real call."""
    module = load_script(script)
    seen = {}

    def record(types, *args, **kwargs):
        seen["types"] = types
        raise _Parsed

    monkeypatch.setattr(module, "parse_and_set_up", record)
    with pytest.raises(_Parsed):
        module.main([])
    return seen["types"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_numeric_flag_has_a_range(script, monkeypatch):
    """A numeric flag added to a script without a rule in FLAG_RANGES (or FREE_NUMERIC_FLAGS) fails here."""
    names = {n for t in _dataclass_types(script, monkeypatch) for n in numeric_fields(t)}
    assert {"learning_rate", "per_device_train_batch_size", "weight_decay", "warmup_steps", "max_steps",
            "num_train_epochs", "gradient_accumulation_steps"} <= names
    assert sorted(names - set(FLAG_RANGES) - FREE_NUMERIC_FLAGS) == []


BAD_FLAGS = [
    (["--learning_rate=-0.001"], "--learning_rate -0.001: must be >= 0."),
    (["--learning_rate", "-0.001"], "--learning_rate -0.001: must be >= 0."),
    (["--learning_rate", "-1e-3"], "expected one argument (a value starting with '-' must be attached with '=': "
                                   "--learning_rate=-1e-3)"),
    (["--learning_rate", "nan"], "--learning_rate nan: must be a finite number."),
    (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0: must be >= 1."),
    (["--per_device_eval_batch_size", "-2"], "--per_device_eval_batch_size -2: must be >= 1."),
    (["--weight_decay", "-0.1"], "--weight_decay -0.1: must be >= 0."),
    (["--warmup_steps", "2.5"], "--warmup_steps 2.5: must be >= 0 (below 1: a fraction"),
    (["--max_steps", "0"], "--max_steps 0: must be >= 1 or -1."),
    (["--num_train_epochs", "0"], "--num_train_epochs 0: must be > 0."),
    (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0: must be >= 1."),
    (["--adam_beta2", "1.0"], "--adam_beta2 1: must be in [0, 1)."),
    (["--seed", "-1"], "--seed -1: must be in [0, 4.29497e+09]."),
    (["--logging_steps", "0"], "--logging_steps"),  # TrainingArguments' own one-line check comes first here
    (["--lr_scheduler_type", "bogus"], "bogus"),  # argparse's choices, or TrainingArguments' enum
    (["--per_device_train_batch_size", "two"], "invalid int value: 'two'"),
    (["--condition_number_probe_size", "0"], "--condition_number_probe_size 0: must be >= 1."),
    (["--save_minutes=-1"], "--save_minutes -1: must be >= 0."),
    (["--save_minutes", "nan"], "--save_minutes nan: must be a finite number."),
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_numeric_and_choice_flags_are_one_line_before_any_work(script, tmp_path, capsys):
    module = load_script(script)
    out = tmp_path / "out"
    for flags, message in BAD_FLAGS:
        with pytest.raises(SystemExit) as exit_info:
            run_main(module.main, [*SCRIPT_ARGS.get(script, []), "--output_dir", str(out), *flags], prog=script)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (flags, err)
        assert err.startswith(f"{script}: error: ") and message in err and err.count("\n") == 1, (flags, err)
        assert not out.exists()
    # each script's own numeric flags too
    own = {"run_clm.py": ["--block_size", "0"], "run_mlm.py": ["--mlm_probability", "1.5"],
           "run_glue.py": ["--max_seq_length", "0"], "run_image_classification.py": ["--train_val_split", "1"]}[script]
    with pytest.raises(SystemExit):
        run_main(module.main, [*SCRIPT_ARGS.get(script, []), "--output_dir", str(out), *own], prog=script)
    assert f"--{own[0][2:]} " in capsys.readouterr().err and not out.exists()


def _parse(script, argv):
    return load_script(script).parse([*SCRIPT_ARGS.get(script, []), *argv])[0][-1]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_trains_and_evaluates_by_default_and_refuses_nothing_to_do(script, tmp_path):
    out = ["--output_dir", str(tmp_path / "o")]
    t = _parse(script, out)
    assert t.do_train and t.do_eval and not t.do_predict
    t = _parse(script, out + ["--do_eval"])
    assert t.do_eval and not t.do_train
    with pytest.raises(ValueError, match="nothing to do: --do_train, --do_eval.* are all off"):
        _parse(script, out + ["--do_train", "false"])
    if script == "run_glue.py":
        assert _parse(script, out + ["--do_predict"]).do_predict
    else:
        with pytest.raises(ValueError, match="--do_predict is not supported by this script"):
            _parse(script, out + ["--do_predict"])
    assert not (tmp_path / "o").exists()


def test_launcher_is_read_from_the_environment():
    assert launcher_name({}) == "python"
    assert launcher_name({"RANK": "0", "WORLD_SIZE": "1"}) == "python"  # run_clm.py --deepspeed without a launcher
    assert launcher_name({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"}) == "torchrun"
    assert launcher_name({"LOCAL_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"}) == "deepspeed"
    # accelerate's multi-process launcher runs torchrun underneath: accelerate is named
    assert launcher_name({"ACCELERATE_MIXED_PRECISION": "no", "TORCHELASTIC_RUN_ID": "x"}) == "accelerate"
    assert launcher_name({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == "srun"
    args = SimpleNamespace(use_cpu=True, deepspeed=None)
    assert launch_summary(args, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4"}) == \
        "launched by torchrun: world size 4, device cpu"


def test_a_multi_process_launch_with_one_process_says_so():
    accelerate_cpu = {"ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1"}
    warning = single_process_warning(accelerate_cpu, asked=2)
    assert warning.startswith("accelerate launch was asked for 2 processes but started this one alone (world size 1)")
    assert "--multi_gpu --num_processes N" in warning
    assert single_process_warning({**accelerate_cpu, "WORLD_SIZE": "2", "RANK": "0"}) is None  # a real group
    assert single_process_warning({"ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no"}) is None  # 1 asked
    assert "srun started 4 tasks" in single_process_warning({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert single_process_warning({}) is None


@pytest.mark.skipif(shutil.which("accelerate") is None, reason="accelerate launcher not on PATH")
def test_accelerate_cpu_with_two_processes_prints_the_one_process_line(tmp_path):
    """The issue's command, ended by a user error right after the start-up line (no training needed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [shutil.which("accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", str(REPO / "run_clm.py"),
         "--train_file", str(tmp_path / "missing.txt"), "--output_dir", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    err = proc.stderr
    assert "run_clm.py: launched by accelerate: world size 1, device cpu" in proc.stdout, (proc.stdout + err)[-3000:]
    assert "run_clm.py: warning: accelerate launch was asked for 2 processes but started this one alone" in err
    assert "run_clm.py: error: --train_file" in err and not (tmp_path / "o").exists()


# ---- every folder a script writes, checked before any work ---------------------------------------
def _fail_fast(script, argv, capsys):
    """Run ``script`` with ``argv`` (after its minimal flags); return its one error line. The data flags of
    SCRIPT_ARGS name files that do not exist, so an error about anything else shows it came first."""
    with pytest.raises(SystemExit) as exit_info:
        run_main(load_script(script).main, [*SCRIPT_ARGS.get(script, []), *argv], prog=script)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"{script}: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def read_only_folder(tmp_path, monkeypatch):
    """A folder without write permission; as root (who may write anyway) ``os.access`` reports the mode bits."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: real(p, mode, **kw) and not (
            mode & os.W_OK and not os.stat(p).st_mode & 0o200))
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize("script", SCRIPTS)
def test_output_dir_that_cannot_be_written_is_one_line_before_any_work(script, tmp_path, read_only_folder, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    cases = [
        (["--output_dir", str(a_file)], f"--output_dir {a_file} is a file, not a folder"),
        (["--output_dir", str(a_file / "run")], f"--output_dir {a_file / 'run'}: {a_file} is a file"),
        (["--output_dir", str(read_only_folder)], f"--output_dir {read_only_folder} is not writable"),
        (["--output_dir", str(read_only_folder / "run" / "x")],
         f"--output_dir {read_only_folder / 'run' / 'x'} cannot be created: {read_only_folder} is not writable"),
        (["--output_dir", str(tmp_path / "o"), "--cache_dir", str(a_file)], f"--cache_dir {a_file} is a file"),
    ]
    for argv, says in cases:
        assert says in _fail_fast(script, argv, capsys)
    assert a_file.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "ro"]
    assert list(read_only_folder.iterdir()) == []


def test_output_dir_check_comes_before_the_data_and_the_model(tmp_path, capsys, monkeypatch):
    """run_clm.py's embedded run: nothing is tokenised or built when --output_dir is a file."""
    module = load_script("run_clm.py")
    called = []
    monkeypatch.setattr(module, "prepare_data", lambda *a, **k: called.append("data"))
    monkeypatch.setattr(module, "build_model", lambda *a, **k: called.append("model"))
    (tmp_path / "f").write_text("")
    assert "is a file, not a folder" in _fail_fast("run_clm.py", ["--output_dir", str(tmp_path / "f")], capsys)
    assert called == []
