"""The benchmarks' name for the verdict rule, which lives in the library: :mod:`hf_condinit.stats`.

Everything is re-exported unchanged, except that the report sentences cite the rule as ``benchmarks/_verdict.py``,
as the committed tables in README.md and docs/results.md always have (``benchmarks/findings.py --check``)."""

from __future__ import annotations

import functools

from hf_condinit import stats
from hf_condinit.stats import (ALPHA, LEVEL, NA, crossing_step, entry, flat_curve, fmt, holm, interval, judge,
                               mean_std, paired)

__all__ = ["ALPHA", "LEVEL", "NA", "SOURCE", "crossing_step", "entry", "family_caption", "flat_curve",
           "flat_sentence", "fmt", "holm", "interval", "judge", "mean_std", "paired"]

SOURCE = "benchmarks/_verdict.py"
flat_sentence = functools.partial(stats.flat_sentence, source=SOURCE)
family_caption = functools.partial(stats.family_caption, source=SOURCE)
