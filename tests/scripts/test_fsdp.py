"""run_clm.py and run_mlm.py under the Trainer's FSDP2 with two CPU processes (gloo), against one process.

One torchrun launch runs every FSDP job in the same two processes (``tests/fsdp_worker.py``; start-up is paid once),
and at the same time one plain process runs the single-process references over the same global batches (2 × 4 sequences per step under FSDP,
8 in one process; SGD with momentum, constant lr: Adam's first steps would turn rounding into sign flips, and a
stateless optimizer is beyond torch 2.13's full-state-dict optimizer loading, which finds no tensor to read the device
from: "Expected device to be set"). Each job dumps every
rank's full gathered state (parameters and persistent buffers, α_ma included) when training begins and ends.

FSDP on CPU needs :func:`hf_condinit.scripts.launch.enable_cpu_fsdp` (accelerate 1.15 and 1.16 otherwise train
``--fsdp`` as DDP on CPU): every job's launch line must name FSDP2, the checkpoint must be FSDP's (``pytorch_model_fsdp.bin``)
and the κ callback must meet sharded parameters (DTensors) and skip.

Checked: conditioned and mimetic init (GPT-2 and Crammed BERT) equal to the single-process build on both ranks;
affine_scaled, attention_sink, preconditioned and spectral train with the ranks bit-equal and within 1e-6 of one
process; 2 + 2 resumed steps equal 4 uninterrupted ones bit for bit; ``--model_name_or_path`` through the rank-0
loading path (``cpu_ram_efficient_loading``) keeps the loaded weights exactly; the saved models reload exactly with
hf_condinit and, for the variants, without it; the κ callback skips with one line and the run report is written;
a planted fault (each rank reducing α_ma alone) makes the rank check fail. The rank-0 loading of a model with
persistent buffers (α_ma) needs :mod:`hf_condinit.scripts.fsdp_compat`'s patch on accelerate < 1.16; on torch < 2.6 (no FSDP2) the
two-process tests are skipped and the config tests check the scripts' one-line refusal instead. 92 s for the file
on 2 cores shared with other jobs (load average 15; the two launches 68 s of it).
"""

import json
import os
import random
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, TrainingArguments

from hf_condinit.scripts import fsdp_compat
from hf_condinit.checkpoints import MANIFEST_NAME, STAGING_DIR, check_checkpoint, newest_complete_checkpoint
from hf_condinit.errors import UsageError
from hf_condinit.scripts.launch import fsdp_summary, launch_summary
from utils import REPO, WIKI_TRAIN, checkpoint_write_order, copy_files, gpt2_conditioned_checks, needs

FSDP_CONFIGS = {name: os.path.join(REPO, "fsdp_configs", f"{name}.json")
                for name in ("gpt2-472m", "gpt2-1.72b", "crammed-bert")}
STEPS, PER_RANK, RANKS = 4, 4, 2
VARIANTS = {  # tag: the flags of a run_clm.py job (each a different init / attention variant)
    "affine": ["--init", "conditioned", "--attention", "affine_scaled"],
    "sink": ["--init", "mimetic", "--attention", "attention_sink"],
    "precond": ["--init", "conditioned", "--attention", "preconditioned"],
    "spectral": ["--init", "mimetic", "--spectral_lambda", "1.0"],
}
CLM = ["--use_cpu", "--synthetic_train_examples", "256", "--synthetic_eval_examples", "16", "--do_train",
       "--optim", "sgd", "--optim_args", "momentum=0.9", "--learning_rate", "0.05", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
       "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--seed", "5"]
MLM = ["--use_cpu", "--train_file", str(WIKI_TRAIN), "--config_overrides",
       "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128", "--tokenizer_vocab_size",
       "500", "--max_seq_length", "32", "--max_train_samples", "64", "--do_train", "--max_steps", "2", "--optim",
       "sgd", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "5",
       "--init", "mimetic", "--attention", "affine_scaled"]


