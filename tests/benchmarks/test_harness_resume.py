"""The harness resumes a stopped run (``benchmarks/_lm_run.train_run``), as ``run_clm.py`` does: a signal costs at
most the work since the checkpoint it saved, and a kill without warning (SIGKILL) at most the work since the last
periodic checkpoint (``CHECKPOINT_EVERY_SECONDS``, the library's ``PeriodicCheckpointCallback``), not the whole run.

Reference: the same spec trained without a stop. The resumed run must end with the same weights, the same eval and
training curves, the same κ measurements and the same digest of its training batches (the one ``train_batches_sha256``
pairs runs by), and count the CPU and wall seconds of both segments (the library's ``RunTotalsCallback`` carries the
first segment's through the checkpoint). A run of other settings trains in its own folder, and every stopped run
starts over on a torch below ``RESUME_MIN_TORCH`` (the floors' 2.5), where the Trainer cannot load the optimizer
state. The signal is a real SIGTERM sent to this process from inside a training forward
pass; the kill is an exception no handler catches, raised there (what a SIGKILL leaves: no save, no state written),
and the κ lines such a kill can leave past the checkpoint (one complete, one cut short) are planted before the
resume."""

import json
import os
import random
import signal
import time

import pytest
import torch

from hf_condinit.versions import RESUME_MIN_TORCH, torch_below
from utils import TINYSTORIES, load_script

STOP_AT_FORWARD = 6  # SIGTERM during the 6th training forward: the checkpoint is saved at the end of step 6
KILL_AT_FORWARD = 11  # the kill during the 11th: the last periodic checkpoint is step 10's, after κ at step 8
RESUME_REFUSED = torch_below(RESUME_MIN_TORCH)  # the Trainer cannot resume there: the harness starts over


