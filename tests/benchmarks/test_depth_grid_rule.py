"""One learning-rate grid rule, :func:`hf_condinit.study.plan.choose_rate`, for the study and for
``benchmarks/compare.py --depth-sweep``. Checked against the two rules it replaced, kept here as the references
(copied from the code before the change): the depth sweep's ladder loop and the study's geometric extension; and on
the committed depth-sweep records (a read-only copy), which must give the same best rates and the same plan."""

import math
import os
import random
import shutil

import pytest

from hf_condinit.study.plan import choose_rate, geometric_extension, ladder_extension
from utils import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPTH_RECORDS = os.path.join(REPO, "benchmarks", "results", "depth")
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)


def _depth():
    """``benchmarks/_depth_plan.py`` (on sys.path once compare.py is loaded)."""
    load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _depth_plan

    return _depth_plan


def ladder_reference(grid_lrs, loss_of, ladder):
    """``benchmarks/_depth.py``'s grid_state loop before (one arm): ``loss_of(lr)`` -> loss (inf
    for a diverged run) or None (unfinished)."""
    lrs = list(grid_lrs)
    while True:
        loss = {lr: loss_of(lr) for lr in lrs if loss_of(lr) is not None}
        best = min(loss, key=loss.get) if len(loss) == len(lrs) else None
        i = None if best is None else ladder.index(best)
        if best is not None and best == lrs[0] and i > 0:
            lrs.insert(0, ladder[i - 1])
        elif best is not None and best == lrs[-1] and i < len(ladder) - 1:
            lrs.append(ladder[i + 1])
        else:
            break
    return dict(lrs=lrs, loss=loss, best=best, at_ladder_end=best is not None and best in (ladder[0], ladder[-1]))


def geometric_reference(lrs, outcome, lr_extend):
    """``hf_condinit.study.plan.arm_rates`` before (``outcome(lr)``)."""
    def step(lo, hi, outward):
        ratio = hi / lo
        return float(f"{(outward / ratio if outward == lo else outward * ratio):.3g}")

    tried, extensions = sorted(lrs), []
    while True:
        values = {lr: outcome(lr) for lr in tried}
        if any(v is None for v in values.values()):
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=False, at_edge=False)
        best = min(tried, key=lambda lr: values[lr])
        if values[best] == float("inf"):
            return dict(tried=tried, extensions=extensions, values=values, best=None, decided=True, at_edge=False)
        edge = best in (tried[0], tried[-1])
        if not edge or len(extensions) >= lr_extend:
            return dict(tried=tried, extensions=extensions, values=values, best=best, decided=True, at_edge=edge)
        new = step(tried[0], tried[1], best) if best == tried[0] else step(tried[-2], tried[-1], best)
        extensions.append(new)
        tried = sorted([*tried, new])


def _random_outcomes(rng, rates, p_missing):
    """rate -> loss: a few distinct values (ties happen), some diverged (inf), some unfinished (absent)."""
    table = {}
    for lr in rates:
        u = rng.random()
        if u < p_missing:
            continue
        table[lr] = math.inf if u < p_missing + 0.1 else rng.choice([4.0, 4.1, 4.2, 4.3, 4.5])
    return table


@pytest.mark.parametrize("grid", [(1e-3, 3e-3, 1e-2, 3e-2), (3e-3, 1e-2), (1e-4, 3e-4), (1e-1, 3e-1)])
def test_ladder_rule_is_the_depth_sweeps(grid):
    """Every outcome table the depth sweep can meet: the same rates needed, best and end-of-ladder flag; the one
    difference by design: when every rate diverged the grid is decided without a best (the old loop took the
    lowest diverged rate and walked down the ladder)."""
    rng = random.Random(hash(grid) % 1000)
    checked = 0
    for _ in range(3000):
        table = _random_outcomes(rng, LADDER, p_missing=rng.choice([0.0, 0.1, 0.3]))
        new = choose_rate(grid, table.get, ladder_extension(LADDER))
        old = ladder_reference(grid, table.get, LADDER)
        if all(table.get(lr) == math.inf for lr in new["tried"]):
            assert new["decided"] and new["best"] is None and not new["at_edge"]
            continue
        assert new["tried"] == old["lrs"] and new["best"] == old["best"]
        assert new["at_edge"] == old["at_ladder_end"] and new["decided"] == (old["best"] is not None)
        assert {lr: v for lr, v in new["values"].items() if v is not None} == old["loss"]
        checked += 1
    assert checked > 2000


def test_geometric_rule_is_the_studys():
    rng = random.Random(0)
    for _ in range(2000):
        lrs = sorted(rng.sample([1e-4, 3e-4, 1e-3, 3e-3, 1e-2], rng.choice([2, 3])))
        values = {}

        def outcome(lr):  # a loss for any rate asked, drawn once (so both rules see the same table)
            if lr not in values:
                u = rng.random()
                values[lr] = None if u < 0.1 else math.inf if u < 0.2 else rng.choice([4.0, 4.1, 4.2, 4.3])
            return values[lr]

        extend = rng.choice([0, 1, 2])
        assert choose_rate(lrs, outcome, geometric_extension(extend)) == geometric_reference(lrs, outcome, extend)


