"""A fair A/B study on your own model and data, one command: arms × seeds × each arm's own learning
rate, every cell an ordinary run folder of the wrapped command, the paired verdict of :mod:`hf_condinit.stats`::

    python -m hf_condinit.study --arms default conditioned --seeds 3 --lr 1e-3 3e-3 --out STUDY \\
        -- run_clm.py --model_config gpt2-tiny --max_steps 200
    python -m hf_condinit.study --out STUDY --report               # report.md / report.json from finished cells
    python -m hf_condinit.study --out STUDY --submit                 # the same plan as SLURM job arrays

Modules: :mod:`.recipes` (arms as recipes), :mod:`.plan` (``study.json``, cells, slots, the learning-rate grid),
:mod:`.files` (claims and atomic JSON writes, shared with the benchmark harness), :mod:`.cells` (a cell's state,
running it, the worker loop), :mod:`.slurm` (the SLURM jobs), :mod:`.report` (the
report), :mod:`.cli` (the command line). docs/study.md walks through a study.
"""

from .plan import Cell, Plan, arm_rates, selection_slots, slots, verdict_slots
from .recipes import Recipe, parse_recipe

__all__ = ["Cell", "Plan", "Recipe", "arm_rates", "parse_recipe", "selection_slots", "slots", "verdict_slots"]
