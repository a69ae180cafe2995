"""Trainer callback logging the attention-Jacobian condition number during training (docs/methods.md §6, DESIGN §7.3.6).

The callback only schedules and logs; the math is :func:`hf_condinit.diagnostics.attention_jacobian_condition_number`.

Logging. In transformers 5.24 ``Trainer`` orders its callbacks ``DefaultFlowCallback``, then the ``report_to``
integrations, then the user's callbacks, and ``Trainer.log`` appends ``{**logs, "step": ...}`` to
``state.log_history`` *before* calling ``on_log``. Neither ``control.should_log = True`` (the trainer then logs its own
loss dict, not ours) nor mutating ``logs`` inside ``on_log`` (the reporters and ``log_history`` have already seen it)
delivers our values. What works is calling ``trainer.log(metrics)`` from the callback, which needs the trainer::

    callback = ConditionNumberCallback(dataset=train_dataset)   # probe 2 × 16 tokens, every 500 steps
    trainer = Trainer(..., callbacks=[callback])
    callback.bind(trainer)            # or ConditionNumberCallback(..., trainer=trainer) after the trainer exists

``trainer.log`` adds ``epoch`` and ``step`` and reaches every ``report_to`` integration and ``state.log_history``.
An unbound callback still measures: it appends the entry to ``state.log_history`` itself and warns once that the
``report_to`` integrations do not see it. Every measurement is also appended to a JSONL file (one object per line:
``step``, ``epoch``, the flat log dict under ``"log"``, and the per-layer / per-head report under ``"layers"``).

Scheduling: step 0 at ``on_train_begin`` (skipped when resuming at a step that is not a multiple of the interval),
then ``on_step_end`` whenever ``state.global_step % every_n_steps == 0``; never twice for the same step. A resumed
run (training begins at a step > 0) first drops from the JSONL file the lines of later steps and a line cut short
(:func:`drop_records_after`): a run killed after its checkpoint measured them, and measures them again. Only the
world-process-zero computes and logs; under ZeRO-3 (parameters carrying ``ds_id``) every rank runs the probe forward
and the parameter gathering, which are collective. Under FSDP (FSDP2's sharded DTensor parameters, or FSDP1
wrappers) nothing is measured: one logged line says so at the first scheduled measurement (a forward on rank 0
alone would wait forever for the other ranks' all-gathers); measure a saved checkpoint instead
(``hf_condinit.diagnostics``).

Cost: one float64 ``eigvalsh`` of (B·N·d)² per head. On a 4-layer, 256-wide, 4-head GPT-2 (d = 64, 16 heads) on
2 CPU cores, a 2 × 32 probe (G 4096²) took 53 s per measurement, about 87 training steps of 8 × 256 tokens, and a
2 × 16 probe (G 2048²) 9.2 s, about 15 steps (``benchmarks/throughput.py --parts kappa``). Hence the defaults,
2 × 16 tokens every 500 steps, 2.9 % of training time on that model (:data:`DEFAULT_PROBE_LENGTH`,
:data:`DEFAULT_EVERY_N_STEPS`); use ``layers=`` / ``heads=`` or ``device="model"`` (the eigenproblems on the GPU)
to cut the cost further.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Optional, Sequence

import torch
from transformers import TrainerCallback

from ..diagnostics.probes import attention_jacobian_condition_number, resolve_causal
from ..parallel import unwrap_model

__all__ = ["ConditionNumberCallback", "build_probe", "drop_records_after", "DEFAULT_PROBE_SIZE",
           "DEFAULT_PROBE_LENGTH", "DEFAULT_EVERY_N_STEPS"]

DEFAULT_PROBE_SIZE = 2  # sequences in the probe batch
DEFAULT_PROBE_LENGTH = 16  # tokens per probe sequence
DEFAULT_EVERY_N_STEPS = 500  # logging interval in optimizer steps

logger = logging.getLogger(__name__)


def build_probe(dataset, probe_size: int = DEFAULT_PROBE_SIZE, probe_length: int = DEFAULT_PROBE_LENGTH, *,
                distinct_first_tokens: bool = True, pad_token_id: int = 0, scan: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed probe batch from the first examples of a dataset with an ``input_ids`` column.

    Each probe row is a window of ``probe_length`` tokens of one example (right-padded with ``pad_token_id`` and
    masked when the example is shorter). With ``distinct_first_tokens`` (for causal models), examples are scanned
    in order (at most ``scan``) and each window starts at the first offset whose token differs from the first tokens
    already chosen, so that no two rows share a prefix (rows of J would repeat; docs/methods.md §6).

    Args:
        dataset: a sequence of dicts (``datasets.Dataset`` or list) with ``input_ids`` (list or tensor).
        probe_size (`int`, *optional*, defaults to 2): number of sequences.
        probe_length (`int`, *optional*, defaults to 16): tokens per sequence.
        distinct_first_tokens (`bool`, *optional*, defaults to `True`): see above.
        pad_token_id (`int`, *optional*, defaults to 0): id used for padding (masked out anyway).
        scan (`int`, *optional*, defaults to 256): examples looked at before giving up on distinct first tokens.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``input_ids`` and ``attention_mask``, both ``(probe_size, probe_length)``.
    """
    rows, firsts = [], set()
    fallback = []
    n = len(dataset)
    for idx in range(min(n, scan)):
        ids = dataset[idx]["input_ids"]
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if not ids:
            continue
        if len(fallback) < probe_size:
            fallback.append(ids[:probe_length])
        if distinct_first_tokens:
            full = [o for o in range(len(ids) - probe_length + 1) if ids[o] not in firsts]
            offset = full[0] if full else (0 if ids[0] not in firsts else None)
            if offset is None:
                continue
            window = ids[offset:offset + probe_length]
            firsts.add(window[0])
        else:
            window = ids[:probe_length]
        rows.append(window)
        if len(rows) == probe_size:
            break
    if len(rows) < probe_size:
        if len(fallback) < probe_size:
            raise ValueError(f"the dataset has fewer than {probe_size} non-empty examples for the probe")
        logger.warning("could not find %d examples with distinct first tokens; using the first ones", probe_size)
        rows = fallback
    input_ids = torch.full((probe_size, probe_length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((probe_size, probe_length), dtype=torch.long)
    for b, w in enumerate(rows):
        input_ids[b, :len(w)] = torch.tensor(w, dtype=torch.long)
        mask[b, :len(w)] = 1
    return input_ids, mask


def drop_records_after(path: str, step: int) -> None:
    """Keep in the JSONL file ``path`` (one ``{"step": ...}`` object per line; nothing when it does not exist) the
    lines of steps up to ``step``, the step a run resumes at: every one of them was written whole before that step's
    checkpoint was saved. The lines of later steps, and a last line a kill cut short, are dropped (the file is
    replaced atomically)."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")  # the next append starts a line
            except (json.JSONDecodeError, KeyError, TypeError):
                pass
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)


class ConditionNumberCallback(TrainerCallback):
    """Measure κ of the attention Jacobian on a fixed probe at an interval and log it (module docstring).

    Args:
        probe_input_ids (`torch.Tensor`, *optional*): ``(B, N)`` probe. At most one of it and ``dataset``.
        probe_attention_mask (`torch.Tensor`, *optional*): ``(B, N)``, 1 = real token.
        dataset (*optional*): dataset with ``input_ids``; the probe is built lazily from its first examples by
            :func:`build_probe` (distinct first tokens when the model is causal). With neither argument, the bound
            trainer's ``train_dataset`` is used.
        probe_size (`int`, *optional*, defaults to 2), probe_length (`int`, *optional*, defaults to 16): probe shape
            when built from ``dataset``.
        every_n_steps (`int`, *optional*, defaults to 500): interval in optimizer steps (0: only step 0).
        layers (`Sequence[int]`, *optional*): layer ordinals (default: all).
        heads (`Sequence[int]`, *optional*): query heads (default: all).
        method (`str`, *optional*, defaults to ``"eig"``), include_unmasked (`bool`, *optional*, defaults to
            `False`), rtol (`float`, *optional*): passed to ``attention_jacobian_condition_number``.
        jsonl_path (`str`, *optional*): defaults to ``<output_dir>/condition_number.jsonl``.
        prefix (`str`, *optional*, defaults to ``"kappa"``): metric-name prefix.
        at_train_begin (`bool`, *optional*, defaults to `True`): measure at step 0.
        trainer (`transformers.Trainer`, *optional*): same as calling :meth:`bind`.
        device (`str`, *optional*): where the eigenproblems run (default CPU; ``"model"`` = the model's device, e.g.
            the GPU: much faster than 2 CPU cores).
    """

    def __init__(
        self,
        probe_input_ids: Optional[torch.Tensor] = None,
        probe_attention_mask: Optional[torch.Tensor] = None,
        *,
        dataset=None,
        probe_size: int = DEFAULT_PROBE_SIZE,
        probe_length: int = DEFAULT_PROBE_LENGTH,
        every_n_steps: int = DEFAULT_EVERY_N_STEPS,
        layers: Optional[Sequence[int]] = None,
        heads: Optional[Sequence[int]] = None,
        method: str = "eig",
        include_unmasked: bool = False,
        rtol: Optional[float] = None,
        jsonl_path: Optional[str] = None,
        prefix: str = "kappa",
        at_train_begin: bool = True,
        trainer=None,
        device=None,
    ):
        if probe_input_ids is not None and dataset is not None:
            raise ValueError("pass at most one of probe_input_ids= (a fixed (B, N) probe) or dataset= (to build one)")
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        self.probe_input_ids = probe_input_ids
        self.probe_attention_mask = probe_attention_mask
        self.dataset = dataset
        self.probe_size, self.probe_length = probe_size, probe_length
        self.every_n_steps = every_n_steps
        self.layers, self.heads = layers, heads
        self.method, self.include_unmasked, self.rtol = method, include_unmasked, rtol
        self.jsonl_path = jsonl_path
        self.device = device
        self.prefix = prefix
        self.at_train_begin = at_train_begin
        self.trainer = None
        self._last_step: Optional[int] = None
        self._warned_unbound = False
        self._skipped_fsdp = False
        self.last_report = None
        if trainer is not None:
            self.bind(trainer)

    def bind(self, trainer) -> "ConditionNumberCallback":
        """Keep a reference to ``trainer`` so that measurements go through ``trainer.log`` (reaches ``report_to``)."""
        self.trainer = trainer
        return self

    # -- probe -----------------------------------------------------------------------------------------------------

    def _probe(self, model):
        if self.probe_input_ids is None:
            from ..layouts import get_layout

            if self.dataset is None:
                self.dataset = getattr(self.trainer, "train_dataset", None)
                if self.dataset is None:
                    raise ValueError("ConditionNumberCallback has no probe: pass probe_input_ids= or dataset=, or bind "
                                     "it to a Trainer that has a train_dataset")

            blocks = get_layout(model).attention_modules(model)
            causal = bool(blocks) and resolve_causal(model, blocks[0][1], get_layout(model))
            pad = getattr(model.config, "pad_token_id", None)
            self.probe_input_ids, self.probe_attention_mask = build_probe(
                self.dataset, self.probe_size, self.probe_length, distinct_first_tokens=causal,
                pad_token_id=0 if pad is None else int(pad),
            )
        return self.probe_input_ids, self.probe_attention_mask

    # -- events ----------------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step > 0 and state.is_world_process_zero:  # a resume (module docstring)
            drop_records_after(self._path(args), state.global_step)
        if self.at_train_begin and (self.every_n_steps == 0 and state.global_step == 0
                                    or self.every_n_steps and state.global_step % self.every_n_steps == 0):
            self._measure(args, state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0:
            should_log = control.should_log
            self._measure(args, state, model)
            # trainer.log (in _measure) clears control.should_log: restore it, or the Trainer's own loss entry of
            # this step is never logged (every one of them when logging_steps divides every_n_steps).
            control.should_log = should_log

    # -- work ------------------------------------------------------------------------------------------------------

    def _measure(self, args, state, model):
        if model is None:
            if self.trainer is None:
                raise RuntimeError("ConditionNumberCallback got no model; bind it to the trainer")
            model = self.trainer.model
        if self._last_step == state.global_step:
            return
        model = unwrap_model(model)
        is_main = state.is_world_process_zero
        if _fsdp_sharded(model):
            if is_main and not self._skipped_fsdp:
                logger.warning("κ(J) is not measured under FSDP (the parameters are sharded): the callback "
                               "(--log_condition_number_every) skips; measure the saved model with "
                               "hf_condinit.diagnostics.attention_jacobian_condition_number.")
            self._skipped_fsdp = True
            return
        zero3 = any(hasattr(p, "ds_id") for p in model.parameters())
        if not is_main and not zero3:
            return
        self._last_step = state.global_step
        input_ids, attention_mask = self._probe(model)
        report = attention_jacobian_condition_number(
            model, input_ids, attention_mask, layers=self.layers, heads=self.heads, method=self.method,
            include_unmasked=self.include_unmasked, rtol=self.rtol, compute=is_main, device=self.device,
        )
        if not is_main:
            return
        self.last_report = report
        metrics = report.to_log_dict(self.prefix)
        self._write_jsonl(args, state, metrics, report)
        if self.trainer is not None:
            with _console_quiet(self.trainer):  # the full dict goes to report_to and log_history, not the terminal
                self.trainer.log(dict(metrics))
            _console_write(self.trainer, console_line(state.global_step, report))
        else:
            if not self._warned_unbound:
                logger.warning(
                    "ConditionNumberCallback is not bound to a Trainer: kappa goes to state.log_history and %s but "
                    "not to the report_to integrations. Call callback.bind(trainer).", self._path(args))
                self._warned_unbound = True
            entry = dict(metrics)
            if state.epoch is not None:
                entry["epoch"] = state.epoch
            state.log_history.append({**entry, "step": state.global_step})

    def _path(self, args) -> str:
        return self.jsonl_path or os.path.join(args.output_dir, "condition_number.jsonl")

    def _write_jsonl(self, args, state, metrics, report) -> None:
        path = self._path(args)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        record = {"step": state.global_step, "epoch": state.epoch, "log": metrics, **report.to_dict()}
        with open(path, "a") as f:
            f.write(json.dumps(record, default=_json_default, allow_nan=True) + "\n")


def _fsdp_sharded(model) -> bool:
    """Whether ``model`` is sharded by FSDP, as the Trainer leaves it under ``--fsdp``: FSDP2 parameters are
    DTensors, FSDP1 wraps submodules in ``FullyShardedDataParallel``."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return (any(isinstance(p, DTensor) for p in model.parameters())
            or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()))