def _fsdp(config: str, **overrides) -> list[str]:
    """``--fsdp --fsdp_config FILE`` (or the file's dict with ``overrides``, written inline)."""
    if not overrides:
        return ["--fsdp", "--fsdp_config", FSDP_CONFIGS[config]]
    return ["--fsdp", "--fsdp_config", json.dumps({**json.load(open(FSDP_CONFIGS[config])), **overrides})]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _start(name: str, cmd: list[str], jobs: list[dict], where) -> tuple:
    """Start ``cmd tests/fsdp_worker.py JOBS`` in the background, its output in ``where/<name>.log``."""
    (where / f"{name}.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env = dict(env, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    log = open(where / f"{name}.log", "w")
    proc = subprocess.Popen([*cmd, os.path.join(REPO, "tests", "fsdp_worker.py"), str(where / f"{name}.json")],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def _finish(started: tuple) -> str:
    proc, log = started
    try:
        proc.wait(timeout=900)
    finally:
        proc.kill()
        log.close()
    text = open(log.name).read()
    assert proc.returncode == 0, text[-8000:]
    return text


def _mqar_text(path) -> str:
    """Lines of the synthetic task's words, for continuing a model that has its word-level tokenizer."""
    rng = random.Random(0)
    path.write_text("\n".join(" ".join(f"{rng.choice('kv')}{rng.randrange(32)}" for _ in range(40))
                              for _ in range(200)) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run every job; returns ``(where, fsdp_log)``. ``where/<tag>``: a job's output_dir, ``where/<tag>-...pt``: dumps."""
    where = tmp_path_factory.mktemp("fsdp")

    def job(tag, argv, script="run_clm.py", fault=False, out=None, **faults):
        return {"tag": tag, "script": script, "argv": [*argv, "--output_dir", str(where / (out or tag))],
                "dump": str(where / tag), "fault": fault, **faults}

    def clm(flags, batch):
        return [*CLM, *flags, "--max_steps", str(STEPS), "--per_device_train_batch_size", str(batch)]

    fsdp_jobs = [
        # full_shard + activation checkpointing + rank-0 broadcast (the 1.72B config); a checkpoint at step 2
        job("affine", [*clm(VARIANTS["affine"], PER_RANK), *_fsdp("gpt2-1.72b"), "--save_strategy", "steps",
                       "--save_steps", "2", "--log_condition_number_every", "2"]),
        job("resumed", [*clm(VARIANTS["affine"], PER_RANK), *_fsdp("gpt2-1.72b"), "--save_strategy", "no",
                        "--resume_from_checkpoint", str(where / "affine" / "checkpoint-2")]),
        *[job(tag, [*clm(VARIANTS[tag], PER_RANK), *_fsdp("gpt2-472m"), "--save_strategy", "no"])
          for tag in ("sink", "precond", "spectral")],
        # the chunked LM-head loss reads the head's weight outside its forward, under full_shard
        job("chunked", [*clm(VARIANTS["precond"], PER_RANK), *_fsdp("gpt2-1.72b"), "--save_strategy", "no",
                        "--lm_head_ce", "chunked"]),
        job("loaded", ["--use_cpu", "--model_name_or_path", str(where / "affine"), "--train_file",
                       _mqar_text(where / "mqar.txt"), "--block_size", "32", "--do_train", "--max_steps", "1",
                       "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
                       "--disable_tqdm", "true", *_fsdp("gpt2-472m", cpu_ram_efficient_loading=True)]),
        job("mlm", [*MLM, "--per_device_train_batch_size", str(PER_RANK),
                    *_fsdp("crammed-bert")], script="run_mlm.py"),
        job("fault", [*clm(VARIANTS["affine"], PER_RANK), *_fsdp("gpt2-472m"), "--save_strategy", "no"], fault=True),
        # SIGTERM on rank 1 alone during step 2; the rerun skips a planted damaged checkpoint-3
        job("sigterm", [*clm(VARIANTS["affine"], PER_RANK), *_fsdp("gpt2-1.72b"), "--save_strategy", "no"],
            signal=[1, 2]),
        job("sigterm-rerun", [*clm(VARIANTS["affine"], PER_RANK), *_fsdp("gpt2-1.72b"), "--save_strategy", "no"],
            out="sigterm", plant="checkpoint-3"),
    ]
    single_jobs = [job(f"{tag}-single", [*clm(VARIANTS[tag], PER_RANK * RANKS), "--save_strategy", "no"])
                   for tag in VARIANTS]
    single_jobs.append(job("mlm-single", [*MLM, "--per_device_train_batch_size", str(PER_RANK * RANKS)],
                           script="run_mlm.py"))
    # both at once: the start-up of one overlaps the other's work
    fsdp = _start("fsdp", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
                           "--master_port", _free_port()], fsdp_jobs, where)
    single = _start("single", [sys.executable], single_jobs, where)
    log = _finish(fsdp)
    _finish(single)
    return where, log


def _dumps(where, tag, when="final") -> list[dict]:
    return [torch.load(where / f"{tag}-{when}-rank{r}.pt") for r in range(RANKS)]


def rank_mismatches(ranks: list[dict]) -> list[str]:
    """The names whose tensors are not bit-equal on every rank (the rank check; [] when they all agree)."""
    return sorted(k for k in ranks[0] if any(not torch.equal(ranks[0][k], other[k]) for other in ranks[1:]))


def _assert_close_to(state: dict, reference: dict, atol: float, what: str):
    assert set(state) == set(reference), what
    for k in reference:
        torch.testing.assert_close(state[k], reference[k], rtol=0, atol=atol, msg=f"{what}: {k}")


#: the scripts' one line on a torch without FSDP2 (torch < 2.6), at start, before any model work
REFUSAL = ("run_clm.py: error: FSDP2 (fsdp_version 2) needs torch >= 2.6, which added "
           "torch.distributed.fsdp.fully_shard; this is torch {}: install torch >= 2.6.")
#: the same on an accelerate without FSDP2 (accelerate < 1.6) and a torch with it
REFUSAL_ACCELERATE = ("run_clm.py: error: FSDP2 (fsdp_version 2) needs accelerate >= 1.6, which added FSDP2 to its "
                      "FSDP plugin; this is accelerate {}: install accelerate >= 1.6.")
OLD_TORCH = ("FSDP2 needs torch >= 2.6 and accelerate >= 1.6: the scripts refuse it "
             "(test_fsdp_config_builds_the_plugin checks the line)")


def multi_process(test):
    """The tests on the two-process runs: slow (the ``runs`` fixture), they need the MLM text and FSDP2 (torch 2.6+;
    on older torch the config tests check the scripts' refusal instead)."""
    return pytest.mark.skipif(not fsdp_compat.fsdp2_supported(), reason=OLD_TORCH)(
        pytest.mark.slow(needs(WIKI_TRAIN)(test)))


@multi_process
def test_every_job_ran_under_fsdp2(runs):
    where, log = runs
    # affine, resumed, chunked, sigterm, sigterm-rerun
    assert log.count("launched by torchrun: world size 2, device cpu, FSDP2 full_shard") == 5
    assert log.count("launched by torchrun: world size 2, device cpu, FSDP2 shard_grad_op") == 6
    assert "runs as DDP" not in log
    assert (where / "affine" / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()  # written by FSDP's save only


@multi_process
@pytest.mark.parametrize("tag, method", [("affine", "conditioned"), ("sink", "mimetic"), ("mlm", "mimetic")])
def test_init_equals_the_single_process_build_on_every_rank(runs, tag, method):
    where, _ = runs
    single = torch.load(where / f"{tag}-single-init-rank0.pt")
    for rank, state in enumerate(_dumps(where, tag, "init")):
        assert set(state) == set(single)
        for k in single:
            assert torch.equal(state[k], single[k]), f"rank {rank}: {k}"
    config = AutoConfig.from_pretrained(where / tag)
    assert config.condinit["method"] == method
    if method == "conditioned":  # the recipe itself, against its definition (QᵀQ = KᵀK = I, V = I, zero biases)
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(single, strict=False)
        gpt2_conditioned_checks(model)


@multi_process
@pytest.mark.parametrize("tag", sorted(VARIANTS))
def test_variant_trains_like_one_process(runs, tag):
    where, _ = runs
    ranks = _dumps(where, tag)
    assert rank_mismatches(ranks) == []
    single = torch.load(where / f"{tag}-single-final-rank0.pt")
    _assert_close_to(ranks[0], single, 1e-6, tag)
    init = torch.load(where / f"{tag}-single-init-rank0.pt")
    moved = max((single[k] - init[k]).abs().max().item() for k in single if single[k].is_floating_point())
    assert moved > 1e-3  # the steps did change the model: the comparison is not between two initial states


@multi_process
def test_chunked_lm_head_loss_trains_like_the_models_own(runs):
    """``--lm_head_ce chunked`` under FSDP2 full_shard (the 1.72B config): the ranks agree and end where one process
    with the model's own loss does (the preconditioned job's reference), up to the losses' fp32 rounding."""
    where, _ = runs
    ranks = _dumps(where, "chunked")
    assert rank_mismatches(ranks) == []
    _assert_close_to(ranks[0], torch.load(where / "precond-single-final-rank0.pt"), 1e-5, "chunked")


@multi_process
def test_planted_fault_fails_the_rank_check(runs):
    """Each rank updating α_ma from its own half of the batch: the ranks disagree on α_ma (only: the parameters are
    one sharded copy), and each rank's α_ma is farther from the one-process value than the same job's without the
    fault. Over these 4 small steps the fault moves α_ma by < 1e-6: the one-process comparison alone would pass it,
    the exact rank check does not."""
    where, _ = runs
    ranks = _dumps(where, "fault")
    mismatched = rank_mismatches(ranks)
    assert mismatched and all(k.endswith("alpha_ma") for k in mismatched), mismatched
    single = torch.load(where / "affine-single-final-rank0.pt")
    clean = _dumps(where, "affine")
    assert rank_mismatches(clean) == []  # the same job without the fault

    def off(state):
        return max((state[k] - single[k]).abs().max().item() for k in mismatched)

    for state in ranks:
        assert off(state) > max(10 * off(clean[0]), 1e-7)


@multi_process
def test_resume_is_exact(runs):
    where, _ = runs
    uninterrupted, resumed = _dumps(where, "affine"), _dumps(where, "resumed")
    for a, b in zip(uninterrupted, resumed):
        assert set(a) == set(b)
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@multi_process
def test_sigterm_on_one_rank_stops_every_rank_and_the_rerun_is_exact(runs):
    """a signal on rank 1 alone stops both ranks after the same step with one complete (atomic) FSDP
    checkpoint; the rerun of the same command skips a damaged newer checkpoint with a warning and ends bit-equal to
    the uninterrupted run on every rank."""
    where, log = runs
    assert [json.load(open(where / f"sigterm-preempted-rank{r}.json")) for r in range(RANKS)] == [{"step": 2}] * RANKS
    assert [p.name for p in sorted((where / "sigterm").glob("checkpoint-*"))] == ["checkpoint-2", "checkpoint-3"]
    assert check_checkpoint(str(where / "sigterm" / "checkpoint-2")) is None
    assert (where / "sigterm" / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()  # FSDP's own save
    assert f"skipping {where / 'sigterm' / 'checkpoint-3'}: has no trainer_state.json" in log
    uninterrupted, rerun = _dumps(where, "affine"), _dumps(where, "sigterm-rerun")
    for a, b in zip(uninterrupted, rerun):
        assert set(a) == set(b)
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    results = json.load(open(where / "sigterm" / "train_results.json"))
    assert results["train_segments"] == 2


@multi_process
def test_fsdp_checkpoint_killed_at_every_stage_or_damaged_is_skipped(runs, tmp_path):
    """Long runs survive the cluster on FSDP2's checkpoint files: a copy of the run with checkpoint-4's save stopped after each file
    (staged, as this plugin saves; and in place, as an older version saved) or with one file truncated resumes from
    checkpoint-2."""
    where, _ = runs
    source = where / "affine" / "checkpoint-4"
    order = checkpoint_write_order(source)
    assert "pytorch_model_fsdp.bin" in order and order[-1] == MANIFEST_NAME
    for k in range(len(order)):
        run = tmp_path / f"stage{k}"
        shutil.copytree(where / "affine" / "checkpoint-2", run / "checkpoint-2")
        copy_files(source, run / STAGING_DIR / "checkpoint-4", order[:k])
        copy_files(source, run / "checkpoint-4", [f for f in order[:k] if f != MANIFEST_NAME])
        complete_in_place = set(order[:-1]) <= set(order[:k])
        expected = "checkpoint-4" if complete_in_place else "checkpoint-2"
        assert newest_complete_checkpoint(str(run)) == str(run / expected), order[:k]
    for name in [f for f in order if f.endswith((".bin", ".pt", ".pth", ".json", ".safetensors"))]:
        run = tmp_path / f"damaged-{name.replace('/', '_')}"
        for step in (2, 4):
            shutil.copytree(where / "affine" / f"checkpoint-{step}", run / f"checkpoint-{step}")
        with open(run / "checkpoint-4" / name, "r+b") as f:
            f.truncate(os.path.getsize(run / "checkpoint-4" / name) // 2)
        expected = f"{name} is unreadable" if name == MANIFEST_NAME else \
            f"{name} is truncated ({os.path.getsize(run / 'checkpoint-4' / name)} of {os.path.getsize(source / name)} bytes)"
        assert check_checkpoint(str(run / "checkpoint-4")) == expected
        assert newest_complete_checkpoint(str(run)) == str(run / "checkpoint-2")


@multi_process
def test_rank0_loading_keeps_the_loaded_weights(runs):
    where, _ = runs
    saved = AutoModelForCausalLM.from_pretrained(where / "affine").state_dict()
    assert any(k.endswith("alpha_ma") for k in saved)
    for state in _dumps(where, "loaded", "init"):
        assert set(state) == set(saved)
        assert all(torch.equal(state[k], saved[k]) for k in saved)


@multi_process
def test_saved_models_reload_with_and_without_the_plugin(runs, tmp_path):
    where, _ = runs
    for tag in VARIANTS:
        final = _dumps(where, tag)[0]
        model = AutoModelForCausalLM.from_pretrained(where / tag)
        state = model.state_dict()
        assert set(state) == set(final) and all(torch.equal(state[k], final[k]) for k in final), tag
    mlm_final = _dumps(where, "mlm")[0]
    mlm = AutoModelForMaskedLM.from_pretrained(where / "mlm").state_dict()
    assert set(mlm) == set(mlm_final) and all(torch.equal(mlm[k], mlm_final[k]) for k in mlm)
    assert rank_mismatches(_dumps(where, "mlm")) == []
    # plain transformers (hf_condinit blocked): the variants' portable code, the same tensors
    out = tmp_path / "plain.pt"
    dirs = [str(where / tag) for tag in VARIANTS]
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "fsdp_plain_load.py"), str(out), *dirs],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    plain = torch.load(out)
    for tag, d in zip(VARIANTS, dirs):
        final = _dumps(where, tag)[0]
        assert set(plain[d]) == set(final), tag
        assert all(torch.equal(plain[d][k], final[k]) for k in final), tag


@multi_process
def test_kappa_skips_with_one_line_and_the_report_is_written(runs):
    where, log = runs
    assert log.count("κ(J) is not measured under FSDP") == 1
    assert not (where / "affine" / "condition_number.jsonl").exists()
    assert (where / "affine" / "loss.png").stat().st_size > 0
    assert "conditioned" in (where / "affine" / "README.md").read_text()


# ---- the shipped configs and the launch line (one process, no training) ------------------------------------------


@pytest.mark.parametrize("name, layers, summary", [("gpt2-472m", 24, "FSDP2 shard_grad_op"),
                                                  ("gpt2-1.72b", 48, "FSDP2 full_shard")])
def test_fsdp_config_builds_the_plugin(tmp_path, monkeypatch, name, layers, summary):
    """Through the Trainer's path: ``TrainingArguments(fsdp=True, fsdp_config=FILE)`` → ``fsdp_plugin_args`` →
    accelerate's ``FullyShardedDataParallelPlugin``, whose wrap policy must pick every block of the model size. On
    torch < 2.6 (no FSDP2) ``run_clm.py`` with the config must instead stop at start with exit code 2 and one line
    (:data:`REFUSAL`), leaving no output folder."""
    if not fsdp_compat.fsdp2_supported():
        _assert_refused(name, tmp_path)
        return
    from accelerate.utils import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # the plugin sets it: restored after the test
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp=True,
                             fsdp_config=FSDP_CONFIGS[name])
    raw = json.load(open(FSDP_CONFIGS[name]))
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is raw["reshard_after_forward"]
    assert plugin.activation_checkpointing is raw["activation_checkpointing"]
    assert plugin.cpu_ram_efficient_loading is raw["cpu_ram_efficient_loading"]
    cfg = AutoConfig.from_pretrained(os.path.join(REPO, "configs", f"{name}.json"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    plugin.set_auto_wrap_policy(model)
    wrapped = [m for m in model.modules() if plugin.auto_wrap_policy(m, recurse=False, nonwrapped_numel=0)]
    assert len(wrapped) == layers and all(type(m).__name__ == "GPT2Block" for m in wrapped)
    assert launch_summary(args, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "8"}) == \
        f"launched by torchrun: world size 8, device cpu, {summary} (runs as DDP on cpu)"
    # the plugin accelerate itself reads from `accelerate launch` with an FSDP config: same name
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
           "FSDP_RESHARD_AFTER_FORWARD": str(raw["reshard_after_forward"]).lower()}
    assert fsdp_summary(object(), env) == summary


def _assert_refused(name: str, tmp_path):
    """``run_clm.py --fsdp --fsdp_config <name>`` on this (FSDP2-less) torch: exit code 2, :data:`REFUSAL` alone on
    stderr, no output folder (refused before any model work)."""
    out = tmp_path / "out"
    argv = [*CLM, "--max_steps", "1", *_fsdp(name), "--output_dir", str(out)]
    proc = subprocess.run([sys.executable, "run_clm.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"run_clm.py: error: {fsdp_compat.fsdp2_missing()}"]), \
        proc.stderr[-4000:]
    assert not out.exists()


def test_fsdp2_set_up_by_version(monkeypatch, tmp_path):
    """:func:`fsdp_compat.set_up_fsdp`, on any installed versions: FSDP2 is refused on torch 2.5 and on accelerate 1.5
    with the one line (FSDP1 and no FSDP pass), and accelerate 1.6 to 1.15 (not 1.16) gets the buffer-aware rank-0
    loading."""
    import accelerate
    from packaging.version import Version

    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # the arguments set it: restored after the test
    fsdp2 = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp=True,
                              fsdp_config=FSDP_CONFIGS["gpt2-472m"])
    installed = Version(accelerate.__version__).release[:2]
    if installed >= fsdp_compat.FSDP2_ACCELERATE:  # the patch, on an accelerate with FSDP2 (on torch 2.5 too)
        from accelerate.utils import fsdp_utils

        shipped = fsdp_utils.fsdp2_load_full_state_dict
        monkeypatch.setattr(fsdp_utils, "fsdp2_load_full_state_dict", shipped)  # restored after the test
        monkeypatch.setattr(torch, "__version__", "2.6.0")
        fsdp_compat.set_up_fsdp(fsdp2, {})
        patched = fsdp_utils.fsdp2_load_full_state_dict is fsdp_compat.load_full_state_dict
        assert patched == (installed < (1, 16))
        assert patched or fsdp_utils.fsdp2_load_full_state_dict is shipped

    monkeypatch.setattr(accelerate, "__version__", "1.16.0")  # the refusals alone: nothing to patch on 1.16
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    with pytest.raises(UsageError) as refused:
        fsdp_compat.set_up_fsdp(fsdp2, {})
    assert f"run_clm.py: error: {refused.value}" == REFUSAL.format("2.5.1+cu124")
    with pytest.raises(UsageError):  # accelerate launch with an FSDP2 config
        fsdp_compat.set_up_fsdp(object(), {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})
    fsdp_compat.set_up_fsdp(object(), {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"})
    fsdp_compat.set_up_fsdp(object(), {})
    monkeypatch.setattr(torch, "__version__", "2.6.0a0+git1234")  # a pre-release build of 2.6 has FSDP2
    fsdp_compat.set_up_fsdp(fsdp2, {})
    monkeypatch.setattr(accelerate, "__version__", "1.5.2")  # an accelerate without FSDP2
    with pytest.raises(UsageError) as refused:
        fsdp_compat.set_up_fsdp(fsdp2, {})
    assert f"run_clm.py: error: {refused.value}" == REFUSAL_ACCELERATE.format("1.5.2")


def test_launch_line_names_fsdp(monkeypatch):
    from types import SimpleNamespace

    import hf_condinit.scripts.machine as machine

    monkeypatch.setattr(machine, "accelerator_name", lambda: "cuda")  # a GPU machine: FSDP applies

    env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}
    gpu = SimpleNamespace(use_cpu=False, deepspeed=None, fsdp_plugin_args={"fsdp_version": 2, "reshard_after_forward": True})
    assert launch_summary(gpu, env).endswith(", FSDP2 full_shard")
    offload = SimpleNamespace(use_cpu=False, deepspeed=None, fsdp_plugin_args={
        "fsdp_version": 1, "reshard_after_forward": "hybrid_shard", "cpu_offload": True})
    assert launch_summary(offload, env).endswith(", FSDP1 hybrid_shard + cpu offload")
    assert fsdp_summary(SimpleNamespace(fsdp_plugin_args=None), {}) is None
    cpu = SimpleNamespace(use_cpu=True, deepspeed=None, fsdp_plugin_args={"fsdp_version": 2, "reshard_after_forward": False})
    assert launch_summary(cpu, env) == "launched by torchrun: world size 2, device cpu, FSDP2 shard_grad_op (runs as DDP on cpu)"
