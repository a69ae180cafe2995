"""The scripts' ``Trainer`` (:class:`CondInitTrainer`) and the callbacks the flags add."""

from __future__ import annotations

from .arguments import CondInitArguments


def no_decay_parameter_names(model) -> set[str]:
    """Names of the parameters kept out of weight decay: every ``condinit_`` holder parameter, and every
    parameter with fewer than 2 dimensions (biases, LayerNorm/RMSNorm weights, sink logits): nanoGPT's rule.
    Under ZeRO-3 the real shape is read from ``ds_shape`` (partitioned parameters are flat).

    Adds the names from ``hf_condinit.attention.no_decay_parameter_names`` when that helper exists."""
    names = set()
    for n, p in model.named_parameters():
        shape = getattr(p, "ds_shape", None)
        ndim = len(shape) if shape is not None else p.ndim
        if ndim < 2 or "condinit_" in n:
            names.add(n)
    try:
        from hf_condinit.attention import no_decay_parameter_names as helper
    except ImportError:
        helper = None
    if helper is not None:
        names |= set(helper(model))
    return names


try:
    from transformers import Trainer as _Trainer
except ImportError:  # pragma: no cover
    _Trainer = object


class CondInitTrainer(_Trainer):
    """``Trainer`` whose weight-decay groups exclude ``condinit_`` holders, biases and norms
    (:func:`no_decay_parameter_names`), which stops a run whose loss becomes non-finite
    (:class:`hf_condinit.callbacks.NonFiniteLossCallback`, added to every instance) and which does not warn about
    tied weights (``lm_head.weight``) that a checkpoint leaves out by design. Otherwise the stock Trainer."""

    def __init__(self, *args, callbacks=None, **kwargs):
        from ..callbacks import NonFiniteLossCallback

        super().__init__(*args, callbacks=[*(callbacks or []), NonFiniteLossCallback()], **kwargs)

    def get_decay_parameter_names(self, model) -> list[str]:
        skip = no_decay_parameter_names(model)
        return [n for n, _ in model.named_parameters() if n not in skip]

    def _issue_warnings_after_load(self, load_result) -> None:
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        if tied and set(load_result.missing_keys) <= tied:
            self.model.tie_weights()
            load_result = load_result._replace(missing_keys=[])
        super()._issue_warnings_after_load(load_result)


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