def console_line(step: int, report) -> str:
    """The one line a measurement prints on the terminal: ``κ(J) at step 100: mean 163.5, max 195.9 over 2 layers``
    (``≥`` marks a lower bound; the per-layer values are in ``condition_number.jsonl`` and the ``report_to``
    integrations)."""
    metrics = report.to_log_dict()
    n_lower = sum(lc.n_lower_bound for lc in report.layers)
    mark = "≥" if n_lower else ""
    line = (f"κ(J) at step {step}: mean {mark}{metrics['kappa/mean']:.4g}, max {mark}{metrics['kappa/max']:.4g} "
            f"over {len(report.layers)} layer(s) ({metrics['kappa/seconds']:.1f} s)")
    if n_lower:
        line += f"; {n_lower} head(s) at the float64 resolution: lower bounds"
    return line


class _console_quiet:
    """Within the block, the Trainer's console printers (``ProgressCallback`` / ``PrinterCallback``) skip
    ``on_log``: a κ measurement has dozens of keys, printed as one long dict per measurement otherwise. The other
    callbacks (``report_to`` integrations) still receive them. Instance attributes shadow the method and are removed
    afterwards, so the callback list is never changed while the Trainer iterates over it."""

    def __init__(self, trainer):
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        self.printers = [cb for cb in trainer.callback_handler.callbacks
                         if isinstance(cb, (PrinterCallback, ProgressCallback))]

    def __enter__(self):
        for cb in self.printers:
            cb.on_log = lambda *args, **kwargs: None
        return self

    def __exit__(self, *exc):
        for cb in self.printers:
            cb.__dict__.pop("on_log", None)
        return False


def _console_write(trainer, line: str) -> None:
    """Print ``line`` once (world process zero) above the progress bar, or plainly without one."""
    from transformers.trainer_callback import ProgressCallback

    bar = next((cb.training_bar for cb in trainer.callback_handler.callbacks
                if isinstance(cb, ProgressCallback) and cb.training_bar is not None), None)
    if bar is not None:
        bar.write(line)
    else:
        print(line)


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    return str(o)
