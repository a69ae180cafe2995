"""Long runs survive the cluster. run_clm.py in-process on a tiny GPT-2 (TinyStories, 6 steps, a checkpoint
every 2), against one uninterrupted reference run:

- every checkpoint is published whole (manifest last, no staging left); each damaged file of the newest checkpoint
  is skipped with one warning naming the folder and the file, and nothing is deleted;
- a kill at every stage of a save (the files written so far, in the order the Trainer wrote them; as this plugin's
  staged save leaves them and as an older version's in-place save left them), and a real ``kill -9`` just before the
  manifest: the rerun resumes from the last complete checkpoint and ends bit-identical to the reference;
- SIGTERM mid-run: a checkpoint at the end of that step, one line, exit 75; the rerun ends bit-identical and its
  ``train_loss`` covers the whole run; a repeated SIGTERM is ignored, a second Ctrl-C ends the process at once;
- a second run into a busy folder: one line, exit 2; a dead holder's lock is taken over with a warning;
- a full disk (a tmpfs, as root): one line naming the folder, the errno and the free space, exit 1, whether the save
  failed half way or could not fit beside the last checkpoint; a clean rerun once there is room.

The two-process (FSDP2) side is in tests/scripts/test_fsdp.py (``test_sigterm_on_one_rank_stops_every_rank``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from hf_condinit.callbacks import PREEMPTED_EXIT_CODE, PreemptionCallback, TrainingPreempted
from hf_condinit import checkpoints, locks
from hf_condinit.commands import run_main
from utils import REPO, TINYSTORIES, checkpoint_write_order, copy_files, load_script, needs

run_clm = load_script("run_clm.py")
pytestmark = needs(TINYSTORIES)

STEPS, EVERY = 6, 2


def _argv(ts_file, out):
    return [
        "--output_dir", str(out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none", "--seed", "7",
        "--model_config", "gpt2-tiny", "--train_file", ts_file, "--block_size", "64", "--tokenizer_vocab_size", "512",
        "--max_steps", str(STEPS), "--per_device_train_batch_size", "4", "--max_train_samples", "48",
        "--learning_rate", "2e-3", "--do_train", "--save_strategy", "steps", "--save_steps", str(EVERY),
        "--logging_steps", "1",
    ]  # fmt: skip


def _final(out):
    return load_file(os.path.join(out, "model.safetensors"))


def _assert_same_model(a, b):
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]


def _unfinished_copy(reference, dst, upto):
    """``dst``: the reference run's folder as it was after step ``upto`` (its checkpoints up to it, the tokenizer)."""
    os.makedirs(dst)
    shutil.copytree(os.path.join(reference, "bpe_tokenizer"), os.path.join(dst, "bpe_tokenizer"))
    for step in range(EVERY, upto + 1, EVERY):
        shutil.copytree(os.path.join(reference, f"checkpoint-{step}"), os.path.join(dst, f"checkpoint-{step}"))


