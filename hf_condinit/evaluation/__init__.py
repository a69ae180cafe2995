"""Evaluation of trained models beyond the training loss: zero-shot minimal pairs (:mod:`.minimal_pairs`)."""

from .minimal_pairs import load_minimal_pairs, score_items, sentence_log_probs, summarize

__all__ = ["load_minimal_pairs", "score_items", "sentence_log_probs", "summarize"]