def _text_file(tmp_path) -> str:
    path = tmp_path / "stories.txt"
    if TINYSTORIES.exists():
        path.write_text(TINYSTORIES.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    else:
        rng = random.Random(0)
        names, things = ["Tom", "Lily", "Ben"], ["ball", "cat", "boat"]
        stories = [f"Once upon a time, {rng.choice(names)} had a {rng.choice(things)}. It was lost, then found."
                   for _ in range(600)]
        path.write_text("\n<|endoftext|>\n".join(stories), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """(``_lm_run`` module, tiny ``LMData``, spec factory) on a 60 kB text: 2 layers x 32, 16 steps of 4 x 32
    tokens, eval every 4 steps, κ at steps 0, 8 and 16."""
    load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _common as C
    import _lm_run as LM

    tmp = tmp_path_factory.mktemp("harness_resume")
    data = C.prepare_data([_text_file(tmp)], vocab_size=300, block_size=32, cache_dir=str(tmp / "cache"))

    def spec(arm="affine_scaled", lr=3e-3):
        return LM.TrainSpec(arm=arm, seed=1, n_layer=2, n_embd=32, n_head=2, block_size=32, batch_size=4, steps=16,
                            lr=lr, eval_every=4, eval_blocks=8, log_every=2, kappa_at=(0.0, 0.5, 1.0),
                            kappa_probe=(2, 8), diag_probe=(2, 16), setting="resume_test")

    return LM, data, spec


@pytest.fixture(scope="module")
def whole(harness, tmp_path_factory):
    """(record, Trainer folder) of the reference: the spec trained without a stop."""
    LM, data, spec = harness
    run_dir = str(tmp_path_factory.mktemp("whole") / "run")
    return LM.train_run(spec(), data, run_dir), run_dir


def _sigterm_during_training_forward(n: int):
    """A global forward pre-hook that sends SIGTERM to this process at the ``n``-th training forward of a GPT-2
    LM model; returns its handle."""
    seen = [0]

    def hook(module, args):
        if module.__class__.__name__ == "GPT2LMHeadModel" and module.training:
            seen[0] += 1
            if seen[0] == n:
                os.kill(os.getpid(), signal.SIGTERM)

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


def _weights(run_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "model.safetensors"))


def _resume(LM, spec, data, run_dir):
    """(record, CPU seconds, wall seconds) of ``train_run`` resuming ``run_dir``, its seconds measured around it."""
    cpu, wall = time.process_time(), time.perf_counter()
    rec = LM.train_run(spec, data, run_dir)
    return rec, dict(cpu=time.process_time() - cpu, wall=time.perf_counter() - wall)


def _assert_resumed_like_the_whole(resumed, segment, run_dir, whole, resumed_at: int, capsys):
    """``resumed`` (the record of the run resumed in ``run_dir`` from ``checkpoint-<resumed_at>``) is the ``whole``
    run: batches, curves, κ, final loss, weights; and it counts the seconds of the stopped segment too."""
    whole_rec, whole_dir = whole
    assert "resumed_at" not in whole_rec
    if RESUME_REFUSED:  # transformers cannot load the optimizer state: the run starts over, to the same result
        assert "resumed_at" not in resumed and "resuming needs torch>=" in capsys.readouterr().err
    else:
        assert resumed["resumed_at"] == resumed_at
    assert resumed["train_batches_sha256"] == whole_rec["train_batches_sha256"]
    assert resumed["steps"] == whole_rec["steps"] == 16
    assert [s for s, _ in resumed["eval_curve"]] == [s for s, _ in whole_rec["eval_curve"]] == [0, 4, 8, 12, 16]
    for (_, a), (_, b) in zip(resumed["eval_curve"], whole_rec["eval_curve"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert [r[0] for r in resumed["train_curve"]] == [r[0] for r in whole_rec["train_curve"]]
    for a, b in zip(resumed["train_curve"], whole_rec["train_curve"]):
        assert a[1] == pytest.approx(b[1], rel=1e-5)
    assert [k["step"] for k in resumed["kappa"]] == [k["step"] for k in whole_rec["kappa"]] == [0, 8, 16]
    for a, b in zip(resumed["kappa"], whole_rec["kappa"]):
        assert a["mean"] == pytest.approx(b["mean"], rel=1e-4)
    assert resumed["final_eval_loss"] == pytest.approx(whole_rec["final_eval_loss"], rel=1e-5)
    got, want = _weights(run_dir), _weights(whole_dir)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    # both segments' time is counted (the first segment's training seconds come from the checkpoint)
    if not RESUME_REFUSED:
        with open(os.path.join(run_dir, f"checkpoint-{resumed_at}", "trainer_state.json")) as f:
            saved = json.load(f)["stateful_callbacks"]["hf_condinit_run_totals"]
        for what in ("cpu", "wall"):  # the record minus this segment: the stopped segment's training seconds
            assert 0 < 0.5 * saved[f"{what}_seconds"] < resumed[f"{what}_seconds"] - segment[what], what
        assert resumed["final_eval"]["train_segments"] == 2
    assert resumed["train_seconds"] > 0


def test_a_stopped_run_resumes_to_the_uninterrupted_result(harness, whole, tmp_path, capsys):
    from hf_condinit.callbacks import TrainingPreempted

    LM, data, spec = harness
    run_dir = str(tmp_path / "stopped")
    handle = _sigterm_during_training_forward(STOP_AT_FORWARD)
    try:
        with pytest.raises(TrainingPreempted) as stop:
            LM.train_run(spec(), data, run_dir)
    finally:
        handle.remove()
    assert stop.value.step == STOP_AT_FORWARD
    assert os.path.isdir(os.path.join(run_dir, f"checkpoint-{STOP_AT_FORWARD}"))
    _assert_resumed_like_the_whole(*_resume(LM, spec(), data, run_dir), run_dir, whole, STOP_AT_FORWARD, capsys)


class _Killed(BaseException):
    """Training ends mid-step with no save and no handler run, as under SIGKILL."""


def test_a_killed_run_resumes_from_its_last_periodic_checkpoint(harness, whole, tmp_path, capsys, monkeypatch):
    LM, data, spec = harness
    run_dir = str(tmp_path / "killed")
    monkeypatch.setattr(LM, "CHECKPOINT_EVERY_SECONDS", 1e-9)  # a checkpoint after every step
    seen = [0]

    def kill(module, args):
        if module.__class__.__name__ == "GPT2LMHeadModel" and module.training:
            seen[0] += 1
            if seen[0] == KILL_AT_FORWARD:
                raise _Killed

    handle = torch.nn.modules.module.register_module_forward_pre_hook(kill)
    try:
        with pytest.raises(_Killed):
            LM.train_run(spec(), data, run_dir)
    finally:
        handle.remove()
    last = KILL_AT_FORWARD - 1
    assert sorted(n for n in os.listdir(run_dir) if n.startswith("checkpoint-")) == [f"checkpoint-{last}"]
    # what a kill can leave past the checkpoint: a κ line of a later step, and a line cut short
    kappa_path = os.path.join(run_dir, "condition_number.jsonl")
    with open(kappa_path) as f:
        lines = f.readlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 8]
    with open(kappa_path, "a") as f:
        f.write(json.dumps({**json.loads(lines[-1]), "step": last + 2}) + "\n" + lines[-1][: len(lines[-1]) // 2])
    monkeypatch.setattr(LM, "CHECKPOINT_EVERY_SECONDS", 0.0)
    _assert_resumed_like_the_whole(*_resume(LM, spec(), data, run_dir), run_dir, whole, last, capsys)


def test_a_checkpoint_is_resumed_only_by_the_settings_that_saved_it(harness, tmp_path):
    from hf_condinit.callbacks import TrainingPreempted

    LM, data, spec = harness
    first, other = spec(lr=3e-3), spec(lr=1e-2)
    handle = _sigterm_during_training_forward(STOP_AT_FORWARD)
    try:
        with pytest.raises(TrainingPreempted):
            LM.train_run(first, data, LM.trainer_folder(str(tmp_path), first))
    finally:
        handle.remove()
    assert LM.trainer_folder(str(tmp_path), other) != LM.trainer_folder(str(tmp_path), first)
    rec = LM.train_run(other, data, LM.trainer_folder(str(tmp_path), other))
    assert "resumed_at" not in rec and rec["steps"] == 16
    # the stopped run is left as it was, to be resumed by its own settings
    assert os.path.isdir(os.path.join(LM.trainer_folder(str(tmp_path), first), f"checkpoint-{STOP_AT_FORWARD}"))
