"""Diagnostics: the attention-Jacobian condition number (docs/methods.md §6).

- :mod:`.jacobian`: pure tensor functions of one head: the forward, the closed-form J and G = J Jᵀ;
- :mod:`.condition_number`: pure tensor functions on top of it: κ, pseudo-condition numbers, the bounds;
- :mod:`.probes`: capture the real attention inputs of a model, and the model-level
  :func:`attention_jacobian_condition_number` returning a :class:`ConditionReport`;
Its Trainer callback, :class:`hf_condinit.callbacks.ConditionNumberCallback`, logs κ during training.
"""

from .condition_number import (
    HeadCondition,
    condition_bound,
    head_condition_number,
    pseudo_condition_number,
    softmax_jacobian_condition_number,
)
from .jacobian import (
    attention_head_gram,
    attention_head_jacobian,
    attention_head_output,
    attention_probabilities,
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
