"""A study's plan (``<out>/study.json``), its cells, and each arm's learning rate chosen on the grid.

A **cell** is one run: (arm, seed, learning rate), an ordinary run folder of the wrapped command at
``<out>/arms/<arm slug>/seed<S>[_lr<LR>]``. With two or more ``--lr`` values each arm's rate is chosen on the grid
at ``select_seed`` (best final ``metric``; a failed run, e.g. a non-finite loss, counts as worse than any finished
one); when the best is the lowest or highest rate tried, the grid grows by one geometric step past it (the ratio
of the two rates at that edge, rounded to 3 significant digits), at most ``lr_extend`` times per arm; the other
seeds then run at the chosen rate. With one ``--lr`` every cell runs at it; with none, at the command's own rate.

The work is a fixed list of **slots** (:func:`slots`), the same for every worker and for the SLURM array (slot i =
array task i): the grid cells, then ``lr_extend`` rounds of one extension slot per arm, then the other seeds, seed
by seed, every arm beside each other. A slot resolves (:func:`resolve`) to a cell, to ``None`` (nothing to do: no
extension needed, or every rate of the arm failed) or to :data:`WAIT` (the arm's rate is not decided yet); a slot
only ever waits on slots before it.
"""

from __future__ import annotations

import dataclasses
import json
import os

from .recipes import parse_recipe

__all__ = ["PLAN_FILE", "WAIT", "Cell", "Plan", "arm_rates", "resolve", "slots"]

PLAN_FILE = "study.json"
WAIT = "wait"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the study."""

    arm: str
    seed: int
    lr: float | None

    def folder(self, out: str) -> str:
        """The run folder (the command's ``--output_dir``)."""
        lr = "" if self.lr is None else f"_lr{self.lr:g}"
        return os.path.join(out, "arms", parse_recipe(self.arm).slug, f"seed{self.seed}{lr}")

    @property
    def key(self) -> str:
        """A file name for the cell's claim, record and log: ``<arm slug>__seed<S>[_lr<LR>]``."""
        return "__".join(os.path.normpath(self.folder("")).split(os.sep)[1:])


@dataclasses.dataclass
class Plan:
    """What ``study.json`` holds: the flags that define a study (a rerun with other values is refused).

    ``arms``: recipe texts, the first is the baseline every other arm is compared with; ``seeds``: seeds
    ``0 .. seeds-1``; ``lrs``: the learning-rate grid (empty: the command's own rate); ``command``: the wrapped
    command (``run_clm.py ...``); ``workdir``: the folder it runs in (relative paths in it are read from there)."""

    arms: list[str]
    seeds: int
    lrs: list[float]
    command: list[str]
    workdir: str
    metric: str = "eval_loss"
    select_seed: int = 0
    lr_extend: int = 1

    @property
    def grid(self) -> bool:
        return len(self.lrs) >= 2

    def save(self, out: str) -> None:
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, f".{PLAN_FILE}.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=1)
        os.replace(tmp, os.path.join(out, PLAN_FILE))

    @classmethod
    def load(cls, out: str) -> "Plan | None":
        """The plan of ``out``, or None when there is none; ``ValueError`` for an unreadable one."""
        path = os.path.join(out, PLAN_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{path} is not a study plan ({e})") from None


def _step(lo: float, hi: float, outward: float) -> float:
    """One geometric step past ``outward`` (an edge of the grid) with the ratio hi / lo, 3 significant digits."""
    ratio = hi / lo
    return float(f"{(outward / ratio if outward == lo else outward * ratio):.3g}")


def arm_rates(plan: Plan, arm: str, outcome) -> dict:
    """The grid of one arm as far as it is known. ``outcome(cell)`` -> the final metric (lower is better after
    the sign is taken into account: pass ``-value`` for a higher-is-better metric), ``float("inf")`` for a failed
    run, None for a run not finished.

    Returns ``tried`` (rates in order of the grid, extensions included), ``extensions`` (the rates added),
    ``values`` (rate -> outcome), ``best`` (the chosen rate; None while undecided or when every rate failed),
    ``decided`` and ``at_edge`` (the best is still at an edge of the tried grid: no more extensions allowed)."""
    tried = sorted(plan.lrs)
    extensions: list[float] = []
    while True:
        values = {lr: outcome(Cell(arm, plan.select_seed, lr)) for lr in tried}
        if any(v is None for v in values.values()):
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=False, at_edge=False)
        best = min(tried, key=lambda lr: values[lr])
        if values[best] == float("inf"):
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=True, at_edge=False)
        edge = best in (tried[0], tried[-1])
        if not edge or len(extensions) >= plan.lr_extend:
            return dict(tried=tried, extensions=extensions, values=values, best=best, decided=True, at_edge=edge)
        new = _step(tried[0], tried[1], best) if best == tried[0] else _step(tried[-2], tried[-1], best)
        extensions.append(new)
        tried = sorted([*tried, new])


def slots(plan: Plan) -> list[tuple]:
    """The study's work in order (module docstring): ``("cell", Cell)``, ``("extend", arm, k)`` (k-th extension of
    the arm's grid, from 1) or ``("seed", arm, seed)`` (at the arm's chosen rate)."""
    if not plan.grid:
        lr = plan.lrs[0] if plan.lrs else None
        return [("cell", Cell(a, s, lr)) for s in range(plan.seeds) for a in plan.arms]
    out: list[tuple] = [("cell", Cell(a, plan.select_seed, lr)) for lr in sorted(plan.lrs) for a in plan.arms]
    out += [("extend", a, k) for k in range(1, plan.lr_extend + 1) for a in plan.arms]
    out += [("seed", a, s) for s in range(plan.seeds) if s != plan.select_seed for a in plan.arms]
    return out


def resolve(plan: Plan, slot: tuple, outcome):
    """The :class:`Cell` of ``slot``, None (nothing to run) or :data:`WAIT` (module docstring)."""
    if slot[0] == "cell":
        return slot[1]
    rates = arm_rates(plan, slot[1], outcome)
    if slot[0] == "extend":
        k = slot[2]
        if len(rates["extensions"]) >= k:
            return Cell(slot[1], plan.select_seed, rates["extensions"][k - 1])
        return None if rates["decided"] else WAIT
    if not rates["decided"]:
        return WAIT
    return None if rates["best"] is None else Cell(slot[1], slot[2], rates["best"])
