"""The depth sweep's plan (``compare.py --depth-sweep``, ``_depth``'s docstring): what it trains (:class:`DepthPlan`,
:data:`FULL`, :data:`QUICK`), each arm's rate from its learning-rate grids (:func:`grid_state`,
:func:`own_grid_states`, :func:`best_rates`), the runs in order (:func:`plan`, :func:`plan_finished`) and what they
cost (:func:`estimate_lines`). ``_depth_report`` reads the finished runs back."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import _common as C
import _lm_run as LM
import _scale_plan as SP

from hf_condinit.study.plan import choose_rate, ladder_extension


@dataclass(frozen=True)
class DepthPlan:
    """What the depth sweep trains (module docstring). ``seeds[i]`` seeds at ``depths[i]``; ``ladder``: the
    half-decade rates a grid may extend to, ascending, ``grid_lrs`` a contiguous part of it."""

    width: int
    n_head: int
    depths: tuple
    seeds: tuple
    main_tpp: float
    grid_depth: int
    grid_tpp: float
    grid_lrs: tuple
    ladder: tuple
    shared_lr: float
    arms: tuple
    batch_size: int
    block_size: int
    vocab_size: int
    eval_blocks: int
    final_eval_blocks: int
    dropped: tuple = ()  # sizes (n_layer, n_embd, n_head) left out for the budget: estimated, not run
    shared_from: str | None = None  # output folder of the scale sweep (shared-rate runs at depth 2)
    max_bytes: int | None = None
    rate_check_depth: int | None = None  # default also at the other arms' best rates at this depth (plan step 3)
    own_grid_depths: tuple = ()  # depths with their own LR grid (main_tpp, seed 0) deciding each arm's rate there
    # (depth, device, seeds): at an own-grid depth, default at its rate there again on ``device`` for these seeds
    # (label "default@<device>"), for the arms whose runs are on that device (a pair needs one device)
    matched_baselines: tuple = ()

    def size(self, depth: int) -> tuple:
        return (depth, self.width, self.n_head)

    @property
    def sizes(self) -> list:
        return [self.size(d) for d in self.depths]


FULL = DepthPlan(width=64, n_head=2, depths=(2, 4, 8), seeds=(2, 3, 5), main_tpp=20.0, grid_depth=4, grid_tpp=5.0,
                 grid_lrs=(1e-3, 3e-3, 1e-2, 3e-2), ladder=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
                 shared_lr=3e-3, arms=SP.ARMS, batch_size=8, block_size=256, vocab_size=4096, eval_blocks=16,
                 final_eval_blocks=64, dropped=((8, 96, 3),),
                 shared_from=os.path.join(C.REPO_ROOT, "benchmarks", "results", "scale"), rate_check_depth=8,
                 matched_baselines=((8, "cpu", (0, 1, 2)),))  # default's seeds 0-2 at 1e-2 ran on an H200
QUICK = DepthPlan(width=32, n_head=4, depths=(1, 2), seeds=(1, 2), main_tpp=0.25, grid_depth=2, grid_tpp=0.1,
                  grid_lrs=(3e-3, 1e-2), ladder=(1e-3, 3e-3, 1e-2, 3e-2), shared_lr=3e-3,
                  arms=("default", "conditioned_v0.25"), batch_size=4, block_size=64, vocab_size=512, eval_blocks=4,
                  final_eval_blocks=8, max_bytes=200_000, rate_check_depth=2)
KAPPA_AT = (0.0, 1.0)  # κ(J) at init and at the end of every run


# ---------------------------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------------------------


def grid_spec(p: DepthPlan, label: str, lr: float, depth: int | None = None) -> LM.TrainSpec:
    """A grid run: seed 0 at rate ``lr``; at ``grid_depth`` and ``grid_tpp`` (``depth`` None), or at ``depth`` and
    ``main_tpp`` (an own-grid depth: the run is that depth's seed-0 run at ``lr``)."""
    if depth is None:
        return SP.make_spec(p, label, p.size(p.grid_depth), p.grid_tpp, lr, 0, KAPPA_AT)
    return depth_spec(p, label, depth, lr, 0)


def depth_spec(p: DepthPlan, label: str, depth: int, lr: float, seed: int) -> LM.TrainSpec:
    return SP.make_spec(p, label, p.size(depth), p.main_tpp, lr, seed, KAPPA_AT)


def record_metric(rec: dict, eval_name: str | None) -> float:
    """The compared loss of a record (WikiText-2 valid when evaluated, else the internal held-out split); a
    non-finite loss (a diverged run) counts as +inf."""
    loss = SP._metric(rec, eval_name)
    return loss if loss is not None and math.isfinite(loss) else math.inf


def grid_state(out: str, p: DepthPlan, eval_name: str | None, depth: int | None = None) -> dict:
    """The grid at ``grid_depth`` (``depth`` None) or the own grid at ``depth`` (:func:`grid_spec`): per arm,
    :func:`hf_condinit.study.plan.choose_rate` of ``grid_lrs`` (the library's one grid rule) with the compared loss
    of each finished grid run (:func:`record_metric`: a diverged run is worse than any other), extended along
    ``ladder`` (:func:`hf_condinit.study.plan.ladder_extension`): ``tried`` (the rates the grid needs, ascending),
    ``values`` (lr -> loss, None while unfinished), ``best`` (None while undecided, or when every rate diverged),
    ``decided``, ``at_edge`` (the best is at an end of the ladder)."""
    state = {}
    for label in p.arms:
        def loss(lr, label=label):
            rec = SP.record_of(out, grid_spec(p, label, lr, depth))
            return None if rec is None else record_metric(rec, eval_name)

        state[label] = choose_rate(p.grid_lrs, loss, ladder_extension(p.ladder))
    return state


def own_grid_states(out: str, p: DepthPlan, eval_name: str | None) -> dict:
    """depth -> :func:`grid_state` of the own grid at each of ``p.own_grid_depths``."""
    return {d: grid_state(out, p, eval_name, d) for d in p.own_grid_depths}


def plan_finished(out: str, p: DepthPlan, eval_name: str | None) -> bool:
    """Whether the whole plan ``p`` is done under ``out``: every arm's rate decided in the grid at ``grid_depth`` and
    in every own grid, and every run of :func:`plan` recorded. ``findings.py`` reports the own grid at
    ``rate_check_depth`` (each arm at its own depth-8 rate, no longer provisional) only then."""
    state, states = grid_state(out, p, eval_name), own_grid_states(out, p, eval_name)
    if not all(st[a]["decided"] for st in (state, *states.values()) for a in p.arms):
        return False
    return all(SP.record_of(out, r) is not None for r in plan(p, state, states=states))


def best_rates(p: DepthPlan, state: dict, states: dict | None, depth: int) -> dict:
    """arm -> the rate its runs at ``depth`` use: the own grid's best at an own-grid depth (``states``), else the
    best of the grid at ``grid_depth`` (``state``); None while undecided."""
    st = (states or {}).get(depth, state)
    return {a: st[a]["best"] for a in p.arms}


def plan(p: DepthPlan, state: dict, placeholder: bool = False, states: dict | None = None) -> list[LM.TrainSpec]:
    """Every run known now, in order (module docstring): the grid runs of ``state`` (:func:`grid_state`) and of the
    own grids ``states`` (:func:`own_grid_states`), the depth runs of the arms whose best rate is decided, default's
    device-matched runs (``matched_baselines``, at own-grid depths), then the same-rate checks
    (:func:`rate_check_lrs`). ``placeholder``: also the undecided arms' depth runs, at
    ``shared_lr`` (for the cost estimate only; the rate does not change the cost)."""
    states = states or {}
    runs = [grid_spec(p, a, lr) for a in p.arms for lr in state[a]["tried"]]
    runs += [grid_spec(p, a, lr, d) for d, st in states.items() for a in p.arms for lr in st[a]["tried"]]
    for seed in range(max(p.seeds)):
        for depth, n_seeds in zip(p.depths, p.seeds):
            if seed >= n_seeds:
                continue
            best = best_rates(p, state, states, depth)
            for a in p.arms:
                lr = best[a] or (p.shared_lr if placeholder else None)
                if lr is not None:
                    runs.append(depth_spec(p, a, depth, lr, seed))
    for depth, device, seeds in p.matched_baselines:
        lr = best_rates(p, state, states, depth)["default"] if depth in states else None
        runs += [depth_spec(p, f"default@{device}", depth, lr, seed) for seed in seeds if lr is not None]
    if p.rate_check_depth is not None:
        n_seeds = dict(zip(p.depths, p.seeds))[p.rate_check_depth]
        runs += [depth_spec(p, "default", p.rate_check_depth, lr, seed) for seed in range(n_seeds)
                 for lr in rate_check_lrs(p, state)]
    seen: set = set()  # an own grid's run at the best rate is also that depth's seed-0 run
    return [r for r in runs if not (r.key() in seen or seen.add(r.key()))]


def rate_check_lrs(p: DepthPlan, state: dict) -> list[float]:
    """The rates default is also run at at ``rate_check_depth``: the decided best rates of the other arms that are
    not default's own (none until default's is decided)."""
    own = state["default"]["best"]
    if own is None:
        return []
    return sorted({state[a]["best"] for a in p.arms if state[a]["best"] is not None} - {own})


# ---------------------------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------------------------


def blimp_tokens(tokenizer, blimp_dir: str | None) -> int:
    """Tokens one BLiMP evaluation feeds the model: every sentence of the pairs plus its EOS prefix (padding to the
    longest sentence of a batch not included)."""
    if not blimp_dir:
        return 0
    n = 0
    for fn in sorted(os.listdir(blimp_dir)):
        if fn.endswith(".jsonl"):
            with open(os.path.join(blimp_dir, fn), encoding="utf-8") as f:
                pairs = [json.loads(line) for line in f if line.strip()]
            sents = [x["sentence_good"] for x in pairs] + [x["sentence_bad"] for x in pairs]
            n += sum(len(ids) + 1 for ids in tokenizer(sents)["input_ids"])
    return n


def estimate_lines(p: DepthPlan, out: str, runs: list, done: list, costs: dict, eval_tokens: int,
                   n_blimp: int) -> list[str]:
    """What the start of the sweep prints: the cost per size, the plan's CPU estimate (all runs, what is left) on 2
    idle cores with two single-thread workers, and what the dropped sizes would add."""
    def est(r):
        c = costs["sizes"][r.extra["size"]]
        return SP.run_cpu_estimate(r, c, eval_tokens) + 1e-6 * n_blimp * c["eval_cpu_us_per_token"]

    lines = ["[depth] CPU time per token (user + system, one thread, forward + backward + AdamW / forward; measured "
             "once on random tokens, cost.json):"]
    lines += [f"[depth]   {n}: train {c['train_cpu_us_per_token']:.1f} µs, eval {c['eval_cpu_us_per_token']:.1f} µs"
              for n, c in costs["sizes"].items()]
    kinds: dict = {}
    for r in runs:
        kinds.setdefault((r.extra["size"], r.tokens_per_param), []).append(est(r))
    lines += [f"[depth]   {size} at {tpp:g} tokens/param: {len(xs)} runs × {xs[0]:.0f} core-s"
              for (size, tpp), xs in kinds.items()]
    total = sum(est(r) for r in runs)
    left = total - sum(est(r) for r in done)
    lines.append(f"[depth] plan: {len(runs)} runs, {total / 3600:.2f} core-h ({total / 7200:.2f} h on 2 idle cores, "
                 f"two --threads 1 workers); left: {len(runs) - len(done)} runs, {left / 3600:.2f} core-h "
                 f"({left / 7200:.2f} h on 2 cores). κ(J) and the Trainer's overhead not included; the grid may add "
                 "a rate per arm.")
    for size in p.dropped:
        name = SP.size_name(size)
        if name in costs["sizes"]:
            extra = [SP.make_spec(p, a, size, p.main_tpp, p.shared_lr, s, KAPPA_AT) for s in range(min(p.seeds))
                     for a in p.arms]
            cost = sum(SP.run_cpu_estimate(r, costs["sizes"][name], eval_tokens) for r in extra)
            lines.append(f"[depth] not in the plan: {name} ({len(extra)} runs) would add {cost / 3600:.2f} core-h "
                         f"({cost / 7200:.2f} h on 2 cores)")
    recs = [(r, SP.record_of(out, r)) for r in done]
    recs = [(r, x) for r, x in recs if x and "cpu_seconds" in x]
    if recs:
        ratio = sum(x["cpu_seconds"] for _, x in recs) / sum(est(r) for r, _ in recs)
        lines.append(f"[depth] the {len(recs)} finished runs took {ratio:.2f} × their estimate in CPU time")
    return lines
