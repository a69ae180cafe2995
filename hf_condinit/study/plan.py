"""A study's plan (``<out>/study.json``), its cells, and each arm's learning rate chosen on the grid.

A **cell** is one run: (arm, seed, learning rate), an ordinary run folder of the wrapped command at
``<out>/arms/<arm slug>/seed<S>[_lr<LR>]``. With two or more ``--lr`` values each arm's rate is chosen on the grid
at ``select_seed`` (best final ``metric``; a failed run, e.g. a non-finite loss, counts as worse than any finished
one); when the best is the lowest or highest rate tried, the grid grows by one geometric step past it (the ratio
of the two rates at that edge, rounded to 3 significant digits), at most ``lr_extend`` times per arm; the other
seeds then run at the chosen rate. With one ``--lr`` every cell runs at it; with none, at the command's own rate.
The decision itself is :func:`choose_rate`, the one rule for a learning-rate grid in the project: the study grows a
grid by :func:`geometric_extension`, ``benchmarks/_depth_plan.py`` along its fixed ladder by :func:`ladder_extension`.

The cells that choose a rate (the selection seed's, at every rate) are kept out of the verdict: the verdict pairs
the :func:`verdict_seeds`, every seed but ``select_seed`` with a grid (every seed without one).

The work is a fixed list of **slots** (:func:`slots`), the same for every worker and for the SLURM array, in two
**phases**: :func:`selection_slots` (the grid cells, then ``lr_extend`` rounds of one extension slot per arm; empty
without a grid) and :func:`verdict_slots` (the verdict seeds, seed by seed, every arm beside each other, at each
arm's chosen rate). A slot resolves (:func:`resolve`) to a cell, to ``None`` (nothing to do: no extension needed,
or every rate of the arm failed) or to :data:`WAIT` (the arm's rate is not decided yet); a slot only ever waits on
selection slots, which all come before it.

A plan **grows** (:func:`grow`): more seeds, more arms, more rates on the grid, more extensions keep every finished
cell (its folder does not change) and add only new ones; a change that would make a finished cell mean something
else (the command, the metric, the selection seed, the baseline, a rate or arm or seed taken away) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

from .files import write_json
from .recipes import parse_recipe

__all__ = ["PLAN_FILE", "WAIT", "Cell", "Plan", "arm_rates", "choose_rate", "geometric_extension", "grow",
           "ladder_extension", "resolve", "rounds", "selection_slots", "slots", "verdict_seeds", "verdict_slots"]

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
    command (``run_clm.py ...``); ``workdir``: the folder it runs in (relative paths in it are read from there);
    ``effect``: the effect the report's seeds-needed figure is for, in the metric's units or ``"<x>%"`` of the
    baseline's mean (a reporting choice, changed freely); ``plateau``: the report's plateau threshold, the gain over
    the last fifth of training under which an arm is on a plateau, in the metric's units (a reporting choice too);
    ``history``: how the plan grew, ``{"at": time, "added": what}`` in order (:func:`grow`)."""

    arms: list[str]
    seeds: int
    lrs: list[float]
    command: list[str]
    workdir: str
    metric: str = "eval_loss"
    select_seed: int = 0
    lr_extend: int = 1
    effect: str = "1%"
    plateau: float = 0.005
    history: list = dataclasses.field(default_factory=list)

    @property
    def grid(self) -> bool:
        return len(self.lrs) >= 2

    def save(self, out: str) -> None:
        write_json(os.path.join(out, PLAN_FILE), dataclasses.asdict(self))

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