def test_a_fixed_grid_and_failures():
    """No extension: the best of the rates given, a bound when at an edge; NaN counts as failed; ties: lower."""
    r = choose_rate([1e-2, 1e-3, 3e-3], {1e-3: 4.0, 3e-3: 4.0, 1e-2: float("nan")}.get)
    assert r["best"] == 1e-3 and r["at_edge"] and r["values"][1e-2] == math.inf and r["extensions"] == []
    r = choose_rate([1e-3, 3e-3], {1e-3: 4.0}.get)
    assert not r["decided"] and r["best"] is None and r["values"] == {1e-3: 4.0, 3e-3: None}


def test_every_rate_diverged_is_decided_without_runs_at_a_rate(tmp_path):
    """The depth sweep: an arm whose whole grid diverged plans no depth runs and its table says so."""
    D = _depth()
    p = D.QUICK
    label = p.arms[1]
    for lr in p.grid_lrs:
        spec = D.grid_spec(p, label, lr)
        D.C.write_json(D.SP.record_paths(str(tmp_path), spec)[0],
                       dict(key=spec.key(), spec={}, final_eval_loss=math.nan, eval_files={"v": dict(loss=math.nan)}))
    st = D.grid_state(str(tmp_path), p, "v")
    assert st[label]["decided"] and st[label]["best"] is None and st[label]["tried"] == list(p.grid_lrs)
    assert not any(r.extra["label"] == label and r.tokens_per_param == p.main_tpp for r in D.plan(p, st))
    g = dict(best_lr=None, decided=True)
    import _depth_report as DR

    assert DR._best_text(g) == "none: every rate diverged"
    assert DR._best_text(dict(g, decided=False)) == "not decided (grid unfinished)"


def _copy_committed_records(tmp_path) -> str:
    """A copy of the committed depth-sweep records (``runs/**.json``) under ``tmp_path``; returns that folder."""
    src = os.path.join(DEPTH_RECORDS, "runs")
    for root, _, files in os.walk(src):
        for fn in files:
            if fn.endswith(".json"):
                dst = tmp_path / "runs" / os.path.relpath(root, src)
                dst.mkdir(parents=True, exist_ok=True)
                shutil.copy(os.path.join(root, fn), dst)
    return str(tmp_path)


def test_committed_depth_records_give_the_same_rates_and_plan(tmp_path):
    """The committed records of benchmarks/results/depth (copied, read only): each arm's best rate and the whole
    plan (with and without the own grid at depth 8) are what the old ladder loop gives; the depth-4 grid's rates are
    the ones README's depth findings rest on."""
    import dataclasses
    import json

    D = _depth()
    out = _copy_committed_records(tmp_path)
    metric = "wiki.valid.raw"

    def loss_of(p, label, depth):
        def loss(lr):
            spec = D.grid_spec(p, label, lr, depth)
            path = os.path.join(out, "runs", spec.setting, label, f"seed{spec.seed}.json")
            if not os.path.exists(path):
                return None
            with open(path) as f:
                rec = json.load(f)
            if rec["key"] != spec.key():
                return None
            value = rec["eval_files"][metric]["loss"]
            return value if math.isfinite(value) else math.inf

        return loss

    def as_state(ref):
        return dict(tried=ref["lrs"], best=ref["best"], decided=ref["best"] is not None)

    for own in ((), (8,)):
        p = dataclasses.replace(D.FULL, own_grid_depths=own)
        state, states = D.grid_state(out, p, metric), D.own_grid_states(out, p, metric)
        ref = {a: ladder_reference(p.grid_lrs, loss_of(p, a, None), p.ladder) for a in p.arms}
        refs = {d: {a: ladder_reference(p.grid_lrs, loss_of(p, a, d), p.ladder) for a in p.arms} for d in own}
        for a in p.arms:
            assert (state[a]["tried"], state[a]["best"], state[a]["at_edge"]) == (
                ref[a]["lrs"], ref[a]["best"], ref[a]["at_ladder_end"])
            for d in own:
                assert (states[d][a]["tried"], states[d][a]["best"]) == (refs[d][a]["lrs"], refs[d][a]["best"])
        old_plan = D.plan(p, {a: as_state(r) for a, r in ref.items()},
                          states={d: {a: as_state(r) for a, r in x.items()} for d, x in refs.items()})
        assert [r.key() for r in D.plan(p, state, states=states)] == [r.key() for r in old_plan]
        if not own:
            assert D.best_rates(p, state, {}, 4) == {"default": 3e-3, "conditioned": 1e-2, "conditioned_v0.25": 3e-3,
                                                    "mimetic": 3e-3, "affine_scaled": 3e-3}
            assert len(old_plan) == 75  # grid 20, depth runs 2 × 5 + 3 × 5 + 5 × 5, default at 1e-2 at depth 8: 5


