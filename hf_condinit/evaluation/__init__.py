"""Evaluation of trained models beyond the training loss: zero-shot minimal pairs (:mod:`.minimal_pairs`), a
zero-shot cloze on held-out text (:mod:`.cloze`), and the binomial intervals both report (:mod:`.binomial`)."""

from .binomial import accuracy_stats, wilson_interval
from .cloze import build_cloze_items, evaluate_cloze, score_cloze, summarize_cloze
from .minimal_pairs import load_minimal_pairs, score_items, sentence_log_probs, summarize, summarize_recorded

__all__ = ["accuracy_stats", "build_cloze_items", "evaluate_cloze", "load_minimal_pairs", "score_cloze",
           "score_items", "sentence_log_probs", "summarize", "summarize_recorded", "wilson_interval"]
