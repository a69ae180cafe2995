"""Diagnostics: the attention-Jacobian condition number (docs/methods.md §6).

- :mod:`.jacobian`: pure tensor functions (closed-form J and G = J Jᵀ, κ, pseudo-condition numbers, the bound);
- :mod:`.probes`: capture the real attention inputs of a model, and the model-level
  :func:`attention_jacobian_condition_number` returning a :class:`ConditionReport`;
Its Trainer callback, :class:`hf_condinit.callbacks.ConditionNumberCallback`, logs κ during training.
"""

from .jacobian import (
    HeadCondition,
    attention_head_gram,
    attention_head_jacobian,
    attention_head_output,
    attention_probabilities,
    condition_bound,
    head_condition_number,
    pseudo_condition_number,
    softmax_jacobian_condition_number,
)
from .probes import (
    ConditionReport,
    LayerCondition,
    attention_jacobian_condition_number,
    capture_attention_inputs,
    resolve_causal,
)

__all__ = [
    "ConditionReport",
    "HeadCondition",
    "LayerCondition",
    "attention_head_gram",
    "attention_head_jacobian",
    "attention_head_output",
    "attention_jacobian_condition_number",
    "attention_probabilities",
    "capture_attention_inputs",
    "condition_bound",
    "head_condition_number",
    "pseudo_condition_number",
    "resolve_causal",
    "softmax_jacobian_condition_number",
]