def test_the_plan_is_finished_only_once_every_run_is_recorded(tmp_path):
    """``_depth_plan.plan_finished`` (what switches the findings to the depth-8 own grid, no longer provisional): on the
    committed records plus planted records for whatever the plan still lacks (a loss curve with its minimum at 1e-2,
    inside the grid), it turns true exactly when the last planned run is recorded, and false again when a depth-8
    seed's record goes."""
    import dataclasses

    D = _depth()
    out = _copy_committed_records(tmp_path)
    metric = "wiki.valid.raw"
    p = dataclasses.replace(D.FULL, own_grid_depths=(8,))

    def missing():
        state, states = D.grid_state(out, p, metric), D.own_grid_states(out, p, metric)
        return [r for r in D.plan(p, state, states=states) if D.SP.record_of(out, r) is None]

    for _ in range(10):  # planting decides the open grids, which then plan their seeds
        todo = missing()
        if not todo:
            break
        assert not D.plan_finished(out, p, metric)
        for spec in todo:
            loss = 4.5 + (math.log10(spec.lr) + 2) ** 2 + 0.001 * spec.seed
            D.C.write_json(D.SP.record_paths(out, spec)[0],
                           dict(key=spec.key(), spec={}, final_eval_loss=loss, eval_files={metric: dict(loss=loss)}))
    assert not missing() and D.plan_finished(out, p, metric)
    state, states = D.grid_state(out, p, metric), D.own_grid_states(out, p, metric)
    seed4 = [r for r in D.plan(p, state, states=states) if r.n_layer == 8 and r.seed == 4]
    os.remove(D.SP.record_paths(out, seed4[-1])[0])  # one depth-8 seed less: not finished
    assert not D.plan_finished(out, p, metric)


def test_a_device_matched_baseline_pairs_the_runs_made_on_another_device(tmp_path, monkeypatch):
    """Default's depth-8 seeds 0-2 at 1e-2 ran on an H200, mimetic's on the CPU, so they paired at seeds 3-4 only.
    With the own grid at depth 8 the plan adds ``default@cpu`` there for seeds 0-2 (bound to the CPU: a GPU worker
    leaves them); once recorded (the committed ones removed from the copy, then planted: default's own records, moved to
    the CPU and shifted), mimetic pairs at every seed with a CPU run of default, and conditioned's H200 seeds still pair
    with default's own H200 runs."""
    import dataclasses
    import json

    D = _depth()
    import _depth_report as DR

    out = _copy_committed_records(tmp_path)
    shutil.rmtree(os.path.join(out, "runs", "8x64_tpp20_lr0.01", "default@cpu"), ignore_errors=True)  # as before them
    metric = "wiki.valid.raw"
    p = dataclasses.replace(D.FULL, own_grid_depths=(8,))
    state, states = D.grid_state(out, p, metric), D.own_grid_states(out, p, metric)
    matched = [r for r in D.plan(p, state, states=states) if r.extra["label"] == "default@cpu"]
    assert [(r.n_layer, r.lr, r.seed, D.SP.arm_of(r)) for r in matched] == [(8, 1e-2, s, "default") for s in (0, 1, 2)]
    assert not any(D.SP.arm_of(r) != r.extra["label"] for r in D.plan(D.FULL, state))  # an own-grid depth's only
    for device, here in (("cuda", False), ("cpu", True)):
        monkeypatch.setattr(D.C, "TRAIN_DEVICE", device)
        assert all(D.SP.trains_here(r) is here for r in matched)

    def verdict(arm):
        res = DR.analyse(DR.load_runs(out, metric), p, state, states)
        return res["depths"][8][arm]["gap_loss"], res.get("matched_baselines", {})

    mimetic_before, _ = verdict("mimetic")
    conditioned_before, _ = verdict("conditioned")
    shift = 0.01
    for spec in matched:
        with open(os.path.join(out, "runs", spec.setting, "default", f"seed{spec.seed}.json")) as f:
            rec = json.load(f)
        assert rec["device"].startswith("cuda")
        rec["eval_files"][metric]["loss"] += shift
        D.C.write_json(D.SP.record_paths(out, spec)[0], dict(rec, key=spec.key(), device="cpu",
                                                              spec=dataclasses.asdict(spec)))
    assert all(D.SP.record_of(out, r) is not None for r in matched)
    mimetic, shown = verdict("mimetic")
    conditioned, _ = verdict("conditioned")
    assert sorted(mimetic_before) == [3, 4] and sorted(mimetic) == [0, 1, 2, 3, 4]
    for s in (3, 4):
        assert mimetic[s] == mimetic_before[s]  # default's own CPU runs
    runs = DR.load_runs(out, metric)[(8, p.main_tpp, 1e-2)]
    for s in (0, 1, 2):
        assert mimetic[s] == pytest.approx(runs["mimetic"][s]["loss"] - runs["default"][s]["loss"] - shift)
    assert conditioned == conditioned_before and sorted(conditioned) == [0, 1, 2, 3, 4]
    assert list(shown["8@cpu"]["loss"]) == [0, 1, 2]
