"""Diagnostics: the attention-Jacobian condition number (METHODS.md §6) and its Trainer callback.

- :mod:`.jacobian`: pure tensor functions (closed-form J and G = J Jᵀ, κ, pseudo-condition numbers, the bound);
- :mod:`.probes`: capture the real attention inputs of a model, and the model-level
  :func:`attention_jacobian_condition_number` returning a :class:`ConditionReport`;
- :mod:`.callbacks`: :class:`ConditionNumberCallback`, logging κ during training.
"""

from .callbacks import ConditionNumberCallback, build_probe
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
    "ConditionNumberCallback",
    "ConditionReport",
    "HeadCondition",
    "LayerCondition",
    "attention_head_gram",
    "attention_head_jacobian",
    "attention_head_output",
    "attention_jacobian_condition_number",
    "attention_probabilities",
    "build_probe",
    "capture_attention_inputs",
    "condition_bound",
    "head_condition_number",
    "pseudo_condition_number",
    "resolve_causal",
    "softmax_jacobian_condition_number",
]
