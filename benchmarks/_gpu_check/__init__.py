"""The parts of ``benchmarks/gpu_check.py`` (the command and its documentation live there).

``runner``: rows recorded as they are measured, one forked process per part under a time cap; ``report``: the
Markdown report; ``common``: helpers of the parts (torch set-up, one row per failure); ``judge``: per-tensor
comparison of a fast path with its reference; ``env`` (a), ``correctness`` (b), ``speed`` (c), ``matrix`` (d;
each arm trained by ``training``), ``init_cost`` (e): the parts, each ``part(ctx, record)``.
"""

PARTS = ("a", "b", "c", "d", "e")
#: The order the parts run in (and are reported in) by default: the headline rows (part d's lever matrix) first,
#: correctness last (it took 25 s on the H200 before and gets the time the parts before it leave unused).
RUN_ORDER = ("a", "d", "c", "e", "b")
TITLES = {
    "a": "a. environment",
    "b": "b. correctness on the device",
    "c": "c. attention speed, memory and kernels (4 GPT-2 layers, 472M-shaped)",
    "d": "d. training throughput and speed levers (GPT-2 472M / 1.72B, bf16, Trainer)",
    "e": "e. init cost",
}
