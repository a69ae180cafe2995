"""``benchmarks/compare.py --depth-sweep``: does an init's gap to default shrink, flip or grow with depth, each arm
at its own best learning rate? (issue 21)

The scale sweep (``_scale.py``) varied width at depth 2; this mode varies depth at width 64 (head dim 32, 2 heads)
with the same data, tokenizer, batch, block, evaluation and arms (:data:`_scale.ARMS`), and records per run the
WikiText-2 valid loss / perplexity (``--eval-file``), BLiMP accuracy (``--blimp-dir``, ``_common.evaluate_blimp``),
the eval curve (steps to default's final loss) and κ(J) of every layer at init and at the end (causal and unmasked,
``ConditionNumberCallback``).

Plan (:data:`FULL`; :func:`plan`), in this order:

1. **LR grid** at depth ``grid_depth`` (4), seed 0, ``grid_tpp`` (5) tokens per non-embedding parameter, every arm
   at the half-decade rates ``grid_lrs`` (1e-3, 3e-3, 1e-2, 3e-2). When an arm's best rate (lowest WikiText-2 valid
   loss) is the lowest or the highest it was tried at, the next half-decade of :attr:`DepthPlan.ladder` beyond it is
   added for that arm (:func:`grid_state`), until its best is inside or the ladder ends (said in the report).
2. **Depth sweep**: depths ``depths`` (2, 4, 8) × arms × seeds ``seeds`` (0-1 at depth 2; 0-2 at depth 4;
   0-4 at depth 8, issue 28)
   at ``main_tpp`` (20) tokens per parameter, each arm at *its own* best rate of the grid; seed 0 of every depth
   first (shallowest first, default first), then seed 1, and so on. An arm's depth runs enter the plan when its
   grid is decided, so a worker never waits while there is a decided run to do.
3. **Same-rate check** at depth ``rate_check_depth`` (8): default also at every other arm's best rate (same seeds),
   so that an arm's gap there can be read at one rate for both (is a win the init, or only the rate the grid gave
   it at depth 4?).

8 × 96 (``dropped``) is not in the plan: its estimate is printed next to the plan's and exceeds the 5-hour budget on
its own (issue 21: "drop 8 × 96 first").

Shared-rate results beside the own-rate ones (issue 21, item 2), where both exist: at ``grid_tpp`` the grid's
``shared_lr`` column (depth 4, seed 0) and the scale sweep's LR sweep at 2 × 64 (seeds 0-1); at ``main_tpp`` the
scale sweep's 2 × 64 runs at its shared rate (seeds 0-2), read from ``benchmarks/results/scale`` (``shared_from``).

Resumable and shared like the scale sweep (``_lm_run.execute_runs``: one record per finished run, lock files, any
number of workers on one ``--out``; default ``benchmarks/results/depth``); a worker whose remaining runs wait on
another worker's grid run polls every 30 s. Cost: ``cost.json`` per size (``_scale.measure_cost``), the estimate
printed before training (training, evaluation and BLiMP forward tokens; κ and the Trainer's overhead not included).

    python benchmarks/compare.py --depth-sweep --threads 1                  # full mode (two workers: README)
    python benchmarks/compare.py --depth-sweep --quick --out /tmp/depth_q   # tiny sizes, a few steps
    python benchmarks/compare.py --depth-sweep --report-only                # tables / plots from finished runs
    python benchmarks/compare.py --depth-sweep --depths 8 --device cuda     # one machine's share: depth 8 on a GPU
    python benchmarks/compare.py --depth-sweep --grid-depths 8 --depths 8 --device cuda   # + an own LR grid at depth 8
    python benchmarks/compare.py --depth-sweep --depths 8 --train-arms default conditioned   # the headline's runs first

``--grid-depths D``: an own LR grid at depth D (:attr:`DepthPlan.own_grid_depths`: every arm at ``grid_lrs`` at
``main_tpp``, seed 0, extended along the ladder like the depth-4 grid); the arms' runs at depth D then use that
grid's best rate, so a comparison there is at each arm's own best rate *at that depth*.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import _common as C
import _lm_run as LM
import _scale as S
import _verdict as V
from _common import fail

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

    def size(self, depth: int) -> tuple:
        return (depth, self.width, self.n_head)

    @property
    def sizes(self) -> list:
        return [self.size(d) for d in self.depths]


FULL = DepthPlan(width=64, n_head=2, depths=(2, 4, 8), seeds=(2, 3, 5), main_tpp=20.0, grid_depth=4, grid_tpp=5.0,
                 grid_lrs=(1e-3, 3e-3, 1e-2, 3e-2), ladder=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
                 shared_lr=3e-3, arms=tuple(S.ARMS), batch_size=8, block_size=256, vocab_size=4096, eval_blocks=16,
                 final_eval_blocks=64, dropped=((8, 96, 3),),
                 shared_from=os.path.join(C.REPO_ROOT, "benchmarks", "results", "scale"), rate_check_depth=8)
QUICK = DepthPlan(width=32, n_head=4, depths=(1, 2), seeds=(1, 2), main_tpp=0.25, grid_depth=2, grid_tpp=0.1,
                  grid_lrs=(3e-3, 1e-2), ladder=(1e-3, 3e-3, 1e-2, 3e-2), shared_lr=3e-3,
                  arms=("default", "conditioned_v0.25"), batch_size=4, block_size=64, vocab_size=512, eval_blocks=4,
                  final_eval_blocks=8, max_bytes=200_000, rate_check_depth=2)
KAPPA_AT = (0.0, 1.0)  # κ(J) at init and at the end of every run
POLL_SECONDS = 30


# ---------------------------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------------------------


def grid_spec(p: DepthPlan, label: str, lr: float, depth: int | None = None) -> LM.TrainSpec:
    """A grid run: seed 0 at rate ``lr``; at ``grid_depth`` and ``grid_tpp`` (``depth`` None), or at ``depth`` and
    ``main_tpp`` (an own-grid depth: the run is that depth's seed-0 run at ``lr``)."""
    if depth is None:
        return S.make_spec(p, label, p.size(p.grid_depth), p.grid_tpp, lr, 0, KAPPA_AT)
    return depth_spec(p, label, depth, lr, 0)


def depth_spec(p: DepthPlan, label: str, depth: int, lr: float, seed: int) -> LM.TrainSpec:
    return S.make_spec(p, label, p.size(depth), p.main_tpp, lr, seed, KAPPA_AT)


def record_metric(rec: dict, eval_name: str | None) -> float:
    """The compared loss of a record (WikiText-2 valid when evaluated, else the internal held-out split); a
    non-finite loss (a diverged run) counts as +inf."""
    loss = S._metric(rec, eval_name)
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
            rec = S.record_of(out, grid_spec(p, label, lr, depth))
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
    return all(S.record_of(out, r) is not None for r in plan(p, state, states=states))


def best_rates(p: DepthPlan, state: dict, states: dict | None, depth: int) -> dict:
    """arm -> the rate its runs at ``depth`` use: the own grid's best at an own-grid depth (``states``), else the
    best of the grid at ``grid_depth`` (``state``); None while undecided."""
    st = (states or {}).get(depth, state)
    return {a: st[a]["best"] for a in p.arms}


def plan(p: DepthPlan, state: dict, placeholder: bool = False, states: dict | None = None) -> list[LM.TrainSpec]:
    """Every run known now, in order (module docstring): the grid runs of ``state`` (:func:`grid_state`) and of the
    own grids ``states`` (:func:`own_grid_states`), the depth runs of the arms whose best rate is decided, then the
    same-rate checks (:func:`rate_check_lrs`). ``placeholder``: also the undecided arms' depth runs, at
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
        return S.run_cpu_estimate(r, c, eval_tokens) + 1e-6 * n_blimp * c["eval_cpu_us_per_token"]

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
        name = S.size_name(size)
        if name in costs["sizes"]:
            extra = [S.make_spec(p, a, size, p.main_tpp, p.shared_lr, s, KAPPA_AT) for s in range(min(p.seeds))
                     for a in p.arms]
            cost = sum(S.run_cpu_estimate(r, costs["sizes"][name], eval_tokens) for r in extra)
            lines.append(f"[depth] not in the plan: {name} ({len(extra)} runs) would add {cost / 3600:.2f} core-h "
                         f"({cost / 7200:.2f} h on 2 cores)")
    recs = [(r, S.record_of(out, r)) for r in done]
    recs = [(r, x) for r, x in recs if x and "cpu_seconds" in x]
    if recs:
        ratio = sum(x["cpu_seconds"] for _, x in recs) / sum(est(r) for r, _ in recs)
        lines.append(f"[depth] the {len(recs)} finished runs took {ratio:.2f} × their estimate in CPU time")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def _kappa_layers(rec: dict, which: str) -> list | None:
    """Causal κ(J) per layer (mean over heads) at init (``which="init"``) or at the end of a record's run."""
    ks = rec.get("kappa") or []
    if not ks:
        return None
    m = ks[0] if which == "init" else ks[-1]
    if which == "end" and m["step"] != rec["spec"]["steps"]:
        return None
    return [la["mean"] for la in m["layers"]]


def load_runs(out: str, eval_name: str | None) -> dict:
    """(n_layer, tokens per param, lr) -> label -> seed -> summary of a finished record: ``loss`` (compared),
    ``ppl``, ``blimp`` (0-1 or None), ``kappa_init`` / ``kappa_end`` (causal, per layer), ``eval_curve``,
    ``steps``."""
    runs: dict = {}
    for root, _, files in os.walk(os.path.join(out, "runs")):
        for fn in sorted(files):
            if not fn.endswith(".json"):
                continue
            with open(os.path.join(root, fn)) as f:
                rec = json.load(f)
            spec = rec["spec"]
            loss = record_metric(rec, eval_name)
            runs.setdefault((spec["n_layer"], spec["tokens_per_param"], spec["lr"]), {}).setdefault(
                spec["extra"]["label"], {})[rec["seed"]] = dict(
                loss=loss, ppl=math.exp(loss) if loss < 700 else math.inf, blimp=C.blimp_accuracy(rec),
                kappa_init=_kappa_layers(rec, "init"), kappa_end=_kappa_layers(rec, "end"),
                eval_curve=rec["eval_curve"], steps=spec["steps"], n=rec["n_params_non_embedding"],
                n_all=rec["n_params"], tokens_seen=rec["tokens_seen"], cpu_seconds=rec.get("cpu_seconds"),
                device=rec.get("device"), batches=rec.get("train_batches_sha256"), source=out)
    return runs


def add_shared_seeds(runs: dict, shared: dict) -> int:
    """Complete this sweep's cells with the scale sweep's runs of the same shape, length, rate and arm (``shared``:
    :func:`_scale.load_cells` keyed like :func:`load_runs`) for the seeds this sweep lacks — only when every seed
    both have trained on identical batches (``train_batches_sha256``: the same run, recorded twice). Returns the
    number of runs added."""
    added = 0
    for key, cell in runs.items():
        for label, seeds in cell.items():
            other = shared.get(key, {}).get(label, {})
            both = set(seeds) & set(other)
            if not both or any(not seeds[s]["batches"] or seeds[s]["batches"] != other[s]["batches"] for s in both):
                continue
            for s in sorted(set(other) - set(seeds)):
                seeds[s] = other[s]
                added += 1
    return added


def _loss_by_lr(grid: dict) -> dict:
    """"lr" -> loss of a :func:`grid_state` arm's finished grid runs, ascending."""
    return {f"{lr:g}": v for lr, v in grid["values"].items() if v is not None}


def analyse(runs: dict, p: DepthPlan, state: dict, states: dict | None = None) -> dict:
    """Per depth and arm (at its own best rate): the runs, the paired gaps to default at its own best rate (loss
    and BLiMP), steps to default's final loss, κ per layer; the LR grid; the shared-rate comparisons."""
    best = {a: state[a]["best"] for a in p.arms}
    res: dict = dict(best_lr={a: b for a, b in best.items()}, depths={}, grid={}, shared_rate={},
                     own_grid={d: {a: dict(loss_by_lr=_loss_by_lr(st[a]), best_lr=st[a]["best"],
                                           decided=st[a]["decided"], tried=[f"{x:g}" for x in st[a]["tried"]])
                                   for a in p.arms} for d, st in (states or {}).items()})
    for depth in p.depths:
        rates = best_rates(p, state, states, depth)
        cells = {a: runs.get((depth, p.main_tpp, rates[a]), {}).get(a, {}) for a in p.arms if rates[a] is not None}
        dflt = cells.get("default", {})
        target = V.mean_std(r["eval_curve"][-1][1] for r in dflt.values())[0] if dflt else None
        row = {}
        for a, seeds in cells.items():
            if not seeds:
                continue
            g_loss_d = S.paired_gaps({a: seeds}, a, "loss", default=dflt)
            g_blimp_d = S.paired_gaps({a: seeds}, a, "blimp", default=dflt)
            g_loss, g_blimp = list(g_loss_d.values()), list(g_blimp_d.values())
            cross = ([C.crossing_step(r["eval_curve"], target) for r in seeds.values()] if target is not None
                     else [])
            reached = [c for c in cross if c is not None]
            k0 = [r["kappa_init"] for r in seeds.values() if r["kappa_init"]]
            k1 = [r["kappa_end"] for r in seeds.values() if r["kappa_end"]]
            row[a] = dict(
                lr=rates[a], seeds=sorted(seeds), ppl={s: r["ppl"] for s, r in sorted(seeds.items())},
                loss={s: r["loss"] for s, r in sorted(seeds.items())},
                blimp={s: r["blimp"] for s, r in sorted(seeds.items())}, steps=next(iter(seeds.values()))["steps"],
                n=next(iter(seeds.values()))["n"], n_all=next(iter(seeds.values()))["n_all"],
                tokens_seen=next(iter(seeds.values()))["tokens_seen"],
                devices=sorted({S._device_word(r["device"]) for r in seeds.values()}),
                from_scale_sweep=sorted(s for s, r in seeds.items() if r["source"] == p.shared_from),
                gap_loss=g_loss_d, gap_loss_ms=V.mean_std(g_loss), gap_blimp=g_blimp_d,
                gap_blimp_ms=V.mean_std(g_blimp), steps_to_default_final=cross,
                steps_to_default_final_mean=V.mean_std(reached)[0], n_reached=len(reached),
                eval_curves=[r["eval_curve"] for r in seeds.values()],
                kappa_init_layers=[statistics.fmean(x) for x in zip(*k0)] if k0 else None,
                kappa_end_layers=[statistics.fmean(x) for x in zip(*k1)] if k1 else None)
        if row:
            res["depths"][depth] = row
    for what in ("loss", "blimp"):  # one Holm family per column of the depth table
        verdicts = V.judge({(d, a): r[f"gap_{what}"] for d, row in res["depths"].items() for a, r in row.items()
                            if a != "default"}, higher_is_better=what == "blimp")
        for (d, a), v in verdicts.items():
            res["depths"][d][a][f"{what}_verdict"] = v
    res["same_rate"] = same_rate_check(runs, p, best)
    for a in p.arms:
        g = state[a]
        res["grid"][a] = dict(loss_by_lr=_loss_by_lr(g),
                              blimp_by_lr={f"{lr:g}": runs.get((p.grid_depth, p.grid_tpp, lr), {}).get(a, {})
                                           .get(0, {}).get("blimp") for lr, v in g["values"].items() if v is not None},
                              best_lr=best[a], decided=g["decided"], tried=[f"{x:g}" for x in g["tried"]],
                              extended=bool(g["extensions"]), at_ladder_end=g["at_edge"])
    # shared rate beside own rate: the grid (depth grid_depth, seed 0, grid_tpp)
    d_own = state["default"]["values"].get(best["default"]) if best["default"] else None
    d_sh = state["default"]["values"].get(p.shared_lr)
    for a in p.arms:
        if a == "default":
            continue
        own, sh = state[a]["values"].get(best[a]) if best[a] else None, state[a]["values"].get(p.shared_lr)
        res["shared_rate"].setdefault(f"{p.grid_depth}x{p.width}, {p.grid_tpp:g} tok/param (grid, seed 0)", {})[a] = dict(
            shared=None if sh is None or d_sh is None else sh - d_sh,
            own=None if own is None or d_own is None else own - d_own)
    return res


def same_rate_check(runs: dict, p: DepthPlan, best: dict) -> dict:
    """At ``rate_check_depth``, per arm whose best rate is not default's: its loss gap to default run at the *arm's*
    rate (paired by seed; verdict: ``_verdict.judge``, the table's own family), next to default's own-rate runs
    there."""
    depth = p.rate_check_depth
    if depth is None or best.get("default") is None:
        return {}
    out = {}
    for a in p.arms:
        if a == "default" or best[a] is None or best[a] == best["default"]:
            continue
        cell = runs.get((depth, p.main_tpp, best[a]), {})
        gaps = S.paired_gaps(cell, a)
        dflt = cell.get("default", {})
        own = runs.get((depth, p.main_tpp, best["default"]), {}).get("default", {})
        out[a] = dict(depth=depth, lr=best[a], default_lr=best["default"], seeds=sorted(gaps),
                      default_loss={s: dflt[s]["loss"] for s in gaps},
                      default_own_rate_loss={s: own[s]["loss"] for s in sorted(own)},
                      gap_loss=gaps, gap_loss_ms=V.mean_std(gaps.values()))
    verdicts = V.judge({a: r["gap_loss"] for a, r in out.items()})  # the same-rate table: its own family
    for a, v in verdicts.items():
        out[a]["verdict"] = v
    return out


def shared_rate_from_scale(p: DepthPlan, eval_name: str | None, own: dict) -> dict:
    """The scale sweep's depth-2 runs (``p.shared_from``) beside this sweep's: at ``grid_tpp`` its LR sweep (gap at
    the shared rate and at each arm's own best rate of that sweep, seeds 0-1); at ``main_tpp`` its shared-rate gap
    (seeds 0-2) next to this sweep's depth-2 gap at each arm's own rate (``own``: :func:`analyse`'s depth row)."""
    if not p.shared_from or not os.path.isdir(os.path.join(p.shared_from, "runs")):
        return {}
    cells = S.load_cells(p.shared_from, eval_name)
    name = S.size_name(p.size(2))
    out: dict = {}
    lr_cells = {k[2]: v for k, v in cells.items() if k[0] == name and k[1] == p.grid_tpp}
    if lr_cells:
        sweep = S.lr_sweep(lr_cells, p.arms)
        key = f"2x{p.width}, {p.grid_tpp:g} tok/param (scale sweep; shared: every seed, own: seeds of every rate)"
        for a in p.arms:
            if a == "default" or a not in sweep or "default" not in sweep:
                continue
            ba, bd = sweep[a]["best"], sweep["default"]["best"]
            sh = S.paired_gaps(lr_cells.get(p.shared_lr, {}), a).values()
            own_g = S.paired_gaps(lr_cells[ba], a, default=lr_cells[bd].get("default", {})).values()
            out.setdefault(key, {})[a] = dict(shared=V.mean_std(sh)[0], own=V.mean_std(own_g)[0], own_lr=ba,
                                              default_lr=bd)
    main = cells.get((name, p.main_tpp, p.shared_lr))
    if main:
        key = f"2x{p.width}, {p.main_tpp:g} tok/param (shared: scale sweep, seeds 0-2; own: this sweep)"
        for a in p.arms:
            if a == "default":
                continue
            g = list(S.paired_gaps(main, a).values())
            out.setdefault(key, {})[a] = dict(shared=V.mean_std(g)[0],
                                              own=(own.get(a) or {}).get("gap_loss_ms", (None,))[0])
    return out


def _k(x):
    """A condition number in 3 significant digits."""
    return f"{x:.3g}"


def _pts(x, sign=False):
    return "–" if x is None else (f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}")


def _best_text(g: dict) -> str:
    """A grid's best rate in a table (``g``: an arm of ``results["grid"]`` or ``results["own_grid"][depth]``)."""
    if g["best_lr"] is not None:
        return f"{g['best_lr']:g}"
    return "none: every rate diverged" if g.get("decided") else "not decided (grid unfinished)"


def markdown(res: dict, p: DepthPlan, eval_name: str | None, n_runs: int, n_planned: int, cpu: float) -> str:
    f = S._f
    metric = f"`{eval_name}`" if eval_name else "the internal held-out split"
    lines = [f"Metric: loss / perplexity on {metric} at the end of each run; BLiMP accuracy (%, EOS prefix); "
             "Δ = arm − default, both at their own best learning rate of the grid, paired by seed; mean ± std over "
             "seeds. '–': not finished (or recorded without BLiMP).\n"]
    lines.append(f"Learning-rate grid (depth {p.grid_depth} × {p.width}, {p.grid_tpp:g} tokens per parameter, seed 0; "
                 f"loss on {metric}; BLiMP % in brackets):\n")
    lrs = sorted({float(x) for g in res["grid"].values() for x in g["tried"]})
    lines.append("| arm | " + " | ".join(f"lr {x:g}" for x in lrs) + " | best lr |")
    lines.append("|---|" + "---|" * (len(lrs) + 1))
    for a, g in res["grid"].items():
        cells = []
        for x in lrs:
            v = g["loss_by_lr"].get(f"{x:g}")
            b = g["blimp_by_lr"].get(f"{x:g}")
            cells.append("–" if v is None else f"{f(v)}" + (f" ({_pts(b)})" if b is not None else ""))
        best = (_best_text(g) + (" (edge of the ladder)" if g["at_ladder_end"] else "")
                + (" (grid extended)" if g["extended"] else ""))
        lines.append(f"| {a} | " + " | ".join(cells) + f" | {best} |")
    lines.append("")
    if res["shared_rate"]:
        lines.append(f"Shared rate ({p.shared_lr:g}) beside each arm's own best rate: Δ loss to default (default "
                     "also at the shared / its own best rate):\n")
        lines.append("| setting | arm | Δ at shared lr | Δ at own best lr |")
        lines.append("|---|---|---|---|")
        for key, arms in res["shared_rate"].items():
            for a, v in arms.items():
                lines.append(f"| {key} | {a} | {f(v['shared'], sign=True)} | {f(v['own'], sign=True)} |")
        lines.append("")
    for d, grid in res.get("own_grid", {}).items():
        lrs = sorted({float(x) for g in grid.values() for x in g["tried"]})
        lines.append(f"Own LR grid at depth {d} ({p.main_tpp:g} tokens per non-embedding parameter, seed 0; loss on "
                     f"{metric}):\n")
        lines.append("| arm | " + " | ".join(f"lr {x:g}" for x in lrs) + " | best lr |")
        lines.append("|---|" + "---|" * (len(lrs) + 1))
        for a, g in grid.items():
            lines.append(f"| {a} | " + " | ".join(f(g["loss_by_lr"].get(f"{x:g}")) for x in lrs) + " | "
                         + _best_text(g) + " |")
        lines.append("")
    unsure = [d for d in p.depths if d != p.grid_depth and d not in res.get("own_grid", {})]
    lines.append(f"Across depth (width {p.width}, head dim {p.width // p.n_head}, {p.main_tpp:g} tokens per "
                 "non-embedding parameter, each arm at its own best rate of the grid at depth "
                 f"{p.grid_depth}"
                 + "".join(f", at depth {d} of its own grid there" for d in res.get("own_grid", {}))
                 + ("" if p.rate_check_depth not in unsure else
                    f"; at depth {p.rate_check_depth} the arms' own learning-rate grid is not complete yet (the "
                    f"same-rate check below; its own grid: `--grid-depths {p.rate_check_depth}`), so the "
                    f"depth-{p.rate_check_depth} verdicts are provisional")
                 + "; seeds marked * come from the scale sweep's records of the same run — identical batches, "
                 "checked):\n")
    lines.append("| depth | params (non-emb.) | tokens/param, all (non-emb.) | device | arm | lr | seeds "
                 "| ppl per seed "
                 "| Δ loss: mean [95 % CI] verdict | BLiMP % per seed | Δ BLiMP pts: mean [95 % CI] verdict "
                 "| steps to default's final loss (of total) | κ init (mean over layers) | κ end |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for depth, row in res["depths"].items():
        for a in [x for x in p.arms if x in row]:
            r = row[a]
            st = r["steps_to_default_final_mean"]
            k0 = r["kappa_init_layers"]
            k1 = r["kappa_end_layers"]
            seeds = ", ".join(f"{s}*" if s in r["from_scale_sweep"] else str(s) for s in r["seeds"])
            lines.append(
                f"| {depth} | {r['n_all']:,} ({r['n']:,}) | {r['tokens_seen'] / r['n_all']:.2f} ({p.main_tpp:g}) | "
                f"{', '.join(r['devices'])} | {a} | {r['lr']:g} | {len(r['seeds'])} ({seeds}) | "
                + " / ".join(f(x, 1) for x in r["ppl"].values()) + " | "
                + ("–" if a == "default" else V.fmt(r.get("loss_verdict"))) + " | "
                + " / ".join(_pts(x) for x in r["blimp"].values()) + " | "
                + ("–" if a == "default" else V.fmt(r.get("blimp_verdict"), 2, 100)) + " | "
                + ("not reached" if st is None else f"{st:.0f} ({r['n_reached']}/{len(r['seeds'])} seeds) of {r['steps']}")
                + f" | {_k(statistics.fmean(k0)) if k0 else '–'} | {_k(statistics.fmean(k1)) if k1 else '–'} |")
    lines.append("")
    fam = {w: len([1 for row in res["depths"].values() for a, r in row.items()
                   if a != "default" and r.get(f"{w}_verdict", {}).get("n", 0) >= 2]) for w in ("loss", "blimp")}
    lines.append(V.family_caption("this table's Δ loss cells (every depth and arm)", fam["loss"])
                 + f" The Δ BLiMP column is its own family of {fam['blimp']} cells.")
    for depth, row in res["depths"].items():
        d = row.get("default")
        if d:
            lines.append(f"- depth {depth}: " + V.flat_sentence(V.flat_curve(d["eval_curves"], d["steps"])))
    lines.append("")
    if res.get("same_rate"):
        lines.append("Same-rate check: at depth %d each arm whose best rate is not default's against default run at the "
                     "*arm's* rate (paired by seed):\n" % p.rate_check_depth)
        lines.append("| depth | arm | lr (both) | seeds | default loss at this lr / at its own lr (per seed) "
                     "| Δ loss: mean [95 % CI] verdict |")
        lines.append("|---|---|---|---|---|---|")
        for a, r in res["same_rate"].items():
            d_here = " / ".join(f(x) for x in r["default_loss"].values()) or "–"
            d_own = " / ".join(f(x) for x in r["default_own_rate_loss"].values()) or "–"
            lines.append(f"| {r['depth']} | {a} | {r['lr']:g} | {len(r['seeds'])} | {d_here} (own {r['default_lr']:g}: "
                         f"{d_own}) | {V.fmt(r['verdict'])} |")
        lines.append("")
        lines.append(V.family_caption("this table's rows", len([r for r in res["same_rate"].values()
                                                                 if r["verdict"]["n"] >= 2])))
        lines.append("")
    lines.append("κ(J) per layer (causal, mean over heads and seeds; init → end):\n")
    lines.append("| depth | arm | κ per layer at init | κ per layer at the end |")
    lines.append("|---|---|---|---|")
    for depth, row in res["depths"].items():
        for a in [x for x in p.arms if x in row]:
            k0, k1 = row[a]["kappa_init_layers"], row[a]["kappa_end_layers"]
            lines.append(f"| {depth} | {a} | " + (" / ".join(_k(x) for x in k0) if k0 else "–") + " | "
                         + (" / ".join(_k(x) for x in k1) if k1 else "–") + " |")
    lines.append("")
    lines.append(f"{n_runs} finished runs of {n_planned} planned ({cpu:.0f} core-s = {cpu / 3600:.2f} core-h of CPU "
                 "time).")
    return "\n".join(lines) + "\n"


def plots(res: dict, p: DepthPlan, out: str) -> list[str]:
    """``gap_vs_depth.png`` (Δ loss and Δ BLiMP against depth per arm: each seed a dot, mean ± std a bar; the
    same-rate checks as open markers),
    ``lr_curves.png`` (grid loss against learning rate per arm, best marked) and ``kappa_vs_depth.png`` (causal κ(J),
    mean over layers and seeds, at init (dashed) and at the end (solid), against depth per arm)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    arms = [a for a in p.arms if a != "default"]

    def save(fig, name):
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110)
        written.append(path)

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    for j, (key, ylabel, scale) in enumerate((("gap_loss", "Δ loss vs default (paired by seed)", 1.0),
                                              ("gap_blimp", "Δ BLiMP accuracy vs default (points)", 100.0))):
        ax = fig.add_subplot(1, 2, j + 1)
        for i, a in enumerate(arms):
            xs, ms, ss = [], [], []
            for depth, row in res["depths"].items():
                g = row.get(a, {}).get(key)
                vals = list(g.values()) if isinstance(g, dict) else (g or [])
                if not vals:
                    continue
                dx = depth * (1 + 0.03 * (i - len(arms) / 2))
                ax.plot([dx] * len(vals), [scale * v for v in vals], ".", color=f"C{i}", alpha=0.5)
                m, s = V.mean_std(vals)
                xs.append(dx), ms.append(scale * m), ss.append(scale * s)
            if xs:
                ax.errorbar(xs, ms, yerr=ss, fmt="o-", color=f"C{i}", capsize=3, label=a)
            same = res.get("same_rate", {}).get(a)
            if key == "gap_loss" and same and same["gap_loss"]:
                vals = list(same["gap_loss"].values())
                m, s = V.mean_std(vals)
                dx = same["depth"] * (1 + 0.03 * (i - len(arms) / 2 + 0.5))
                ax.errorbar([dx], [m], yerr=[s], fmt="o", mfc="white", color=f"C{i}", capsize=3,
                            label=f"{a} vs default, both at lr {same['lr']:g}")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(p.depths), [str(d) for d in p.depths])
        ax.set(xlabel=f"depth (width {p.width}, {p.main_tpp:g} tokens/param, own best lr)", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    save(fig, "gap_vs_depth.png")

    fig = Figure(figsize=(7, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, a in enumerate(p.arms):
        g = res["grid"][a]
        pts = sorted((float(x), v) for x, v in g["loss_by_lr"].items() if math.isfinite(v))
        if pts:
            ax.plot([x for x, _ in pts], [v for _, v in pts], "o-", color=f"C{i}", label=a)
        if g["best_lr"] is not None and math.isfinite(g["loss_by_lr"][f"{g['best_lr']:g}"]):
            ax.plot([g["best_lr"]], [g["loss_by_lr"][f"{g['best_lr']:g}"]], "*", ms=14, color=f"C{i}")
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="loss (WikiText-2 valid)",
           title=f"LR grid: depth {p.grid_depth} × {p.width}, {p.grid_tpp:g} tokens/param, seed 0 (★ best)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save(fig, "lr_curves.png")

    fig = Figure(figsize=(7, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, a in enumerate(p.arms):
        for key, ls, tag in (("kappa_init_layers", "--", "init"), ("kappa_end_layers", "-", "end")):
            pts = [(d, statistics.fmean(row[a][key])) for d, row in res["depths"].items()
                   if a in row and row[a][key]]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o" + ls, color=f"C{i}", label=f"{a} ({tag})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(p.depths), [str(d) for d in p.depths])
    ax.set(xlabel="depth", ylabel="κ(J), causal, mean over layers and seeds",
           title="attention-Jacobian condition number at init (dashed) and at the end (solid)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    save(fig, "kappa_vs_depth.png")
    return written


def collect(out: str, p: DepthPlan, eval_name: str | None) -> tuple[dict, str]:
    """Read only: ``(results, markdown)`` of the finished records under ``out``/runs, with the scale sweep's runs
    of the same shape (``add_shared_seeds``); ``results`` is what ``results.json`` holds."""
    if not os.path.isdir(os.path.join(out, "runs")):
        fail(f"no finished runs under {os.path.join(out, 'runs')}; run without --report-only first")
    if eval_name is None:  # --report-only without --eval-file: the file the runs were evaluated on
        names = sorted({n for root, _, fs in os.walk(os.path.join(out, "runs")) for fn in fs if fn.endswith(".json")
                        for n in json.load(open(os.path.join(root, fn))).get("eval_files", {})})
        eval_name = names[0] if names else None
    runs = load_runs(out, eval_name)
    if p.shared_from and os.path.isdir(os.path.join(p.shared_from, "runs")):
        shared = {}
        for (size, tpp, lr), cell in S.load_cells(p.shared_from, eval_name).items():
            depth, width = map(int, size.split("x"))
            if width != p.width:
                continue
            for label, seeds in cell.items():
                shared.setdefault((depth, tpp, lr), {})[label] = {
                    s: dict(r, kappa_init=None, kappa_end=None, source=p.shared_from) for s, r in seeds.items()}
        add_shared_seeds(runs, shared)
    state = grid_state(out, p, eval_name)
    states = own_grid_states(out, p, eval_name)
    res = analyse(runs, p, state, states)
    res["shared_rate"].update(shared_rate_from_scale(p, eval_name, res["depths"].get(2, {})))
    recs = [r for c in runs.values() for s in c.values() for r in s.values() if r["source"] == out]
    cpu = sum(r["cpu_seconds"] or 0 for r in recs)
    results = dict(metric=eval_name or "internal held-out split", n_runs=len(recs), cpu_seconds=cpu,
                   plan=dict(width=p.width, n_head=p.n_head, depths=p.depths, seeds=p.seeds, main_tpp=p.main_tpp,
                             grid_depth=p.grid_depth, grid_tpp=p.grid_tpp, grid_lrs=p.grid_lrs, ladder=p.ladder,
                             shared_lr=p.shared_lr, arms=p.arms, dropped=p.dropped,
                             rate_check_depth=p.rate_check_depth, own_grid_depths=p.own_grid_depths), **res)
    return results, markdown(res, p, eval_name, len(recs), len(plan(p, state, placeholder=True, states=states)), cpu)


def report(out: str, p: DepthPlan, eval_name: str | None, copy_plots: str | None = None) -> dict:
    results, text = collect(out, p, eval_name)
    C.write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    written = plots(results, p, out)
    if copy_plots:
        import shutil

        os.makedirs(copy_plots, exist_ok=True)
        for path in written:
            shutil.copy(path, os.path.join(copy_plots, "depth_" + os.path.basename(path)))
    results["plots"] = written
    return results


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    """``compare.py --depth-sweep`` (after ``_scale.check_fixed`` and compare.py's checks): estimate, then train
    what is decided and unfinished, re-planning after every pass (the grid decides each arm's rate), report."""
    p = QUICK if args.quick else FULL
    if args.grid_depths:
        if not set(args.grid_depths) <= set(p.depths):
            fail(f"--grid-depths {' '.join(map(str, args.grid_depths))}: choose from {' '.join(map(str, p.depths))}")
        p = dataclasses.replace(p, own_grid_depths=tuple(sorted(set(args.grid_depths))))
    out = args.out or os.path.join(C.REPO_ROOT, "benchmarks", "results", "depth_quick" if args.quick else "depth")
    eval_files = args.eval_file or [S.WIKI_VALID]
    eval_name = os.path.basename(os.path.normpath(eval_files[0]))
    if args.report_only:
        return report(out, p, eval_name if args.eval_file else None, args.copy_plots)
    mine = set(args.depths or p.depths)
    if not mine <= set(p.depths):
        fail(f"--depths {' '.join(map(str, sorted(mine - set(p.depths))))}: not in the plan; choose from "
             f"{' '.join(map(str, p.depths))}")
    arms = set(args.train_arms or p.arms)
    if not arms <= set(p.arms):
        fail(f"--train-arms {' '.join(sorted(arms - set(p.arms)))}: not an arm of the plan; choose from "
             f"{' '.join(p.arms)}")
    blimp = C.blimp_dir_for(args, "depth")
    data, eval_sets, eval_info = S.prepare_sweep(args, p, out, eval_files, "--depth-sweep")
    state = grid_state(out, p, eval_name)
    full = plan(p, state, placeholder=True, states=own_grid_states(out, p, eval_name))
    done = [r for r in full if S.record_of(out, r) is not None]
    costs = S.load_costs(out, p, p.sizes + list(p.dropped))
    for line in estimate_lines(p, out, full, done, costs, sum(i["evaluated_tokens"] for i in eval_info.values()),
                               blimp_tokens(data.tokenizer, blimp)):
        print(line, file=sys.stderr)
    print(f"[depth] training data: {data.info['train_tokens']:,} tokens; output {out}; BLiMP: {blimp or 'off'}",
          file=sys.stderr)
    paths = lambda r: S.record_paths(out, r)  # noqa: E731
    while True:
        state = grid_state(out, p, eval_name)
        states = own_grid_states(out, p, eval_name)
        runs = plan(p, state, states=states)
        C.add_missing_blimp([paths(r) for r in runs if S.record_of(out, r) is not None], data.tokenizer, blimp,
                            "depth", data)
        todo = [r for r in runs if r.n_layer in mine and r.extra["label"] in arms and S.record_of(out, r) is None
                and not C.claimed_elsewhere(paths(r)[0])]
        if todo:
            LM.execute_runs(runs, todo, data, eval_sets, eval_info, paths, blimp)
            continue
        undecided = [a for a in p.arms if not state[a]["decided"]] + [
            f"{a} at depth {d}" for d, st in states.items() for a in p.arms if not st[a]["decided"]]
        if not undecided or not any(C.claimed_elsewhere(paths(r)[0]) for r in runs):
            break
        print(f"[depth] waiting for another worker's grid runs ({', '.join(undecided)}); polling every "
              f"{POLL_SECONDS} s", file=sys.stderr)
        time.sleep(POLL_SECONDS)
    left = [r for r in plan(p, grid_state(out, p, eval_name), states=own_grid_states(out, p, eval_name))
            if S.record_of(out, r) is None]
    if left:
        print(f"[depth] {len(left)} runs are left to other workers (or other --depths); run --report-only when they "
              "are finished", file=sys.stderr)
    if args.no_report:
        return {}
    return report(out, p, eval_name, args.copy_plots)