def choose_rate(lrs, outcome, extend=None) -> dict:
    """The learning-rate grid of one arm: which rate is best, whether that is decided, which rates it needs.

    ``lrs``: the starting grid (any order); ``outcome(lr)``: the final metric of the run at ``lr`` with lower better
    (negate a higher-is-better metric), None while that run is not finished, a non-finite value for a failed run
    (diverged, crashed); ``extend(tried, best, n)``: the rate to add past ``best``, the lowest or highest of the
    ascending ``tried``, after ``n`` extensions so far, or None when the grid may not grow there (``extend`` None:
    never; :func:`geometric_extension`, :func:`ladder_extension`).

    Once every tried rate is finished, the best is the rate of the lowest outcome (a tie: the lower rate); a failed
    run is worse than any finished one, and when every rate failed there is no best (decided, ``best`` None). A best
    at the lowest or highest tried rate adds ``extend``'s rate to the grid, which is then decided again with it.

    Returns ``tried`` (ascending, the extensions included: every rate the grid needs), ``extensions`` (in the order
    added: the last is the rate to run next while undecided), ``values`` (rate -> outcome, ``inf`` for a failed
    run, None while unfinished), ``best`` (None while undecided), ``decided`` and ``at_edge`` (the best is at an edge
    the grid could not grow past: a bound, not a best)."""
    tried = sorted(lrs)
    extensions: list[float] = []
    while True:
        values = {lr: outcome(lr) for lr in tried}
        values = {lr: v if v is None or math.isfinite(v) else math.inf for lr, v in values.items()}
        if any(v is None for v in values.values()):
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=False, at_edge=False)
        best = min(tried, key=lambda lr: values[lr])
        if values[best] == math.inf:
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=True, at_edge=False)
        new = None
        if best in (tried[0], tried[-1]) and extend is not None:
            new = extend(tried, best, len(extensions))
        if new is None:
            return dict(tried=tried, extensions=extensions, values=values, best=best, decided=True,
                        at_edge=best in (tried[0], tried[-1]))
        extensions.append(new)
        tried = sorted([*tried, new])


def geometric_extension(max_steps: int):
    """The study's ``extend`` for :func:`choose_rate`: one geometric step past the edge, with the ratio of the two
    tried rates at that edge (rounded to 3 significant digits), at most ``max_steps`` times."""

    def extend(tried: list, best: float, n: int) -> float | None:
        if n >= max_steps:
            return None
        if best == tried[0]:
            return float(f"{best / (tried[1] / tried[0]):.3g}")
        return float(f"{best * (tried[-1] / tried[-2]):.3g}")

    return extend


def ladder_extension(ladder):
    """``benchmarks/_depth_plan.py``'s ``extend`` for :func:`choose_rate`: the next rate of the ascending ``ladder``
    (of which the grid is a contiguous part) beyond the edge, as often as the ladder goes on."""

    def extend(tried: list, best: float, n: int) -> float | None:
        i = ladder.index(best)
        if best == tried[0] and i > 0:
            return ladder[i - 1]
        if best == tried[-1] and i < len(ladder) - 1:
            return ladder[i + 1]
        return None

    return extend


def arm_rates(plan: Plan, arm: str, outcome) -> dict:
    """The grid of one arm as far as it is known: :func:`choose_rate` of the plan's rates at ``select_seed``,
    extended by :func:`geometric_extension` (``lr_extend`` steps); ``outcome(cell)`` -> the final metric, lower
    better, ``float("inf")`` for a failed run, None when unfinished."""
    return choose_rate(plan.lrs, lambda lr: outcome(Cell(arm, plan.select_seed, lr)),
                       geometric_extension(plan.lr_extend))


def verdict_seeds(plan: Plan) -> list[int]:
    """The seeds the verdict pairs: every seed but the selection seed with a grid (its cells chose the rates, so
    they are kept out: module docstring), every seed without one."""
    return [s for s in range(plan.seeds) if not (plan.grid and s == plan.select_seed)]


def selection_slots(plan: Plan) -> list[tuple]:
    """The selection phase: ``("cell", Cell)`` for every grid rate and arm at the selection seed, then
    ``("extend", arm, k)`` (the k-th extension of the arm's grid, from 1); empty without a grid."""
    if not plan.grid:
        return []
    out: list[tuple] = [("cell", Cell(a, plan.select_seed, lr)) for lr in sorted(plan.lrs) for a in plan.arms]
    return out + [("extend", a, k) for k in range(1, plan.lr_extend + 1) for a in plan.arms]


def verdict_slots(plan: Plan) -> list[tuple]:
    """The verdict phase: ``("seed", arm, seed)`` (at the arm's chosen rate) with a grid, ``("cell", Cell)`` at the
    one rate without; seed by seed over :func:`verdict_seeds`, every arm beside each other."""
    if not plan.grid:
        lr = plan.lrs[0] if plan.lrs else None
        return [("cell", Cell(a, s, lr)) for s in verdict_seeds(plan) for a in plan.arms]
    return [("seed", a, s) for s in verdict_seeds(plan) for a in plan.arms]


