"""``benchmarks/compare.py --depth-sweep``: does an init's gap to default shrink, flip or grow with depth, each arm
at its own best learning rate?

The scale sweep (``_scale.py``) varied width at depth 2; this mode varies depth at width 64 (head dim 32, 2 heads)
with the same data, tokenizer, batch, block, evaluation and arms (:data:`_scale_plan.ARMS`), and records per run the
WikiText-2 valid loss / perplexity (``--eval-file``), BLiMP accuracy (``--blimp-dir``,
``_lm_zero_shot.evaluate_blimp``), the eval curve (steps to default's final loss) and κ(J) of every layer at init and
at the end (causal and unmasked, ``ConditionNumberCallback``).

Plan (``_depth_plan``: :data:`_depth_plan.FULL`, :func:`_depth_plan.plan`), in this order:

1. **LR grid** at depth ``grid_depth`` (4), seed 0, ``grid_tpp`` (5) tokens per non-embedding parameter, every arm
   at the half-decade rates ``grid_lrs`` (1e-3, 3e-3, 1e-2, 3e-2). When an arm's best rate (lowest WikiText-2 valid
   loss) is the lowest or the highest it was tried at, the next half-decade of :attr:`DepthPlan.ladder` beyond it is
   added for that arm (:func:`grid_state`), until its best is inside or the ladder ends (said in the report).
2. **Depth sweep**: depths ``depths`` (2, 4, 8) × arms × seeds ``seeds``
   at ``main_tpp`` (20) tokens per parameter, each arm at *its own* best rate of the grid; seed 0 of every depth
   first (shallowest first, default first), then seed 1, and so on. An arm's depth runs enter the plan when its
   grid is decided, so a worker never waits while there is a decided run to do.
3. **Same-rate check** at depth ``rate_check_depth`` (8): default also at every other arm's best rate (same seeds),
   so that an arm's gap there can be read at one rate for both (is a win the init, or only the rate the grid gave
   it at depth 4?).

8 × 96 (``dropped``) is not in the plan: its estimate is printed next to the plan's and exceeds the 5-hour budget on
its own.

Shared-rate results beside the own-rate ones, where both exist: at ``grid_tpp`` the grid's
``shared_lr`` column (depth 4, seed 0) and the scale sweep's LR sweep at 2 × 64 (seeds 0-1); at ``main_tpp`` the
scale sweep's 2 × 64 runs at its shared rate (seeds 0-2), read from ``benchmarks/results/scale`` (``shared_from``).

Resumable and shared like the scale sweep (``_lm_run.execute_runs``: one record per finished run, lock files, any
number of workers on one ``--out``; default ``benchmarks/results/depth``); a worker whose remaining runs wait on
another worker's grid run polls every 30 s. Cost: ``cost.json`` per size (``_scale_plan.measure_cost``), the estimate
printed before training (training, evaluation and BLiMP forward tokens; κ and the Trainer's overhead not included).

    python benchmarks/compare.py --depth-sweep --threads 1                  # full mode (two workers: README)
    python benchmarks/compare.py --depth-sweep --quick --out /tmp/depth_q   # tiny sizes, a few steps
    python benchmarks/compare.py --depth-sweep --report-only                # tables / plots from finished runs
    python benchmarks/compare.py --depth-sweep --depths 8 --device cuda     # one machine's share: depth 8 on a GPU
    python benchmarks/compare.py --depth-sweep --grid-depths 8 --depths 8 --device cuda   # + an own LR grid at depth 8
    python benchmarks/compare.py --depth-sweep --depths 8 --train-arms default conditioned   # the headline's runs first
    python benchmarks/compare.py --depth-sweep --grid-depths 8 --depths 8 --train-seeds 3 4   # these seeds' runs first

``--grid-depths D``: an own LR grid at depth D (:attr:`DepthPlan.own_grid_depths`: every arm at ``grid_lrs`` at
``main_tpp``, seed 0, extended along the ladder like the depth-4 grid); the arms' runs at depth D then use that
grid's best rate, so a comparison there is at each arm's own best rate *at that depth*. A pair needs one device
(``hf_condinit.stats.paired``): at an own-grid depth, :attr:`DepthPlan.matched_baselines` re-runs default at its rate
there on another device for the seeds whose first runs were made elsewhere (``default@cpu``: default's depth-8 seeds
0-2 at 1e-2 ran on an H200, the other arms' runs on the CPU); only a worker on that device trains them, and an arm's
run pairs with default's run on its own device (``_depth_report.baseline_for``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import _common as C
import _lm_run as LM
import _lm_zero_shot as ZS
import _scale as S
import _scale_plan as SP
from _common import fail
from _depth_plan import FULL, QUICK, blimp_tokens, estimate_lines, grid_state, own_grid_states, plan
from _depth_report import report

POLL_SECONDS = 30


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
    seeds = set(range(max(p.seeds))) if args.train_seeds is None else set(args.train_seeds)
    if not seeds <= set(range(max(p.seeds))):
        fail(f"--train-seeds {' '.join(map(str, sorted(seeds - set(range(max(p.seeds))))))}: not a seed of the plan; "
             f"choose from {' '.join(map(str, range(max(p.seeds))))}")
    blimp = ZS.blimp_dir_for(args, "depth")
    data, eval_sets, eval_info = S.prepare_sweep(args, p, out, eval_files, "--depth-sweep")
    state = grid_state(out, p, eval_name)
    full = plan(p, state, placeholder=True, states=own_grid_states(out, p, eval_name))
    done = [r for r in full if SP.record_of(out, r) is not None]
    costs = SP.load_costs(out, p, p.sizes + list(p.dropped))
    for line in estimate_lines(p, out, full, done, costs, sum(i["evaluated_tokens"] for i in eval_info.values()),
                               blimp_tokens(data.tokenizer, blimp)):
        print(line, file=sys.stderr)
    print(f"[depth] training data: {data.info['train_tokens']:,} tokens; output {out}; BLiMP: {blimp or 'off'}",
          file=sys.stderr)
    paths = lambda r: SP.record_paths(out, r)  # noqa: E731
    while True:
        state = grid_state(out, p, eval_name)
        states = own_grid_states(out, p, eval_name)
        runs = plan(p, state, states=states)
        ZS.add_missing_blimp([paths(r) for r in runs if SP.record_of(out, r) is not None], data.tokenizer, blimp,
                            "depth", data)
        todo = [r for r in runs if r.n_layer in mine and SP.arm_of(r) in arms and r.seed in seeds and SP.trains_here(r)
                and SP.record_of(out, r) is None and not C.claimed_elsewhere(paths(r)[0])]
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
            if SP.record_of(out, r) is None]
    if left:
        print(f"[depth] {len(left)} runs are left to other workers (or to other --depths, --train-arms, --train-seeds);"
              " run --report-only when they are finished", file=sys.stderr)
    if args.no_report:
        return {}
    return report(out, p, eval_name, args.copy_plots)
