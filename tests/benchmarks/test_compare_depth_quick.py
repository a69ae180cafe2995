"""``benchmarks/compare.py --depth-sweep``: the full plan, the LR grid's extension and decision rule on
hand-written records, and ``--quick`` end to end (tiny sizes, a few steps, BLiMP on a small subset; resumable)."""

import json
import math
import os
import shutil

import pytest

from test_compare_quick import assert_blimp_matches, blimp_subset
from utils import WIKI_TRAIN, WIKI_VALID, load_script


def _modules():
    """``(compare, _depth_plan)``; ``benchmarks/`` is on sys.path once compare.py is loaded (``_depth_report``
    then imports as well)."""
    compare = load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _depth_plan

    return compare, _depth_plan


def _non_embedding(n_layer, n_embd):
    # GPT-2 block: attention 4 D^2 + 4 D, MLP 8 D^2 + 5 D, two LayerNorms 4 D; final LayerNorm 2 D
    return 12 * n_layer * n_embd ** 2 + 13 * n_layer * n_embd + 2 * n_embd


def _decided(D, p, best):
    return {a: dict(tried=list(p.grid_lrs), extensions=[], values={}, best=best.get(a), decided=a in best,
                    at_edge=False) for a in p.arms}


def test_full_plan_depths_rates_seeds_order():
    _, D = _modules()
    p = D.FULL
    labels = ["default", "conditioned", "conditioned_v0.25", "mimetic", "affine_scaled"]
    assert list(p.arms) == labels and p.width == 64 and p.width // p.n_head == 32
    assert p.depths == (2, 4, 8) and dict(zip(p.depths, p.seeds)) == {2: 2, 4: 3, 8: 5} and p.main_tpp == 20.0
    # the grid: depth 4, 5 tokens per parameter, half-decades 1e-3 ... 3e-2 (each step ~ x sqrt(10)), inside the ladder
    assert (p.grid_depth, p.grid_tpp) == (4, 5.0) and p.grid_lrs == (1e-3, 3e-3, 1e-2, 3e-2)
    ratios = [b / a for a, b in zip(p.ladder, p.ladder[1:])]
    assert all(2.9 < r < 3.5 for r in ratios) and set(p.grid_lrs) <= set(p.ladder)
    assert p.ladder.index(p.grid_lrs[0]) > 0 and p.ladder.index(p.grid_lrs[-1]) < len(p.ladder) - 1
    # nothing decided: only the grid (seed 0, κ at init and end), default first
    undecided = _decided(D, p, {})
    grid = D.plan(p, undecided)
    assert len(grid) == len(labels) * 4 and {r.seed for r in grid} == {0}
    assert [r.extra["label"] for r in grid[:4]] == ["default"] * 4
    for r in grid:
        assert (r.n_layer, r.n_embd, r.n_head, r.tokens_per_param) == (4, 64, 2, 5.0) and r.kappa_at == (0.0, 1.0)
        assert r.steps == math.ceil(5.0 * _non_embedding(4, 64) / (r.batch_size * r.block_size))
    # the estimate covers the undecided arms' depth runs (placeholder rate)
    assert len(D.plan(p, undecided, placeholder=True)) == len(grid) + len(labels) * 10
    # decided: each arm's depth runs at its own rate; seed 0 of every depth before seed 1; default before its arm;
    # then, at depth 8, default at each other arm's best rate (1e-2 is default's own: 3e-3 and 3e-2), every seed
    best = dict(zip(labels, [1e-2, 3e-3, 1e-2, 3e-2, 3e-3]))
    runs = D.plan(p, _decided(D, p, best))[len(grid):]
    runs, checks = runs[:len(labels) * 10], runs[len(labels) * 10:]
    assert D.rate_check_lrs(p, _decided(D, p, best)) == [3e-3, 3e-2]
    assert sorted((r.extra["label"], r.n_layer, r.lr, r.seed) for r in checks) == [
        ("default", 8, lr, s) for lr in (3e-3, 3e-2) for s in range(5)]
    assert all(r.tokens_per_param == 20.0 and r.v_gain is None for r in checks)
    assert D.rate_check_lrs(p, _decided(D, p, {a: 3e-3 for a in labels[1:]})) == []  # default undecided
    for r in runs:
        label = r.extra["label"]
        assert r.lr == best[label] and r.tokens_per_param == 20.0 and (r.n_embd, r.n_head) == (64, 2)
        assert r.arm == {"conditioned_v0.25": "conditioned"}.get(label, label)
        assert r.v_gain == (0.25 if label == "conditioned_v0.25" else None)
        assert r.steps == math.ceil(20.0 * _non_embedding(r.n_layer, 64) / (r.batch_size * r.block_size))
    assert {(r.n_layer, r.seed) for r in runs} == {(2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (8, 0), (8, 1), (8, 2),
                                                   (8, 3), (8, 4)}
    first_seed1 = next(i for i, r in enumerate(runs) if r.seed == 1)
    assert [r.n_layer for r in runs[:first_seed1]] == [2] * 5 + [4] * 5 + [8] * 5
    assert [r.seed for r in runs[-20:]] == [2] * 10 + [3] * 5 + [4] * 5
    idents = [(r.setting, r.extra["label"], r.seed) for r in runs + grid + checks]
    assert len(set(idents)) == len(idents)
    # one arm decided: only its depth runs join the plan
    partial = D.plan(p, _decided(D, p, {"default": 1e-2}))
    assert {r.extra["label"] for r in partial[len(grid):]} == {"default"}


def test_own_grid_at_depth_8():
    """--grid-depths 8: every arm also at the grid's rates at depth 8 (20 tokens per parameter, seed 0); the depth-8
    runs of seeds 1-2 use that grid's best rate; the seed-0 run at the best rate is planned once."""
    import dataclasses

    _, D = _modules()
    p = dataclasses.replace(D.FULL, own_grid_depths=(8,))
    best4 = {a: 3e-3 for a in p.arms}
    best8 = dict(best4, default=1e-2, conditioned=3e-2)
    runs = D.plan(p, _decided(D, p, best4), states={8: _decided(D, p, best8)})
    matched = [r for r in runs if r.extra["label"] == "default@cpu"]  # default's device-matched runs (seeds 0-2)
    assert [(r.n_layer, r.lr, r.seed) for r in matched] == [(8, best8["default"], s) for s in (0, 1, 2)]
    runs = [r for r in runs if r not in matched]
    grid8 = [r for r in runs if r.n_layer == 8 and r.seed == 0]
    assert sorted((r.extra["label"], r.lr) for r in grid8) == sorted((a, lr) for a in p.arms for lr in p.grid_lrs)
    assert all(r.tokens_per_param == 20.0 for r in grid8)
    late = {(r.extra["label"], r.lr) for r in runs if r.n_layer == 8 and r.seed > 0 and r.lr == best8[r.extra["label"]]}
    assert late == set(best8.items())
    assert {(r.extra["label"], r.lr) for r in runs if r.n_layer == 4 and r.tokens_per_param == 20.0} == set(best4.items())
    keys = [r.key() for r in runs]
    assert len(set(keys)) == len(keys)
    assert D.best_rates(p, _decided(D, p, best4), {8: _decided(D, p, best8)}, 8) == best8
    assert D.best_rates(p, _decided(D, p, best4), {8: _decided(D, p, best8)}, 2) == best4


def test_same_rate_check_and_its_verdict():
    _, D = _modules()
    p = D.FULL
    # conditioned won at its own rate (1e-2) against default at 3e-3, but default at 1e-2 does as well: the check
    # pairs the two at 1e-2 by seed and leaves default's own-rate losses beside it
    best = {"default": 3e-3, "conditioned": 1e-2, "conditioned_v0.25": 3e-3, "mimetic": 3e-3, "affine_scaled": 3e-3}
    cell = lambda losses: {s: dict(loss=x) for s, x in enumerate(losses)}  # noqa: E731
    runs = {(8, 20.0, 1e-2): {"conditioned": cell([4.66, 4.74, 4.76]), "default": cell([4.68, 4.77, 4.78])},
            (8, 20.0, 3e-3): {"default": cell([4.90, 4.91, 4.90])}}
    import _depth_report as DR

    res = DR.same_rate_check(runs, p, best)
    assert list(res) == ["conditioned"]
    r = res["conditioned"]
    gaps = [4.66 - 4.68, 4.74 - 4.77, 4.76 - 4.78]
    assert r["lr"] == 1e-2 and r["default_lr"] == 3e-3 and r["seeds"] == [0, 1, 2]
    assert [round(g, 9) for g in r["gap_loss"].values()] == [round(g, 9) for g in gaps]
    assert math.isclose(r["gap_loss_ms"][0], sum(gaps) / 3)
    assert r["default_own_rate_loss"] == {0: 4.90, 1: 4.91, 2: 4.90}
    # the one rule (benchmarks/_verdict.py, tests/benchmarks/test_verdict.py): paired t on 3 seeds, a family of one row
    from scipy import stats

    assert r["verdict"]["p"] == pytest.approx(stats.ttest_1samp(gaps, 0.0).pvalue)
    assert r["verdict"]["verdict"] == ("better" if stats.ttest_1samp(gaps, 0.0).pvalue < 0.05 else "no")
    md = DR.markdown(dict(grid={}, shared_rate={}, depths={}, same_rate=res), p, "valid.raw", 3, 3, 1.0)
    assert "Same-rate check" in md and f"{sum(gaps) / 3:+.3f}" in md
    assert DR.same_rate_check(runs, p, dict(best, default=None)) == {}


def _fake_record(D, out, spec, loss):
    path = D.SP.record_paths(str(out), spec)[0]
    D.C.write_json(path, dict(key=spec.key(), spec={}, final_eval_loss=loss, eval_files={"valid.raw": dict(loss=loss)}))


def test_grid_extends_at_an_edge_and_decides_inside(tmp_path):
    _, D = _modules()
    p = D.QUICK  # grid (3e-3, 1e-2) on the ladder (1e-3, 3e-3, 1e-2, 3e-2)
    st = D.grid_state(str(tmp_path), p, "valid.raw")
    assert all(s["best"] is None and s["tried"] == [3e-3, 1e-2] for s in st.values())
    # default: best at the top edge -> 3e-2 added, undecided until it is finished
    _fake_record(D, tmp_path, D.grid_spec(p, "default", 3e-3), 5.0)
    _fake_record(D, tmp_path, D.grid_spec(p, "default", 1e-2), 4.0)
    st = D.grid_state(str(tmp_path), p, "valid.raw")
    assert st["default"]["tried"] == [3e-3, 1e-2, 3e-2] and st["default"]["best"] is None
    assert [r.lr for r in D.plan(p, st) if r.extra["label"] == "default"] == [3e-3, 1e-2, 3e-2]
    # 3e-2 worse: the best (1e-2) is inside, decided; the depth runs of default join the plan at 1e-2
    _fake_record(D, tmp_path, D.grid_spec(p, "default", 3e-2), 4.5)
    st = D.grid_state(str(tmp_path), p, "valid.raw")
    assert st["default"]["best"] == 1e-2 and not st["default"]["at_edge"]
    assert {r.lr for r in D.plan(p, st) if r.extra["label"] == "default" and r.tokens_per_param == p.main_tpp} == {1e-2}
    # the other arm: best at the bottom edge -> 1e-3 added; still best there: the end of the ladder, said so;
    # a diverged (NaN) run never wins
    label = "conditioned_v0.25"
    _fake_record(D, tmp_path, D.grid_spec(p, label, 3e-3), 4.0)
    _fake_record(D, tmp_path, D.grid_spec(p, label, 1e-2), float("nan"))
    st = D.grid_state(str(tmp_path), p, "valid.raw")
    assert st[label]["tried"] == [1e-3, 3e-3, 1e-2] and st[label]["best"] is None
    _fake_record(D, tmp_path, D.grid_spec(p, label, 1e-3), 3.9)
    st = D.grid_state(str(tmp_path), p, "valid.raw")
    assert st[label]["best"] == 1e-3 and st[label]["at_edge"] and st[label]["values"][1e-2] == math.inf


def _text(tmp_path, src, name, n_chars, fallback):
    path = tmp_path / name
    path.write_text(src.read_text(encoding="utf-8")[:n_chars] if src.exists() else fallback)
    return str(path)


def test_depth_quick_end_to_end_and_resume(tmp_path, capsys):
    compare, D = _modules()
    articles = "".join(f" = Article {i} = \n\n The river {i} flows past the town of {i + 3} . It is long . \n"
                       for i in range(3000))
    data = _text(tmp_path, WIKI_TRAIN, "train.raw", 200_000, articles)
    ev = _text(tmp_path, WIKI_VALID, "valid.raw", 20_000, articles[:20_000])
    blimp = blimp_subset(tmp_path, per_paradigm=4)
    out = tmp_path / "depth"
    argv = ["--depth-sweep", "--quick", "--out", str(out), "--threads", "1", "--data", data, "--eval-file", ev,
            "--blimp-dir", blimp]
    results = compare.main(argv)
    err = capsys.readouterr().err
    assert "[depth] plan: 10 runs" in err and "core-h" in err  # printed before training: grid 2 × 2 + depth 2 × 3

    p = D.QUICK
    state = D.grid_state(str(out), p, "valid.raw")
    planned = D.plan(p, state)
    assert all(s["best"] is not None for s in state.values())
    records = sorted(out.glob("runs/*/*/seed*.json"))
    assert len(records) == len(planned) == results["n_runs"] >= 10
    for spec in planned:
        rec = json.loads(open(D.SP.record_paths(str(out), spec)[0]).read())
        assert rec["key"] == spec.key() and math.isfinite(rec["eval_files"]["valid.raw"]["loss"])
        # κ(J) of every layer at init and at the end; BLiMP next to perplexity
        assert [k["step"] for k in rec["kappa"]] == [0, spec.steps]
        assert all(len(k["layers"]) == spec.n_layer for k in rec["kappa"])
        assert 0 <= rec["blimp"]["blimp_accuracy"] <= 1
        if spec.tokens_per_param == p.main_tpp:  # each arm's depth runs at its own best grid rate
            assert spec.lr == state[spec.extra["label"]]["best"]
    # the grid's best is the lowest loss among the rates tried; BLiMP of one run equals the naive reference
    for a, g in results["grid"].items():
        assert g["best_lr"] == float(min(g["loss_by_lr"], key=g["loss_by_lr"].get))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(next((out / "cache").glob("data_*/tokenizer")))
    spec = next(r for r in planned if r.n_layer == 2 and r.seed == 1 and r.extra["label"] == "conditioned_v0.25")
    rec = json.loads(open(D.SP.record_paths(str(out), spec)[0]).read())
    assert_blimp_matches(rec, tok, blimp)
    # the gap table: paired differences of the records (loss and BLiMP), mean ± std over the 2 seeds at depth 2
    row = results["depths"][2]["conditioned_v0.25"]
    dflt = results["depths"][2]["default"]
    gaps = [row["loss"][s] - dflt["loss"][s] for s in (0, 1)]
    assert [row["gap_loss"][s] for s in (0, 1)] == gaps
    assert math.isclose(row["gap_loss_ms"][0], sum(gaps) / 2)
    assert row["loss_verdict"]["verdict"] in ("better", "worse", "no") and row["loss_verdict"]["n"] == 2
    bgaps = [row["blimp"][s] - dflt["blimp"][s] for s in (0, 1)]
    assert list(row["gap_blimp"].values()) == bgaps
    assert row["kappa_init_layers"] and len(row["kappa_end_layers"]) == 2
    md = (out / "results.md").read_text()
    assert f"{row['gap_loss_ms'][0]:+.3f} [{row['loss_verdict']['lo']:+.3f}, " in md and "Across depth" in md
    for name in ("cost.json", "gap_vs_depth.png", "lr_curves.png", "kappa_vs_depth.png", ".gitignore"):
        assert (out / name).stat().st_size > 0
    assert "trainer/" in (out / ".gitignore").read_text()

    # resumable: a second call trains nothing
    mtimes = {q: q.stat().st_mtime_ns for q in records}
    compare.main(argv + ["--no-report"])
    assert "left: 0 runs" in capsys.readouterr().err
    assert {q: q.stat().st_mtime_ns for q in records} == mtimes
    # --depths: a worker trains only its depths' runs (one machine's share); the rest is left to others
    shallow = next(r for r in planned if r.n_layer == 1)
    os.remove(D.SP.record_paths(str(out), shallow)[0])
    compare.main(argv + ["--no-report", "--depths", "2"])
    assert "1 runs are left to other workers" in capsys.readouterr().err
    assert not os.path.exists(D.SP.record_paths(str(out), shallow)[0])
    compare.main(argv + ["--no-report", "--depths", "1"])
    assert json.loads(open(D.SP.record_paths(str(out), shallow)[0]).read())["device"] == "cpu"
    # --train-arms: a worker trains only these arms' runs (default's run of a seed is left to another)
    pair = [next(r for r in planned if r.n_layer == 2 and r.seed == 1 and r.extra["label"] == a)
            for a in ("default", "conditioned_v0.25")]
    for r in pair:
        os.remove(D.SP.record_paths(str(out), r)[0])
    compare.main(argv + ["--no-report", "--train-arms", "conditioned_v0.25"])
    assert "1 runs are left to other workers" in capsys.readouterr().err
    assert [os.path.exists(D.SP.record_paths(str(out), r)[0]) for r in pair] == [False, True]
    compare.main(argv + ["--no-report", "--train-arms", "default"])
    assert os.path.exists(D.SP.record_paths(str(out), pair[0])[0])
    # --train-seeds: a worker trains only these seeds' runs
    seeds01 = [next(r for r in planned if r.n_layer == 2 and r.seed == k and r.extra["label"] == "default"
                    and r.tokens_per_param == D.QUICK.main_tpp) for k in (0, 1)]  # depth runs, not the grid's
    for r in seeds01:
        os.remove(D.SP.record_paths(str(out), r)[0])
    compare.main(argv + ["--no-report", "--train-seeds", "1"])
    assert "1 runs are left to other workers" in capsys.readouterr().err
    assert [os.path.exists(D.SP.record_paths(str(out), r)[0]) for r in seeds01] == [False, True]
    compare.main(argv + ["--no-report", "--train-seeds", "0"])
    assert os.path.exists(D.SP.record_paths(str(out), seeds01[0])[0])
    records = sorted(out.glob("runs/*/*/seed*.json"))
    # --report-only from the records alone; a record without BLiMP (made before it) reads as "–"
    shutil.rmtree(out / "trainer")
    path = D.SP.record_paths(str(out), spec)[0]
    rec.pop("blimp")
    open(path, "w").write(json.dumps(rec))
    again = compare.main(["--depth-sweep", "--quick", "--out", str(out), "--data", data, "--report-only"])
    assert again["n_runs"] == len(planned) and again["metric"] == "valid.raw"
    assert again["depths"][2]["conditioned_v0.25"]["blimp"][1] is None
    row_md = next(line for line in (out / "results.md").read_text().splitlines()
                  if line.startswith("| 2 |") and "conditioned_v0.25" in line)
    assert f"{100 * again['depths'][2]['conditioned_v0.25']['blimp'][0]:.2f} / – |" in row_md


@pytest.mark.parametrize("extra, says", [
    (["--arms", "default"], "--depth-sweep fixes"), (["--lr", "1e-3"], "--depth-sweep fixes"),
    (["--scale-sweep"], "two modes"), (["--depths", "3"], "--depths 3: not in the plan; choose from 1 2"),
    (["--train-arms", "nope"], "--train-arms nope: not an arm of the plan"),
    (["--train-seeds", "0", "7"], "--train-seeds 7: not a seed of the plan; choose from 0 1"),
    (["--device", "cuda"], "--device cuda: torch sees no GPU here")])
def test_depth_fixed_flags_exit_2(tmp_path, capsys, extra, says):
    import torch

    if extra[0] == "--device" and torch.cuda.is_available():
        pytest.skip("a GPU is there: --device cuda is not an error")
    compare, _ = _modules()
    text = tmp_path / "text.txt"  # data of its own: the flag under test is checked, not ../shared/data's presence
    text.write_text("a line of text\n" * 100)
    with pytest.raises(SystemExit) as err:
        compare.main(["--depth-sweep", "--quick", "--out", str(tmp_path / "never"), "--data", str(text)] + extra)
    assert err.value.code == 2
    msg = capsys.readouterr().err.strip().splitlines()
    assert len(msg) == 1 and says in msg[0]
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("flag", [["--depths", "2"], ["--train-arms", "default"], ["--train-seeds", "1"]])
def test_depths_needs_the_depth_sweep(capsys, flag):
    compare, _ = _modules()
    with pytest.raises(SystemExit) as err:
        compare.main(["--quick", *flag])
    assert err.value.code == 2
    assert "pass it with --depth-sweep" in capsys.readouterr().err
