"""One LM run of the harness (``compare.py``'s LM, depth and width modes; ``cloze_check.py``): its spec
(:class:`TrainSpec`), the ``Trainer`` it runs (:func:`train_run`), the record read back from the Trainer's folder
(:func:`summarize_trainer_run`), and a plan's runs executed under claims (:func:`execute_runs`).

A run is what a user gets from ``run_clm.py`` (``_common``'s docstring says how it is built and trained), and it
resumes as ``run_clm.py`` does, through the library: SIGTERM / SIGINT / SIGUSR1 make the library's
``PreemptionCallback`` save a checkpoint and stop (``execute_runs`` then exits 75), a kill without warning (SIGKILL,
the OOM killer) costs at most :data:`CHECKPOINT_EVERY_SECONDS` of training (the library's
``PeriodicCheckpointCallback``, the newest checkpoint kept), and the next worker that takes the same spec resumes
from the folder's newest complete checkpoint (``hf_condinit.scripts.checkpoints.newest_complete_checkpoint``). A
run's Trainer folder (:func:`trainer_folder`) carries the spec's key in its name, so a checkpoint found there is
always of that spec. The record's ``cpu_seconds`` / ``wall_seconds`` add the finishing segment to the training
seconds of the earlier ones that the checkpoint carries (``hf_condinit.callbacks.RunTotalsCallback``: work lost to a
kill is not counted); ``resumed_at`` is the step the finishing segment resumed at. On resume, the κ measurements past
the checkpoint's step (and a line a kill cut short) are dropped from ``condition_number.jsonl`` by the library's
``ConditionNumberCallback``: the resumed run measures them again. A resumed run trains on the same batches as an
uninterrupted one and records the same ``train_batches_sha256``: the batches the Trainer skips are hashed from its own
dataloader (:func:`_hash_skipped_batches`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

import _common as C
import _lm_zero_shot as ZS
from hf_condinit.checkpoints import newest_complete_checkpoint
from hf_condinit.study.files import write_json
from hf_condinit.versions import RESUME_MIN_TORCH, torch_below

#: Wall seconds between the periodic checkpoints of a harness run (compare.py --checkpoint-minutes; 0: none, only the
#: signal's). A save of the harness's models takes well under a second: < 0.2 % of the run at this interval.
CHECKPOINT_EVERY_SECONDS = 600.0
GAIN_KEYS = ("qk_gain", "v_gain")  # the TrainSpec fields that change the conditioned init only
SWEEP_KEYS = ("qk_gain", "v_gain", "lr", "n_layer", "n_embd", "n_head", "steps", "batch_size", "block_size",
              "warmup", "weight_decay")  # the TrainSpec fields a compare.py --sweep setting may override


@dataclass
class TrainSpec:
    arm: str
    seed: int
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    block_size: int = 256
    batch_size: int = 16
    steps: int = 300
    lr: float = 1e-3
    warmup: float = 0.05
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 25
    eval_blocks: int = 64  # blocks of the held-out split used for the curve; the final eval uses all of them
    log_every: int = 5
    kappa_at: tuple = (0.0, 0.25, 0.5, 1.0)  # fractions of the run (empty: no κ)
    kappa_probe: tuple = (2, 16)  # (sequences, tokens)
    diag_probe: tuple = (4, 128)
    qk_gain: Optional[float] = None
    v_gain: Optional[float] = None
    tokens_per_param: Optional[float] = None  # how steps was chosen (informational; steps is what runs)
    setting: str = "base"
    extra: dict = field(default_factory=dict)

    def key(self) -> str:
        return C.stable_hash(asdict(self))


def trainer_folder(root: str, spec: TrainSpec) -> str:
    """The Trainer output folder of ``spec`` under ``root``: ``<setting>/<label>/seed<k>-<key>`` (label: the
    sweep's arm label, else the arm with ``+`` as ``_plus_``). The key makes a changed spec train in a new folder, so
    a checkpoint is only ever resumed by the spec that saved it (the old folder is left as it was)."""
    label = spec.extra.get("label", spec.arm).replace("+", "_plus_")
    return os.path.join(root, spec.setting, label, f"seed{spec.seed}-{spec.key()}")


def _training_arguments(spec: TrainSpec, run_dir: str, resumed: bool = False):
    """``TrainingArguments`` = ``run_clm.py``'s LM defaults (``LM_TRAINING_DEFAULTS``) with the spec's values; a
    ``resumed`` run skips the evaluation on start (the checkpoint's log history has it). Checkpoints are saved by
    the signal's callback and the periodic one, the newest one kept."""
    from transformers import TrainingArguments

    from hf_condinit.scripts_common import LM_TRAINING_DEFAULTS

    kw = dict(LM_TRAINING_DEFAULTS)
    kw.update(
        output_dir=run_dir, max_steps=spec.steps, per_device_train_batch_size=spec.batch_size,
        per_device_eval_batch_size=spec.batch_size, learning_rate=spec.lr, warmup_steps=spec.warmup,
        weight_decay=spec.weight_decay, adam_beta1=spec.betas[0], adam_beta2=spec.betas[1], adam_epsilon=1e-8,
        max_grad_norm=spec.grad_clip, logging_steps=spec.log_every, eval_strategy="steps",
        eval_steps=spec.eval_every, eval_on_start=not resumed, save_strategy="no", save_total_limit=1,
        report_to=[], seed=spec.seed,
        data_seed=spec.seed, use_cpu=C.TRAIN_DEVICE == "cpu", disable_tqdm=True, dataloader_num_workers=0,
        logging_nan_inf_filter=False,
    )
    return TrainingArguments(**kw)


def evaluate_files(trainer, eval_sets: dict, metrics: dict) -> dict:
    """Evaluate ``trainer.model`` on each packed dataset of ``eval_sets`` (name -> dataset): returns name ->
    ``{loss, ppl, blocks}``; adds ``eval_file/<name>/loss`` and ``/perplexity`` to ``metrics`` and saves them as
    ``eval_results.json``."""
    out = {}
    for name, ds in eval_sets.items():
        loss = trainer.evaluate(ds, metric_key_prefix="eval_file")["eval_file_loss"]
        out[name] = dict(loss=loss, ppl=math.exp(loss) if loss < 700 else float("inf"), blocks=len(ds))
        metrics[f"eval_file/{name}/loss"] = loss
        metrics[f"eval_file/{name}/perplexity"] = out[name]["ppl"]
    if out:
        trainer.save_metrics("eval", metrics)
    return out


def kappa_callback(val_dataset, probe: tuple, steps: set[int]):
    """``hf_condinit.callbacks.ConditionNumberCallback`` on the held-out split (``probe`` = (sequences, tokens),
    distinct first tokens), causal and unmasked κ, at the given optimizer ``steps`` (0 = before training). The
    diagnostic measures the weights the forward uses (W + C under spectral conditioning)."""
    from hf_condinit.callbacks import ConditionNumberCallback

    class _AtSteps(ConditionNumberCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in steps:
                self._measure(args, state, model)

    return _AtSteps(dataset=val_dataset, probe_size=probe[0], probe_length=probe[1], every_n_steps=0,
                    at_train_begin=0 in steps, include_unmasked=True)


def _kappa_entry(rec: dict) -> dict:
    """One line of ``condition_number.jsonl`` -> the harness's κ summary (means over layers; per-layer lists)."""
    layers = []
    for d in rec["layers"]:
        layer = {k: d.get(k) for k in ("layer", "mean", "max", "bound", "kappa_px", "kappa_p", "n_saturated",
                                       "unmasked_mean", "unmasked_max")}
        heads = d.get("unmasked_heads") or []
        layer["unmasked_bound"] = sum(h["bound"] for h in heads) / len(heads) if heads else None
        layer["n_heads"] = len(d["heads"])
        layers.append(layer)
    um = [la["unmasked_mean"] for la in layers if la.get("unmasked_mean") is not None]
    ub = [la["unmasked_bound"] for la in layers if la.get("unmasked_bound") is not None]
    return dict(step=rec["step"], mean=rec["log"]["kappa/mean"], max=rec["log"]["kappa/max"],
                unmasked_mean=sum(um) / len(um) if um else None,
                bound_mean=sum(la["bound"] for la in layers) / len(layers),
                unmasked_bound_mean=sum(ub) / len(ub) if ub else None,
                n_saturated=sum(la["n_saturated"] for la in layers), n_heads=sum(la["n_heads"] for la in layers),
                seconds=rec["seconds"], layers=layers)


def summarize_trainer_run(run_dir: str) -> dict:
    """The numbers the harness aggregates from one Trainer output folder, read with ``hf_condinit.compare.load_run``
    (what ``python -m hf_condinit.compare`` reads): ``condinit``, the eval-loss curve logged during training
    (``[step, loss]``), the training-loss curve (``[step, loss, lr, grad_norm]``), the final metrics, the training
    time without evaluations and κ (``train_runtime``, or for a resumed run ``train_wall_seconds`` over every segment,
    minus the ``eval_runtime`` logged during training minus the κ ``seconds``), and κ(J) per measurement with the
    details the run summary does not carry (unmasked κ, κ(P), κ(PX), saturated heads, seconds per measurement) from
    ``condition_number.jsonl``."""
    from hf_condinit.compare import load_run

    run = load_run(run_dir)
    hist = run.log_history
    kappa = []
    kpath = os.path.join(run_dir, "condition_number.jsonl")
    if os.path.exists(kpath):
        with open(kpath) as f:
            kappa = [_kappa_entry(json.loads(line)) for line in f if line.strip()]
    train_curve = [[e["step"], e["loss"], e.get("learning_rate"), e.get("grad_norm")] for e in hist if "loss" in e]
    resumed = (run.final_metrics.get("train_segments") or 1) > 1
    runtime = run.final_metrics.get("train_wall_seconds" if resumed else "train_runtime")
    eval_seconds = sum(e["eval_runtime"] for e in hist if "eval_runtime" in e)
    kappa_seconds = sum(k["seconds"] for k in kappa)
    out = dict(condinit=run.condinit, recipe=run.recipe,
               eval_curve=[[e["step"], e["eval_loss"]] for e in hist if "eval_loss" in e],
               train_curve=train_curve, final_eval=run.final_metrics, steps=run.global_step, kappa=kappa,
               eval_seconds=eval_seconds, kappa_seconds=kappa_seconds,
               train_seconds=None if runtime is None else runtime - eval_seconds - kappa_seconds)
    diverged = next((s for s, loss, *_ in train_curve if not math.isfinite(loss)), None)
    if diverged is not None:
        out["diverged_at"] = diverged
    return out


def train_run(spec: TrainSpec, data: C.LMData, run_dir: str, eval_sets: Optional[dict] = None,
              blimp_dir: Optional[str] = None) -> dict:
    """Train one arm for one seed into the Trainer output folder ``run_dir`` (:func:`trainer_folder`): resumed from
    its newest complete checkpoint when the folder holds an unfinished run (no ``train_results.json``), else
    replaced. Then evaluate on the whole held-out split, on each of ``eval_sets`` (name -> packed dataset) and, given
    ``blimp_dir``, on BLiMP (:func:`_lm_zero_shot.evaluate_blimp`, record key ``blimp``). Returns the run record:
    :func:`summarize_trainer_run` of the folder plus parameter counts, tokens seen, per-file eval, step-0
    diagnostics, the digest of the training batches, ``cpu_seconds`` (user + system CPU time of this process) and
    ``wall_seconds`` (module docstring), and ``resumed_at`` when it resumed. A signal during training raises
    ``TrainingPreempted`` after its checkpoint. What the Trainer prints goes to ``run_dir/log.txt``."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    load_start = os.getloadavg()[0]
    finished = os.path.exists(os.path.join(run_dir, "train_results.json"))
    resume = newest_complete_checkpoint(run_dir) if os.path.isdir(run_dir) and not finished else None
    if resume is not None and torch_below(RESUME_MIN_TORCH):
        print(f"[compare] {run_dir}: resuming needs torch>={RESUME_MIN_TORCH} (transformers refuses to load the "
              f"optimizer state below it, found {torch.__version__}); starting over", file=sys.stderr)
        resume = None
    if resume is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
    else:
        print(f"[compare] {run_dir}: resuming from {os.path.basename(resume)}", file=sys.stderr)
    with open(os.path.join(run_dir, "log.txt"), "a") as log, contextlib.redirect_stdout(log):
        rec, totals = _train(spec, data, run_dir, eval_sets, blimp_dir, resume)
    rec.update(cpu_seconds=totals.cpu_before + time.process_time() - cpu_start,
               wall_seconds=totals.wall_before + time.perf_counter() - t_start, loadavg_1m_at_start=load_start)
    if resume is not None:
        rec["resumed_at"] = _step_of(resume)
    return rec


def _step_of(checkpoint: str) -> int:
    """The optimizer step of a ``checkpoint-<step>`` folder."""
    return int(os.path.basename(checkpoint).rsplit("-", 1)[1])


def _hash_skipped_batches(trainer, digest, steps: int) -> None:
    """Feed ``digest`` the ``input_ids`` of the batches of the first ``steps`` optimizer steps, in the order the
    Trainer trains on them: its own dataloader, epoch after epoch with the sampler's epoch set as the Trainer sets it
    (the sampler's order depends on ``data_seed`` and the epoch only). These are the batches a resumed Trainer skips
    without a forward pass, so that the forward hook of :func:`_train` sees only the rest. One batch per step: the
    harness trains without gradient accumulation."""
    if trainer.args.gradient_accumulation_steps != 1:
        raise ValueError("the harness resumes runs without gradient accumulation only")
    loader = trainer.get_train_dataloader()
    left, epoch = steps, 0
    while left:
        loader.set_epoch(epoch)
        inner = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(epoch)
        for batch in loader:
            digest.update(batch["input_ids"].cpu().numpy().tobytes())
            left -= 1
            if not left:
                break
        epoch += 1


def _train(spec: TrainSpec, data: C.LMData, run_dir: str, eval_sets: Optional[dict], blimp_dir: Optional[str],
           resume: Optional[str]):
    """The run of :func:`train_run`: ``(record, the trainer's RunTotalsCallback)``."""
    from transformers import PrinterCallback, default_data_collator

    from hf_condinit.callbacks import NonFiniteLossError, PeriodicCheckpointCallback, RunReportCallback
    from hf_condinit.scripts_common import CondInitTrainer, evaluate_with_perplexity, train_and_save

    tok = data.tokenizer
    config = C.gpt2_config(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, n_positions=spec.block_size,
                           vocab_size=len(tok), eos_id=tok.eos_token_id)
    overrides = {k: v for k, v in (("qk_gain", spec.qk_gain), ("v_gain", spec.v_gain)) if v is not None}
    t_build = time.perf_counter()
    model = C.build_model(spec.arm, config, spec.seed, condinit_overrides=overrides)
    t_build = time.perf_counter() - t_build
    step0 = C.step0_diagnostics(model, data.val[: spec.diag_probe[0]]["input_ids"][:, : spec.diag_probe[1]])

    digest = hashlib.sha256()

    def record_batch(module, args, kwargs):
        if module.training:
            digest.update(kwargs["input_ids"].cpu().numpy().tobytes())

    hook = model.register_forward_pre_hook(record_batch, with_kwargs=True)
    curve = data.val.select(range(min(spec.eval_blocks, len(data.val))))
    trainer = CondInitTrainer(model=model, args=_training_arguments(spec, run_dir, resumed=resume is not None),
                              train_dataset=data.train, eval_dataset=curve, data_collator=default_data_collator)
    if resume is not None:
        _hash_skipped_batches(trainer, digest, _step_of(resume))
    trainer.remove_callback(PrinterCallback)
    if CHECKPOINT_EVERY_SECONDS > 0:
        trainer.add_callback(PeriodicCheckpointCallback(CHECKPOINT_EVERY_SECONDS))
    RunReportCallback.attach(trainer, figures=False)  # the model card; the harness draws seed-aggregated figures
    if spec.kappa_at:
        steps = {min(spec.steps, int(round(f * spec.steps))) for f in spec.kappa_at}
        trainer.add_callback(kappa_callback(data.val, spec.kappa_probe, steps).bind(trainer))
    t_train = time.perf_counter()
    diverged = None
    try:
        train_metrics = train_and_save(trainer, data.train, resume, spec.block_size)
    except NonFiniteLossError as err:
        # a diverged run is a result (loss NaN: never a best learning rate), not a crash of the sweep: keep what the
        # Trainer logged up to the stop, skip the evaluations
        diverged = str(err)
        trainer.save_model()
        trainer.save_state()
        train_metrics = {"train_runtime": time.perf_counter() - t_train}
        trainer.save_metrics("train", train_metrics)
    hook.remove()
    blimp = cloze = None
    if diverged is None:
        # final held-out evaluation: the whole split, or its first ``extra["final_eval_blocks"]`` blocks
        n_final = spec.extra.get("final_eval_blocks")
        trainer.eval_dataset = data.val if n_final is None else data.val.select(range(min(n_final, len(data.val))))
        final = evaluate_with_perplexity(trainer, trainer.eval_dataset)
        trainer.remove_callback(RunReportCallback)  # the card has the final metrics; no rewrite per --eval-file
        eval_files = evaluate_files(trainer, eval_sets or {}, final)
        if blimp_dir:  # the zero-shot evaluations: BLiMP and the held-out cloze (same switch)
            blimp = ZS.evaluate_blimp(model, data.tokenizer, blimp_dir)
            cloze = ZS.evaluate_cloze(model, data)
            final.update(blimp_accuracy=blimp["blimp_accuracy"], cloze_accuracy=cloze["cloze_accuracy"])
            trainer.save_metrics("eval", final)
    else:
        final = dict(eval_loss=math.nan, perplexity=math.inf)
        eval_files = {n: dict(loss=math.nan, ppl=math.inf, blocks=len(ds)) for n, ds in (eval_sets or {}).items()}

    rec: dict[str, Any] = summarize_trainer_run(run_dir)
    tokens_seen = trainer.state.global_step * spec.batch_size * spec.block_size
    train_tokens = data.info["train_blocks"] * spec.block_size
    rec.update(spec=asdict(spec), key=spec.key(), arm=spec.arm, seed=spec.seed, setting=spec.setting,
               **C.param_counts(model), data=data.info, step0=step0, build_seconds=t_build, run_dir=run_dir,
               train_batches_sha256=digest.hexdigest(), eval_files=eval_files, blimp=blimp, cloze=cloze,
               initial_eval_loss=rec["eval_curve"][0][1], final_eval_loss=final["eval_loss"],
               final_eval_ppl=final["perplexity"], tokens_seen=tokens_seen, epochs=tokens_seen / train_tokens,
               train_runtime=train_metrics["train_runtime"], torch_threads=torch.get_num_threads(),
               device=C.device_name(model))
    rec["tokens_per_s"] = tokens_seen / max(rec["train_seconds"] or 0.0, 1e-9)
    if diverged is not None:
        rec.setdefault("diverged_at", trainer.state.global_step)
        rec["diverged"] = diverged
    if hasattr(model.transformer.h[0].attn, "condinit_affine"):
        rec["alpha_ma"] = [[float(a) for a in blk.attn.condinit_affine.alpha_ma] for blk in model.transformer.h]
    return rec, trainer.run_totals


def evaluate_saved_run(run_dir: str, spec: dict, eval_sets: dict) -> dict:
    """:func:`evaluate_files` for the model saved in a finished run's folder (``eval_results.json`` updated)."""
    import hf_condinit  # noqa: F401  (variants)
    from transformers import AutoModelForCausalLM, TrainingArguments, default_data_collator

    from hf_condinit.scripts_common import CondInitTrainer, with_causal_loss_type

    model = with_causal_loss_type(AutoModelForCausalLM.from_pretrained(run_dir))
    args = TrainingArguments(output_dir=run_dir, per_device_eval_batch_size=spec["batch_size"],
                             use_cpu=C.TRAIN_DEVICE == "cpu",
                             report_to=[], disable_tqdm=True)
    trainer = CondInitTrainer(model=model, args=args, data_collator=default_data_collator)
    with open(os.path.join(run_dir, "eval_results.json")) as f:
        metrics = json.load(f)
    return evaluate_files(trainer, eval_sets, metrics)


def execute_runs(runs: list, todo: list, data: "C.LMData", eval_sets: dict, eval_info: dict, paths,
                 blimp_dir: Optional[str] = None) -> list[str]:
    """Train every spec of ``todo`` (a sub-list of ``runs``, in order) that no one has finished or claimed:
    ``paths(spec) -> (record path, Trainer folder)``; the record (:func:`train_run` (with BLiMP given
    ``blimp_dir``) plus provenance, ``eval_file_info`` and ``finished_at``) is written last. Returns the record paths
    skipped because another worker holds their lock. A signal during a run saves its checkpoint (the next worker to
    take the run resumes it) and ends the process with one line and exit status 75."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="runs", unit="run", dynamic_ncols=True)
    skipped_locked = []
    for spec in todo:
        path, run_dir = paths(spec)
        with C.run_slot(path, spec) as slot:
            if slot == "locked":
                skipped_locked.append(path)
                continue
            if slot == "claimed":
                if os.path.exists(path):
                    print(f"[compare] {path} was made with other settings; redoing it", file=sys.stderr)
                bar.set_postfix_str(f"{spec.setting}/{spec.extra.get('label', spec.arm)}/seed{spec.seed}")
                with C.exit_75_when_preempted("compare"):
                    rec = train_run(spec, data, run_dir, eval_sets, blimp_dir)
                rec.update(C.provenance())
                rec["eval_file_info"] = eval_info
                rec["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                rec["loadavg_1m_at_end"] = os.getloadavg()[0]
                write_json(path, rec)
        bar.update(1)
    bar.close()
    return skipped_locked

