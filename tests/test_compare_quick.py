"""``benchmarks/compare.py --quick`` end to end, in-process, on CPU (a tiny GPT-2, ~20 steps, 2 arms, 1 seed).

Checks that the outputs exist and agree with each other (results.json keys, finite perplexities, one Markdown row per
arm, plots, one JSON per run) and that a second call skips the finished runs (resumable). Uses the real TinyStories
sample from ``../shared/data`` when present (first 100 kB), otherwise a generated text file.
"""

import json
import math
import random


from utils import TINYSTORIES, load_script


def _load_compare():
    return load_script("benchmarks/compare.py", "hf_condinit_bench_compare")


def _data_file(tmp_path) -> str:
    if TINYSTORIES.exists():
        return str(TINYSTORIES)
    rng = random.Random(0)
    names, things = ["Tom", "Lily", "Ben", "Mia"], ["ball", "cat", "tree", "boat", "cake"]
    stories = []
    for _ in range(400):
        n, t = rng.choice(names), rng.choice(things)
        stories.append(f"Once upon a time, {n} had a {t}. {n} liked the {t} very much. "
                       f"One day the {t} was lost, and {n} was sad. Then {n} found it and smiled.")
    path = tmp_path / "stories.txt"
    path.write_text("\n<|endoftext|>\n".join(stories))
    return str(path)


def test_compare_quick(tmp_path):
    compare = _load_compare()
    out = tmp_path / "quick"
    argv = ["--quick", "--data", _data_file(tmp_path), "--max-bytes", "100000", "--out", str(out), "--threads", "1",
            "--steps", "20"]
    results = compare.main(argv)

    # files
    for name in ("results.json", "results.md", "loss.png", "kappa.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    run_files = sorted(p.relative_to(out).as_posix() for p in (out / "runs").rglob("*.json"))
    assert run_files == ["runs/base/conditioned/seed0.json", "runs/base/default/seed0.json"]

    # results.json agrees with the return value and holds finite numbers for both arms
    on_disk = json.loads((out / "results.json").read_text())
    assert {"machine", "settings", "data", "base_spec", "n_runs"} <= set(on_disk)
    assert on_disk["n_runs"] == 2
    arms = on_disk["settings"]["base"]["arms"]
    assert set(arms) == {"default", "conditioned"}
    for name, a in arms.items():
        assert a["seeds"] == [0]
        assert len(a["final_eval_ppl"]) == 1 and math.isfinite(a["ppl_mean"]) and a["ppl_mean"] > 1
        assert math.isclose(a["ppl_mean"], math.exp(a["loss_mean"]), rel_tol=1e-9)
        # the run learned something: final held-out loss below the initial one
        assert a["loss_mean"] < a["initial_eval_loss"]
        assert [m["step"] for m in a["kappa"]] == [0, 20]
        assert all(m["mean"] > 1 and math.isfinite(m["mean"]) for m in a["kappa"])
        assert len(a["step0"]["attn_entropy"]) == on_disk["base_spec"]["n_layer"]
        assert a["steps"] == 20
    assert arms["default"]["n_reached"] >= 0 and "delta_mean" in arms["conditioned"]
    assert results["settings"]["base"]["arms"]["default"]["loss_mean"] == arms["default"]["loss_mean"]

    # the Markdown table has exactly one row per arm, with the perplexity of results.json
    md = (out / "results.md").read_text()
    table = md.split("| arm | seeds | eval ppl")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines()[1:] if line.startswith("| ") and not line.startswith("|---")]
    assert [r.split("|")[1].strip() for r in rows] == ["default", "conditioned"]
    for r in rows:
        arm = r.split("|")[1].strip()
        assert f"{arms[arm]['ppl_mean']:.2f}" in r

    # resumable: a second call trains nothing and leaves the run files untouched
    mtimes = {p: (out / p).stat().st_mtime_ns for p in run_files}
    compare.main(argv)
    assert {p: (out / p).stat().st_mtime_ns for p in run_files} == mtimes