def slots(plan: Plan) -> list[tuple]:
    """The study's work in order: :func:`selection_slots`, then :func:`verdict_slots` (module docstring)."""
    return selection_slots(plan) + verdict_slots(plan)


def grow(saved: Plan, asked: dict, command: list[str]) -> Plan:
    """The plan ``saved`` with the flags ``asked`` (``arms``, ``seeds``, ``lrs``, ``metric``, ``select_seed``,
    ``lr_extend``, ``effect``, ``plateau``; None: as saved) and ``command`` (empty: as saved). A flag that adds seeds,
    arms (after the saved ones), rates or extensions grows the plan, noted in ``history``; a change that would
    invalidate a finished cell raises ``ValueError`` naming it (module docstring). ``effect`` and ``plateau`` are
    taken as given."""
    diff = []
    if command and command != saved.command:
        first = next((i for i, (a, b) in enumerate(zip(saved.command, command)) if a != b),
                     min(len(saved.command), len(command)))
        was, now = " ".join(saved.command[first:]) or "(nothing)", " ".join(command[first:]) or "(nothing)"
        diff.append(f"the command differs from word {first + 1} on (was {was!r}, now {now!r})")
    for key in ("metric", "select_seed"):
        if asked.get(key) is not None and asked[key] != getattr(saved, key):
            diff.append(f"--{key} was {getattr(saved, key)}, now {asked[key]}")
    arms, seeds, lrs, extend = (asked.get(k) for k in ("arms", "seeds", "lrs", "lr_extend"))
    if arms is not None and (arms[0] != saved.arms[0] or not set(saved.arms) <= set(arms)):
        diff.append(f"--arms was {' '.join(saved.arms)}, now {' '.join(arms)} (a study keeps its baseline first "
                    "and every arm it has; add arms after them)")
    if seeds is not None and seeds < saved.seeds:
        diff.append(f"--seeds was {saved.seeds}, now {seeds} (a study only grows)")
    if lrs is not None and not (set(saved.lrs) <= set(lrs) and bool(saved.lrs) == bool(lrs)):
        rates = lambda xs: " ".join(f"{x:g}" for x in xs) or "(the command's own rate)"  # noqa: E731
        diff.append(f"--lr was {rates(saved.lrs)}, now {rates(lrs)} (a grid only grows)")
    if extend is not None and extend < saved.lr_extend:
        diff.append(f"--lr_extend was {saved.lr_extend}, now {extend} (a study only grows)")
    if diff:
        raise ValueError(f"this study was planned otherwise, and its finished cells would not fit: {'; '.join(diff)}"
                         "; use another --out for that study")
    plan = dataclasses.replace(saved, history=list(saved.history))
    added = []
    if arms is not None and arms != saved.arms:
        new = [a for a in arms if a not in saved.arms]
        plan.arms = saved.arms + new
        added += [f"arm{'s' * (len(new) > 1)} {', '.join(new)}"] if new else []
    if seeds is not None and seeds > saved.seeds:
        plan.seeds = seeds
        added.append(f"seeds {saved.seeds} → {seeds}")
    if lrs is not None and set(lrs) != set(saved.lrs):
        new = sorted(set(lrs) - set(saved.lrs))
        plan.lrs = saved.lrs + new
        added.append(f"rate{'s' * (len(new) > 1)} {', '.join(f'{x:g}' for x in new)}")
    if extend is not None and extend > saved.lr_extend:
        plan.lr_extend = extend
        added.append(f"lr_extend {saved.lr_extend} → {extend}")
    for key in ("effect", "plateau"):
        if asked.get(key) is not None:
            setattr(plan, key, asked[key])
    if added:
        plan.history.append(dict(at=time.strftime("%Y-%m-%d %H:%M:%S%z"), added="; ".join(added)))
    return plan


def rounds(plan: Plan) -> list[list[int]]:
    """The slots' indices (into :func:`slots`) by round: a slot resolves to a cell or None, never :data:`WAIT`,
    once every slot of the rounds before its own is finished (or failed). The selection round (the grid's cells),
    one round per possible extension of the grid, then the verdict round (the other seeds); without a grid, one
    round. Empty rounds are left out."""
    last = plan.lr_extend + 1
    order = [0 if s[0] == "cell" else s[2] if s[0] == "extend" else last for s in slots(plan)]
    return [idx for r in range(last + 1) if (idx := [i for i, o in enumerate(order) if o == r])]


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