@pytest.fixture(scope="module")
def reference(ts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "reference"
    run_clm.main(_argv(ts_file, out))
    locks.unlock_output_dir(str(out), clear=True)
    return str(out)


def test_checkpoints_are_published_whole(reference):
    assert [os.path.basename(p) for p in checkpoints.checkpoints_newest_first(reference)] == \
        ["checkpoint-6", "checkpoint-4", "checkpoint-2"]
    assert not os.path.exists(os.path.join(reference, checkpoints.STAGING_DIR))
    for path in checkpoints.checkpoints_newest_first(reference):
        manifest = json.load(open(os.path.join(path, checkpoints.MANIFEST_NAME)))
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(manifest["files"])
        assert checkpoints.check_checkpoint(path) is None


def _truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


DAMAGES = {  # name: (what is done to checkpoint-6, the reason the warning must give)
    "model.safetensors truncated": (lambda c: _truncate(os.path.join(c, "model.safetensors")),
                                    r"model\.safetensors is truncated"),
    "optimizer.pt truncated": (lambda c: _truncate(os.path.join(c, "optimizer.pt")), r"optimizer\.pt is truncated"),
    "trainer_state.json truncated": (lambda c: _truncate(os.path.join(c, "trainer_state.json")),
                                     r"trainer_state\.json is truncated"),
    "scheduler.pt missing": (lambda c: os.remove(os.path.join(c, "scheduler.pt")), r"scheduler\.pt is missing"),
    "no manifest, trainer_state.json missing": (
        lambda c: [os.remove(os.path.join(c, n)) for n in (checkpoints.MANIFEST_NAME, "trainer_state.json")],
        r"has no trainer_state\.json"),
    "no manifest, optimizer.pt truncated": (
        lambda c: (os.remove(os.path.join(c, checkpoints.MANIFEST_NAME)), _truncate(os.path.join(c, "optimizer.pt"))),
        r"optimizer\.pt is not a complete torch archive"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_skipped_with_one_warning(reference, tmp_path, caplog, damage):
    out = tmp_path / "run"
    _unfinished_copy(reference, out, STEPS)
    plant, reason = DAMAGES[damage]
    plant(str(out / "checkpoint-6"))
    before = sorted(p.name for p in (out / "checkpoint-6").iterdir())
    caplog.set_level("WARNING")
    assert checkpoints.newest_complete_checkpoint(str(out)) == str(out / "checkpoint-4")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(out / "checkpoint-6") in warnings[0], warnings
    assert __import__("re").search(reason, warnings[0]), warnings[0]
    assert sorted(p.name for p in (out / "checkpoint-6").iterdir()) == before  # nothing deleted


def test_resume_from_a_named_damaged_checkpoint_is_one_line_exit_2(reference, tmp_path, ts_file, capsys):
    out = tmp_path / "run"
    _unfinished_copy(reference, out, 4)
    _truncate(str(out / "checkpoint-4" / "model.safetensors"))
    argv = _argv(ts_file, tmp_path / "other") + ["--resume_from_checkpoint", str(out / "checkpoint-4")]
    with pytest.raises(SystemExit) as info:
        run_main(run_clm.main, argv, prog="run_clm.py")
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "model.safetensors is truncated" in err[0], err


def test_a_kill_at_every_stage_of_a_save_resumes_from_the_last_complete_checkpoint(reference, tmp_path, ts_file):
    """After each file of checkpoint-6's save: the staged save (this plugin) and the in-place save (an older
    version, or the stock Trainer) killed there; the rerun's choice is checkpoint-4 until the save is complete.
    One stage (everything but the manifest, beside an in-place half) is rerun to the end."""
    source = os.path.join(reference, "checkpoint-6")
    order = checkpoint_write_order(source)
    assert order[-1] == checkpoints.MANIFEST_NAME and len(order) >= 8, order
    for k in range(len(order)):
        out = tmp_path / f"stage{k}"
        _unfinished_copy(reference, out, 4)
        copy_files(source, out / checkpoints.STAGING_DIR / "checkpoint-6", order[:k])
        assert checkpoints.newest_complete_checkpoint(str(out)) == str(out / "checkpoint-4"), order[:k]
        copy_files(source, out / "checkpoint-6", [f for f in order[:k] if f != checkpoints.MANIFEST_NAME])
        legacy_complete = set(order[:-1]) <= set(order[:k])
        expected = "checkpoint-6" if legacy_complete else "checkpoint-4"
        assert checkpoints.newest_complete_checkpoint(str(out)) == str(out / expected), order[:k]
    out = tmp_path / f"stage{len(order) - 2}"  # staged and in place: every file but the last one and the manifest
    run_clm.main(_argv(ts_file, out))
    _assert_same_model(_final(out), _final(reference))
    aside = [p.name for p in out.iterdir() if p.name.startswith("damaged-checkpoint-6-")]
    assert len(aside) == 1 and checkpoints.check_checkpoint(str(out / "checkpoint-6")) is None


KILL_BEFORE_MANIFEST = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from utils import load_script
    from hf_condinit import checkpoints
    original = checkpoints.write_manifest
    def write_manifest(folder, step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        original(folder, step)
    checkpoints.write_manifest = write_manifest
    load_script("run_clm.py").main({argv!r})
""")


def test_kill_9_before_the_manifest_then_the_rerun_is_bit_identical(reference, tmp_path, ts_file):
    out = tmp_path / "run"
    code = KILL_BEFORE_MANIFEST.format(tests=os.path.join(REPO, "tests"), argv=_argv(ts_file, out))
    # the same thread count as this process (the reference's): another one changes the sums' rounding
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert json.loads((out / locks.LOCK_NAME).read_text())["pid"]  # the dead run's record is left
    run_clm.main(_argv(ts_file, out))
    _assert_same_model(_final(out), _final(reference))


def test_sigterm_saves_stops_and_the_rerun_is_bit_identical(reference, tmp_path, ts_file, capsys, monkeypatch):
    out = tmp_path / "run"
    original = PreemptionCallback.on_step_end

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3 and self.received is None:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, delivered to the handler before the next line
        return original(self, args, state, control, **kwargs)

    monkeypatch.setattr(PreemptionCallback, "on_step_end", on_step_end)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        run_main(run_clm.main, _argv(ts_file, out), prog="run_clm.py")
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run_clm.py")]
    assert info.value.code == PREEMPTED_EXIT_CODE == 75
    assert err == [f"run_clm.py: SIGTERM received: saved {out}/checkpoint-3 at step 3 of {STEPS} and stopped; rerun "
                   f"the same command to resume from it (exit code 75)"]
    assert checkpoints.check_checkpoint(str(out / "checkpoint-3")) is None
    assert not (out / "train_results.json").exists() and not (out / "model.safetensors").exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is restored when training ends
    monkeypatch.undo()
    locks.unlock_output_dir(str(out))  # the process ends here: its lock record stays
    run_clm.main(_argv(ts_file, out))
    _assert_same_model(_final(out), _final(reference))
    ref, resumed = (json.loads(open(os.path.join(d, "train_results.json")).read()) for d in (reference, out))
    assert resumed["train_segments"] == 2 and ref["train_segments"] == 1
    assert resumed["train_loss"] == ref["train_loss"]  # the running sum continues through the checkpoint
    assert resumed["train_wall_seconds"] > resumed["train_runtime"]


SIGNALS_TWICE = textwrap.dedent("""
    import os, signal, time
    from transformers import TrainerControl, TrainerState
    from hf_condinit.callbacks import PreemptionCallback
    cb = PreemptionCallback()
    cb.on_train_begin(None, TrainerState(), TrainerControl())
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        os.kill(os.getpid(), sig)
        time.sleep(0.1)
        print("alive after", signal.Signals(sig).name, "flag", cb.received, flush=True)
""")


def test_repeated_sigterm_is_ignored_and_a_second_ctrl_c_ends_at_once():
    """Launchers repeat SIGTERM (SLURM signals the whole step, torchrun forwards its own): it must not cut the save
    short; Ctrl-C twice is a person who wants out now."""
    proc = subprocess.run([sys.executable, "-c", SIGNALS_TWICE], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == [f"alive after {s} flag SIGTERM" for s in ("SIGTERM", "SIGTERM", "SIGUSR1")]
    assert proc.returncode == -signal.SIGINT and "received again: already stopping" in proc.stderr


HOLD = ("import sys, time; from hf_condinit import locks; locks.lock_output_dir(sys.argv[1]); "
        "print('held', flush=True); time.sleep(300)")


def test_one_run_per_folder(tmp_path, ts_file, capsys, caplog):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as info:
            run_main(run_clm.main, _argv(ts_file, out), prog="run_clm.py")
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1, err
        assert f"is in use by the run of PID {holder.pid} on" in err[0] and "wait for it to end" in err[0], err
    finally:
        holder.kill()
        holder.wait()
    caplog.set_level("WARNING")
    run_clm.main(_argv(ts_file, out) + ["--max_steps", "1", "--save_strategy", "no"])
    taken = [r.getMessage() for r in caplog.records if "taking over the lock" in r.getMessage()]
    assert len(taken) == 1 and f"PID {holder.pid}" in taken[0]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root only), grown with :func:`_grow` and unmounted at the end."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield where
    subprocess.run(["umount", "-l", str(where)])


def test_a_full_disk_says_so_and_a_rerun_with_room_is_clean(small_disk, reference, ts_file, capsys):
    """4 MiB: the first save fails half way (torch's writer says only "unexpected pos"); 10 MiB: the second save does
    not fit beside the first and is refused before writing; 64 MiB: the rerun ends with the uninterrupted model."""
    out = small_disk / "run"
    argv = _argv(ts_file, out)
    with pytest.raises(SystemExit) as info:
        run_main(run_clm.main, argv, prog="run_clm.py")
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run_clm.py")]
    assert info.value.code == 1 and len(err) == 1, err
    assert err[0].startswith(f"run_clm.py: error: saving checkpoint-2 in {out} failed: [Errno 28] No space left on "
                             f"device (") and "MiB free" in err[0] and "no earlier checkpoint" in err[0], err[0]
    assert not list(out.glob("checkpoint-*")) and not (out / checkpoints.STAGING_DIR).exists()
    locks.unlock_output_dir(str(out))  # the failed process ends: its record stays
    # room for one checkpoint, not two: the free-space check refuses the second save before writing anything
    subprocess.run(["mount", "-o", "remount,size=10m", str(small_disk)], check=True)
    with pytest.raises(SystemExit) as info:
        run_main(run_clm.main, argv, prog="run_clm.py")
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run_clm.py")]
    assert info.value.code == 1 and len(err) == 1, err
    assert "saving checkpoint-4" in err[0] and "the checkpoint needs about" in err[0], err[0]
    assert f"{out}/checkpoint-2 is intact; free space and rerun the same command" in err[0], err[0]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    locks.unlock_output_dir(str(out))
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    run_clm.main(argv)
    _assert_same_model(_final(out), _final(reference))
