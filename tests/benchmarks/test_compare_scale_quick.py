"""``benchmarks/compare.py --scale-sweep``: the plan of the full mode, the trend fit against a hand-made
data set with a known slope, and ``--quick`` end to end (tiny sizes, a few steps; resumable)."""

import json
import math
import statistics

import pytest

from utils import WIKI_TRAIN, WIKI_VALID, load_script


def _modules():
    """``(compare, _scale_plan, _scale_report)``; ``benchmarks/`` is on sys.path once compare.py is loaded."""
    compare = load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _scale_plan
    import _scale_report

    return compare, _scale_plan, _scale_report


def _non_embedding(n_layer, n_embd):
    # GPT-2 block: attention 4 D^2 + 4 D, MLP 8 D^2 + 5 D, two LayerNorms 4 D; final LayerNorm 2 D
    return 12 * n_layer * n_embd ** 2 + 13 * n_layer * n_embd + 2 * n_embd


def test_full_plan_sizes_arms_seeds_order_steps():
    _, SP, SR = _modules()
    p = SP.FULL
    runs = SP.plan(p)
    labels = ["default", "conditioned", "conditioned_v0.25", "mimetic", "affine_scaled"]
    assert list(p.arms) == labels
    # ≥ 3 sizes, growing, one head dim; ≥ 2 seeds, 3 at the middle size, 5 at the largest
    assert len(p.sizes) >= 3 and len({d // h for _, d, h in p.sizes}) == 1
    n = [_non_embedding(L, D) for L, D, _ in p.sizes]
    assert n == sorted(n) and len(set(n)) == len(n)
    mid = SP.size_name(p.sizes[len(p.sizes) // 2])
    for size in p.sizes:
        seeds = {r.seed for r in runs if r.extra["size"] == SP.size_name(size)}
        assert len(seeds) == {mid: 3, SP.size_name(p.sizes[-1]): 5}.get(SP.size_name(size), 2)
    # every run: steps from tokens per parameter (independent count), no run twice, the arm's init and gain
    for r in runs:
        assert r.steps == math.ceil(r.tokens_per_param * _non_embedding(r.n_layer, r.n_embd)
                                    / (r.batch_size * r.block_size))
        assert r.n_embd // r.n_head == p.sizes[0][1] // p.sizes[0][2]
        assert r.arm == {"conditioned_v0.25": "conditioned"}.get(r.extra["label"], r.extra["label"])
        assert r.v_gain == (0.25 if r.extra["label"] == "conditioned_v0.25" else None)
    idents = [(r.setting, r.extra["label"], r.seed) for r in runs]
    assert len(set(idents)) == len(idents)
    # 20 tokens per parameter at every size; length sweep 1 / 5 / 20 and 3 learning rates at the middle size only,
    # the LR sweep at one of the length sweep's lengths (5), ≥ 2 seeds per arm and rate
    assert {r.tokens_per_param for r in runs if r.lr == p.shared_lr and r.extra["size"] != mid} == {20.0}
    assert {r.tokens_per_param for r in runs if r.extra["size"] == mid} == {1.0, 5.0, 20.0}
    assert {r.lr for r in runs if r.extra["size"] == mid} == {1e-3, 3e-3, 1e-2}
    assert {r.lr for r in runs if r.extra["size"] != mid} == {p.shared_lr}
    assert p.lr_tpp == 5.0 and {r.tokens_per_param for r in runs if r.lr != p.shared_lr} == {p.lr_tpp}
    for lr in p.lrs:
        for label in labels:
            assert len([r for r in runs if r.extra["size"] == mid and r.lr == lr and r.extra["label"] == label
                        and r.tokens_per_param == p.lr_tpp]) >= 2
    # order: smallest size, all arms, seed 0 first (default first); all of seed 0 before any seed 1; LR sweep last
    assert [(r.extra["size"], r.extra["label"], r.seed) for r in runs[:5]] == [
        (SP.size_name(p.sizes[0]), a, 0) for a in labels]
    first_seed1 = next(i for i, r in enumerate(runs) if r.seed == 1)
    assert all(r.seed == 0 for r in runs[:first_seed1])
    assert {r.extra["size"] for r in runs[:first_seed1]} == {SP.size_name(s) for s in p.sizes}
    lr_runs = [i for i, r in enumerate(runs) if r.lr != p.shared_lr]
    assert lr_runs == list(range(len(runs) - len(lr_runs), len(runs)))
    for i, r in enumerate(runs):  # a gap needs default: it is never later than its arm in the same cell
        if r.extra["label"] != "default":
            j = next(k for k, q in enumerate(runs) if (q.setting, q.seed, q.extra["label"]) ==
                     (r.setting, r.seed, "default"))
            assert j < i


def test_fit_loglinear_known_slope_and_interval():
    _, SP, SR = _modules()
    # y = 0.3 - 0.05 log10 x exactly, two points per x at ± 0.01: least squares gives the line back
    xs = [1e4, 1e4, 1e5, 1e5, 1e6, 1e6]
    ys = [0.3 - 0.05 * math.log10(x) + (0.01 if i % 2 else -0.01) for i, x in enumerate(xs)]
    fit = SR.fit_loglinear(xs, ys, {"472M": 472e6})
    assert fit["ok"] and math.isclose(fit["b"], -0.05, abs_tol=1e-12) and math.isclose(fit["a"], 0.3, abs_tol=1e-12)
    # interval by hand: s^2 = 6 × 0.01^2 / 4 dof, Σ(u − ū)^2 = 4, t(0.975, 4) = 2.776445
    s = math.sqrt(6 * 1e-4 / 4)
    assert math.isclose(fit["s"], s, rel_tol=1e-9) and math.isclose(fit["t"], 2.776445, rel_tol=1e-6)
    assert math.isclose(fit["b_ci"][1] - fit["b"], 2.776445 * s / 2, rel_tol=1e-6)
    u0 = math.log10(472e6)
    pr = fit["predictions"]["472M"]
    assert math.isclose(pr["mean"], 0.3 - 0.05 * u0, rel_tol=1e-12) and pr["extrapolated"]
    half = 2.776445 * s * math.sqrt(1 / 6 + (u0 - 5) ** 2 / 4)
    assert math.isclose(pr["ci"][1] - pr["mean"], half, rel_tol=1e-6)
    assert "-0.050 loss per decade" in SR.trend_verdict(fit, "gap")
    # numpy's polyfit on the same data (an independent least squares) agrees
    import numpy as np

    b, a = np.polyfit([math.log10(x) for x in xs], ys, 1)
    assert math.isclose(b, fit["b"], abs_tol=1e-12) and math.isclose(a, fit["a"], abs_tol=1e-12)
    # a flat gap with noise: the slope interval holds 0 and the verdict says so
    flat = SR.fit_loglinear(xs, [0.01, -0.01, 0.02, -0.02, 0.01, -0.01], {"1.72B": 1.72e9})
    assert flat["b_ci"][0] < 0 < flat["b_ci"][1]
    assert "does not tell" in SR.extrapolation_verdict(flat, 3)
    assert "uninformative" in SR.extrapolation_verdict(flat, 2)
    # one size only: no trend
    one = SR.fit_loglinear([1e4, 1e4], [0.1, 0.2])
    assert not one["ok"] and "not enough points" in SR.trend_verdict(one, "gap")


def _text(tmp_path, src, name, n_chars, fallback):
    path = tmp_path / name
    path.write_text(src.read_text(encoding="utf-8")[:n_chars] if src.exists() else fallback)
    return str(path)


def test_scale_quick_end_to_end_and_resume(tmp_path, capsys):
    compare, SP, SR = _modules()
    articles = "".join(f" = Article {i} = \n\n The river {i} flows past the town of {i + 3} . It is long . \n"
                       for i in range(3000))
    data = _text(tmp_path, WIKI_TRAIN, "train.raw", 200_000, articles)
    ev = _text(tmp_path, WIKI_VALID, "valid.raw", 20_000, articles[:20_000])
    out = tmp_path / "scale"
    argv = ["--scale-sweep", "--quick", "--out", str(out), "--threads", "1", "--data", data, "--eval-file", ev]
    results = compare.main(argv)
    err = capsys.readouterr().err
    assert "[scale] plan: 12 runs" in err and "core-h" in err

    planned = SP.plan(SP.QUICK)
    records = sorted(out.glob("runs/*/*/seed*.json"))
    assert len(records) == len(planned) == results["n_runs"] == 12
    for spec in planned:
        rec = json.loads(open(SP.record_paths(str(out), spec)[0]).read())
        assert rec["spec"]["steps"] == spec.steps and rec["key"] == spec.key()
        assert math.isfinite(rec["eval_files"]["valid.raw"]["loss"]) and rec["cpu_seconds"] > 0
    # the same batches for every arm of a seed and setting
    by_cell = {}
    for path in records:
        rec = json.loads(path.read_text())
        by_cell.setdefault((rec["setting"], rec["seed"]), set()).add(rec["train_batches_sha256"])
    assert all(len(v) == 1 for v in by_cell.values())
    # the gaps of results.json are the paired differences of the records; cost and plots written; weights ignored
    cell = next(c for c in results["cells"] if c["size"] == "1x32" and c["tokens_per_param"] == 0.25
                and c["lr"] == SP.QUICK.shared_lr)
    gaps = [cell["arms"]["conditioned_v0.25"][s]["loss"] - cell["arms"]["default"][s]["loss"] for s in (0, 1)]
    fit_n = results["size_trend"]["conditioned_v0.25"]["fit"]["n"]
    assert fit_n == 4  # 1 + 2 + 1 seeds over the three sizes
    # the conservative fit: one point per size, the mean of its paired gaps (computed here from the cells)
    means = []
    for c in results["cells"]:
        if c["tokens_per_param"] == SP.QUICK.main_tpp and c["lr"] == SP.QUICK.shared_lr:
            g = [c["arms"]["conditioned_v0.25"][s]["loss"] - c["arms"]["default"][s]["loss"]
                 for s in c["arms"]["conditioned_v0.25"]]
            means.append((c["arms"]["default"][next(iter(c["arms"]["default"]))]["n"], statistics.fmean(g)))
    conservative = results["size_trend"]["conditioned_v0.25"]["fit_size_means"]
    expect = SR.fit_loglinear([x for x, _ in means], [y for _, y in means])
    assert conservative["n"] == len(means) == 3 and math.isclose(conservative["b"], expect["b"], abs_tol=1e-12)
    assert conservative["dof"] == 1 and conservative["s"] >= 0
    md = (out / "results.md").read_text()
    assert f"{statistics.fmean(gaps):+.3f} [" in md and "Holm-adjusted" in md  # the verdict rule (_verdict.py)
    assert "extrapolation to 472M / 1.72B non-embedding parameters **from CPU-scale runs**" in md
    for name in ("cost.json", "gap_vs_params.png", "gap_vs_tokens.png", ".gitignore"):
        assert (out / name).stat().st_size > 0
    assert "trainer/" in (out / ".gitignore").read_text()

    # resumable: a second call trains nothing
    mtimes = {p: p.stat().st_mtime_ns for p in records}
    compare.main(argv)
    assert "left: 0 runs" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in records} == mtimes
    # --report-only rebuilds from the records alone (no Trainer folders needed)
    import shutil

    shutil.rmtree(out / "trainer")
    again = compare.main(["--scale-sweep", "--quick", "--out", str(out), "--data", data, "--report-only"])
    assert again["n_runs"] == 12 and again["metric"] == "valid.raw"


@pytest.mark.parametrize("extra", [["--arms", "default"], ["--tokens-per-param", "5"], ["--sweep"]])
def test_scale_fixed_flags_exit_2(tmp_path, capsys, extra):
    compare, _, _ = _modules()
    with pytest.raises(SystemExit) as err:
        compare.main(["--scale-sweep", "--quick", "--out", str(tmp_path / "never")] + extra)
    assert err.value.code == 2
    msg = capsys.readouterr().err.strip().splitlines()
    assert len(msg) == 1 and "--scale-sweep fixes" in msg[0]
    assert not (tmp_path / "never").exists()
