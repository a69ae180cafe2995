"""The scripts' ``Trainer`` (:class:`CondInitTrainer`) and the callbacks the flags add."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil

from transformers import Trainer as _Trainer

from .. import checkpoints
from ..attention import no_decay_parameter_names
from . import checkpoint_weights
from .arguments import CondInitArguments


class CondInitTrainer(_Trainer):
    """``Trainer`` whose weight-decay groups exclude ``condinit_`` holders, biases and norms
    (:func:`no_decay_parameter_names`), which stops a run whose loss becomes non-finite
    (:class:`hf_condinit.callbacks.NonFiniteLossCallback`) and which does not warn about tied weights
    (``lm_head.weight``) that a checkpoint leaves out by design. For long runs on a cluster:

    - checkpoints are atomic (:meth:`_save_checkpoint`, :mod:`hf_condinit.checkpoints`): staged, fsynced, manifest
      last, renamed into place; ``--save_total_limit`` deletes old ones only after the new one is complete; a save
      that finds no room says so (:class:`checkpoints.CheckpointSaveError`) and leaves the previous
      checkpoint intact;
    - SIGTERM / SIGINT / SIGUSR1 save a checkpoint at the end of the step and stop
      (:class:`hf_condinit.callbacks.PreemptionCallback`, ``self.preemption``): :meth:`train` then raises
      :class:`hf_condinit.callbacks.TrainingPreempted` rather than returning, so that no caller takes the partly
      trained model for a finished one;
    - a run resumed from a checkpoint at its last step trains nothing and finishes from it (:meth:`_run_epoch`);
    - a checkpoint whose weights transformers saved in the model's original format (ViT, GPT-NeoX, Gemma 3, MoE
      experts, ...) is resumed through transformers' own conversion, and one that leaves a weight of the model unset
      is refused (:meth:`_load_from_checkpoint`, :mod:`.checkpoint_weights`): the stock Trainer warns and trains on
      from the freshly built weights;
    - the run's loss, wall time and segment count span resumes (:class:`hf_condinit.callbacks.RunTotalsCallback`,
      ``self.run_totals``);
    - a training stream that is already this rank's own share (``--streaming`` under several processes:
      :func:`hf_condinit.data.streaming.split_by_rank`) is loaded as it is (:meth:`get_train_dataloader`).

    Every callback above is added to every instance. Otherwise the stock Trainer."""

    def __init__(self, *args, callbacks=None, **kwargs):
        from ..callbacks import NonFiniteLossCallback, PreemptionCallback, RunTotalsCallback

        self.preemption, self.run_totals = PreemptionCallback(), RunTotalsCallback()
        self.non_finite = NonFiniteLossCallback()
        self._staging_root = self._loading_from = None
        extra = [self.non_finite, self.preemption, self.run_totals]
        super().__init__(*args, callbacks=[*(callbacks or []), *extra], **kwargs)

    def train(self, *args, **kwargs):
        """The stock ``train``. When a signal stopped it before its last step, raise
        :class:`hf_condinit.callbacks.TrainingPreempted` (naming the checkpoint it saved) instead of returning as
        the stock Trainer does: code after ``train()`` would otherwise save and evaluate the partly trained model as
        the run's result. However it ends, the signal handlers of ``self.preemption`` end with it."""
        from ..callbacks import TrainingPreempted

        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        self.non_finite.resumed_from = resume if isinstance(resume, str) else None
        try:
            result = super().train(*args, **kwargs)
        finally:  # an exception skips on_train_end: the signal handlers must not outlive train() all the same
            self.preemption.restore_handlers()
        if self.preemption.stopped_early(self.state):
            saved = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            raise TrainingPreempted(self.preemption.received, saved, self.state.global_step, self.state.max_steps)
        return result

    def _run_epoch(self, *args, **kwargs):
        """The stock epoch, unless the run is already at its end: resumed from a checkpoint at (or past) its last step
        (``--max_steps``, or the last epoch's), the stock loop would skip the trained batches and train one step
        past the end before its stop check. Here training stops with nothing trained, and ``train()`` returns the
        checkpoint's model and state, so the script finishes the run from it (final model, evaluation, results)."""
        if self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def save_metrics(self, split, metrics, combined=True) -> None:
        """The stock ``save_metrics`` (``<split>_results.json``, merged into ``all_results.json``), each file written
        whole (:func:`checkpoints.write_atomically`): a kill leaves the old file or the new one. An unreadable
        ``all_results.json`` (a kill during a write of the stock Trainer) is replaced."""
        if not self.is_world_process_zero():
            return
        out = self.args.output_dir
        checkpoints.write_atomically(os.path.join(out, f"{split}_results.json"),
                                     json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            path = os.path.join(out, "all_results.json")
            try:
                with open(path, encoding="utf-8") as f:
                    merged = json.load(f)
            except (OSError, ValueError):
                merged = {}
            merged.update(metrics)
            checkpoints.write_atomically(path, json.dumps(merged, indent=4, sort_keys=True))

    def save_state(self) -> None:
        """The stock ``save_state`` (``trainer_state.json``), written whole (:func:`checkpoints.write_atomically`)."""
        if not self.is_world_process_zero():
            return
        checkpoints.write_atomically(os.path.join(self.args.output_dir, "trainer_state.json"),
                                     json.dumps(dataclasses.asdict(self.state), indent=2, sort_keys=True) + "\n")

    def get_train_dataloader(self):
        """The stock loader; for a stream marked as this rank's share (:func:`hf_condinit.data.streaming.rows_of_rank`)
        under several processes, prepared for this process alone: accelerate would otherwise dispatch rank 0's
        stream to every rank, or shard the rank's share once more."""
        from ..data.streaming import rows_of_rank

        if rows_of_rank(self.train_dataset) is None or self.accelerator.num_processes == 1:
            return super().get_train_dataloader()
        with _prepared_for_this_process(self.accelerator):
            return super().get_train_dataloader()

    def get_decay_parameter_names(self, model) -> list[str]:
        skip = set(no_decay_parameter_names(model, vectors=True))
        return [n for n, _ in model.named_parameters() if n not in skip]

    def _loads_safetensors_itself(self, model, folder: str) -> bool:
        """Whether the stock load of ``folder`` (plain, not DeepSpeed / FSDP / PEFT) would miss weights saved in the
        original format of a model that transformers converts on loading (:mod:`.checkpoint_weights`)."""
        plain = not (self.is_deepspeed_enabled or self.is_fsdp_enabled) and getattr(model, "peft_config", None) is None
        return plain and checkpoint_weights.saved_under_other_names(model, folder)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
        """The stock load, except for weights saved under other names than the model's (a model whose weights
        transformers converts: ViT, GPT-NeoX, Gemma 3, MoE experts, ...), loaded through that conversion
        (:func:`.checkpoint_weights.weights_in_model_names`); a load that leaves a weight unset is refused
        (:meth:`_issue_warnings_after_load`)."""
        target = self.model if model is None else model
        self._loading_from = resume_from_checkpoint
        try:
            if not self._loads_safetensors_itself(target, resume_from_checkpoint):
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            state = checkpoint_weights.weights_in_model_names(target, resume_from_checkpoint)
            self._issue_warnings_after_load(target.load_state_dict(state, strict=False))
        finally:
            self._loading_from = None

    def _load_best_model(self) -> None:
        """The stock ``load_best_model_at_end``, through :meth:`_load_from_checkpoint` for weights saved under other
        names than the model's."""
        best = self.state.best_model_checkpoint
        if self._loads_safetensors_itself(self.model, best):
            return self._load_from_checkpoint(best)
        self._loading_from = best
        try:
            return super()._load_best_model()
        finally:
            self._loading_from = None

    def _issue_warnings_after_load(self, load_result) -> None:
        """Tied weights a checkpoint leaves out by design are tied again; any other weight of the model that the
        checkpoint did not set stops the run (:func:`.checkpoint_weights.missing_weights_error`) where the stock
        Trainer only warns and trains on from the freshly built weights."""
        skipped = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        skipped |= set(getattr(self.model, "_keys_to_ignore_on_save", None) or ())
        missing = [k for k in load_result.missing_keys if k not in skipped]
        if missing:
            raise checkpoint_weights.missing_weights_error(self._loading_from or "the checkpoint", missing)
        if load_result.missing_keys:
            self.model.tie_weights()
            load_result = load_result._replace(missing_keys=[])
        super()._issue_warnings_after_load(load_result)

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.run_totals.add_loss(loss)
        return loss

    def _get_output_dir(self, trial):
        # while a checkpoint is being saved, the Trainer writes it under the staging folder (see _save_checkpoint)
        return self._staging_root or super()._get_output_dir(trial=trial)

    def _save_checkpoint(self, model, trial) -> None:
        """The stock save, made atomic: every rank writes into ``<run>/.checkpoint-staging/checkpoint-<step>``; once
        all have (barrier), the saving process fsyncs the files, writes the manifest last and renames the folder to
        ``<run>/checkpoint-<step>`` (:func:`checkpoints.publish`), then applies ``--save_total_limit`` over the
        complete checkpoints. Before writing, a save that would not fit next to the last checkpoint (its size) stops
        the run with :class:`checkpoints.CheckpointSaveError`; so does a save that fails for lack of space."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from ..callbacks.run_totals import STATE_KEY

        run_dir = super()._get_output_dir(trial=trial)
        step = self.state.global_step
        name = f"{PREFIX_CHECKPOINT_DIR}-{step}"
        root = os.path.join(run_dir, checkpoints.STAGING_DIR)
        staged, final = os.path.join(root, name), os.path.join(run_dir, name)
        previous = next((p for p in checkpoints.checkpoints_newest_first(run_dir)
                         if checkpoints.check_checkpoint(p) is None), None)
        needed = checkpoints.checkpoint_size(previous) if previous else None
        if self.args.should_save:
            shutil.rmtree(root, ignore_errors=True)  # a killed save's leftovers: never a visible checkpoint
            os.makedirs(root, exist_ok=True)
        if needed and shutil.disk_usage(run_dir).free < needed:
            raise checkpoints.disk_full_error(run_dir, step, needed, previous)
        self.state.stateful_callbacks[STATE_KEY] = self.run_totals.snapshot()
        self.accelerator.wait_for_everyone()
        self._staging_root = root
        try:
            super()._save_checkpoint(model, trial)
        except Exception as err:
            if not checkpoints.is_disk_full(err, run_dir, needed):
                raise
            if self.args.should_save:
                shutil.rmtree(root, ignore_errors=True)
            raise checkpoints.disk_full_error(run_dir, step, needed, previous) from err
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            if self.state.best_model_checkpoint == staged:  # the Trainer recorded the staging path: point at the final
                self.state.best_model_checkpoint = final
                self.state.save_to_json(os.path.join(staged, "trainer_state.json"))
            checkpoints.write_manifest(staged, step)
            checkpoints.publish(staged, final)
            shutil.rmtree(root, ignore_errors=True)
            checkpoints.rotate(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()


@contextlib.contextmanager
def _prepared_for_this_process(accelerator):
    """Within the block, ``accelerator.prepare`` makes a data loader for this process alone (one process, no dispatch:
    accelerate's ``DataLoaderShard`` with the device placement and RNG types it would use), registered with the
    accelerator as usual."""
    from accelerate.data_loader import prepare_data_loader

    def prepare(data_loader, device_placement=None, slice_fn_for_dispatch=None):
        prepared = prepare_data_loader(
            data_loader, accelerator.device, num_processes=1, process_index=0, dispatch_batches=False,
            put_on_device=accelerator.device_placement if device_placement is None else device_placement,
            rng_types=accelerator.rng_types.copy(), non_blocking=accelerator.non_blocking,
        )
        accelerator._dataloaders.append(prepared)
        return prepared

    accelerator.prepare_data_loader = prepare  # the instance attribute shadows the method until the block ends
    try:
        yield
    finally:
        del accelerator.prepare_data_loader


def make_condition_number_callback(cond_args: CondInitArguments, dataset, trainer=None, probe_inputs=None):
    """``hf_condinit.callbacks.ConditionNumberCallback`` for ``--log_condition_number_every N`` (``None`` when 0).

    The probe (``--condition_number_probe_size`` sequences × ``--condition_number_probe_length`` tokens) is built by
    the callback from the first examples of ``dataset`` (real tokens, distinct first tokens), unless ``probe_inputs``
    gives it (e.g. a (B, C, H, W) image batch for a vision model; ``dataset`` is then unused); κ goes through
    ``trainer.log`` (keys ``kappa/...``) and to ``<output_dir>/condition_number.jsonl``.
    """
    if not cond_args.log_condition_number_every:
        return None
    from hf_condinit.callbacks import ConditionNumberCallback

    callback = ConditionNumberCallback(
        probe_inputs,
        dataset=None if probe_inputs is not None else dataset,
        probe_size=cond_args.condition_number_probe_size,
        probe_length=cond_args.condition_number_probe_length,
        every_n_steps=cond_args.log_condition_number_every,
    )
    if trainer is not None:
        trainer.add_callback(callback)
        callback.bind(trainer)
    return callback


def make_throughput_callback(cond_args: CondInitArguments, trainer):
    """``hf_condinit.callbacks.ThroughputCallback`` for ``--log_throughput`` (``None`` when off), added to ``trainer``
    first so that the ``report_to`` integrations see its keys."""
    if not cond_args.log_throughput:
        return None
    from hf_condinit.callbacks import add_throughput_callback

    return add_throughput_callback(trainer)


def make_periodic_checkpoint_callback(cond_args: CondInitArguments, trainer):
    """``hf_condinit.callbacks.PeriodicCheckpointCallback`` for ``--save_minutes`` (``None`` when 0), added to
    ``trainer``."""
    if not cond_args.save_minutes:
        return None
    from hf_condinit.callbacks import PeriodicCheckpointCallback

    callback = PeriodicCheckpointCallback(cond_args.save_minutes * 60)
    trainer.add_callback(callback)
    return callback
