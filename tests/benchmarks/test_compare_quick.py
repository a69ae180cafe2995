"""``benchmarks/compare.py --quick`` end to end, in-process, on CPU (a tiny GPT-2, ~20 steps, 2 arms, 1 seed).

Checks that the outputs exist and agree with each other (results.json keys, finite perplexities, one Markdown row per
arm, plots, one JSON per run) and that a second call skips the finished runs (resumable). Uses the real TinyStories
sample from ``../shared/data`` when present (first 100 kB), otherwise a generated text file.
"""

import json
import math
import random
import sys
from pathlib import Path

import pytest

from utils import SHARED_DATA, TINYSTORIES, WIKI_VALID, load_script

BLIMP = SHARED_DATA / "blimp"


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


def blimp_subset(tmp_path, per_paradigm: int = 8) -> str:
    """A small BLiMP folder: the first short pairs (≤ 45 characters) of three paradigms of ``../shared/data/blimp``
    in the same JSONL form, or made-up agreement pairs when the data is absent."""
    folder = tmp_path / "blimp_subset"
    folder.mkdir(exist_ok=True)
    names = ["anaphor_gender_agreement", "determiner_noun_agreement_1", "regular_plural_subject_verb_agreement_1"]
    for name in names:
        src = BLIMP / f"{name}.jsonl"
        if src.exists():
            rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
            rows = [r for r in rows if max(len(r["sentence_good"]), len(r["sentence_bad"])) <= 45][:per_paradigm]
        else:
            rows = [dict(sentence_good=f"The {n} is here.", sentence_bad=f"The {n} are here.", field="morphology",
                         UID=name, pairID=str(i)) for i, n in enumerate(["cat", "dog", "boat", "tree"])]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def naive_blimp_decisions(run_dir: str, tokenizer, folder: str) -> tuple[list, list]:
    """An independent BLiMP reference: each sentence alone (no batch, no padding) after an EOS token, its total
    log-probability by hand from the logits; returns (grammatical wins per pair, |margin| per pair)."""
    import torch
    from transformers import AutoModelForCausalLM

    import hf_condinit  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(run_dir).eval()

    def logprob(text):
        ids = torch.tensor([[tokenizer.eos_token_id] + tokenizer(text)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits.double(), dim=-1)
        return float(sum(logp[0, t - 1, ids[0, t]] for t in range(1, ids.shape[1])))

    wins, margins = [], []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            d = logprob(r["sentence_good"]) - logprob(r["sentence_bad"])
            wins.append(d > 0)
            margins.append(abs(d))
    return wins, margins


def assert_blimp_matches(rec: dict, tokenizer, folder: str) -> None:
    """The record's BLiMP accuracy equals the naive reference (pairs within 1e-4 nats of a tie may go either way)."""
    wins, margins = naive_blimp_decisions(rec["run_dir"], tokenizer, folder)
    near_ties = sum(m < 1e-4 for m in margins)
    assert rec["blimp"]["blimp_n_pairs"] == len(wins) and rec["blimp"]["blimp_prefix"] == "eos"
    assert abs(rec["blimp"]["blimp_accuracy"] - sum(wins) / len(wins)) <= near_ties / len(wins) + 1e-12


def test_compare_quick(tmp_path):
    compare = _load_compare()
    out = tmp_path / "quick"
    blimp = blimp_subset(tmp_path)
    argv = ["--quick", "--data", _data_file(tmp_path), "--max-bytes", "100000", "--out", str(out), "--threads", "1",
            "--steps", "20", "--blimp-dir", blimp]
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
        assert f"{100 * arms[arm]['blimp_mean']:.2f} ±" in r  # BLiMP next to perplexity
    assert "(n/a (1 seed))" in rows[1]  # one seed: no interval, no verdict (benchmarks/_verdict.py)

    # BLiMP: the record's accuracy is the naive per-sentence reference on the saved model; paired Δ in results
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(next((out / "cache").glob("data_*/tokenizer")))
    recs = {a: json.loads((out / "runs" / "base" / a / "seed0.json").read_text()) for a in arms}
    import torch

    for rec in recs.values():
        assert_blimp_matches(rec, tok, blimp)
        # provenance of every new record: device, commit, command, library versions
        assert rec["device"] == "cpu" and rec["command"].endswith(" ".join(sys.argv)) and "commit_dirty" in rec
        assert rec["commit"] is None or len(rec["commit"]) == 40
        assert rec["versions"]["torch"] == torch.__version__ and rec["versions"]["transformers"]
    assert math.isclose(arms["conditioned"]["delta_blimp_mean"],
                        recs["conditioned"]["blimp"]["blimp_accuracy"] - recs["default"]["blimp"]["blimp_accuracy"])

    # resumable: a second call trains nothing and leaves the run files untouched
    mtimes = {p: (out / p).stat().st_mtime_ns for p in run_files}
    compare.main(argv)
    assert {p: (out / p).stat().st_mtime_ns for p in run_files} == mtimes

    # a record made before BLiMP (no "blimp" key, model not saved) still loads: "–" in its row
    path = out / "runs/base/conditioned/seed0.json"
    rec = json.loads(path.read_text())
    del rec["blimp"]
    path.write_text(json.dumps(rec))
    again = compare.main(argv + ["--report-only"])
    assert again["settings"]["base"]["arms"]["conditioned"]["blimp_mean"] is None
    row = next(line for line in (out / "results.md").read_text().splitlines() if line.startswith("| conditioned |"))
    assert "| – ± – | – |" in row  # BLiMP mean ± std, then the paired Δ BLiMP cell

    # runs trained on another machine come back as records only: tables and figures are rebuilt from them
    import shutil

    shutil.rmtree(out / "trainer")
    for name in ("loss.png", "kappa.png"):
        (out / name).unlink()
    again = compare.main(argv + ["--report-only"])
    assert again["settings"]["base"]["arms"]["default"]["ppl_mean"] == arms["default"]["ppl_mean"]
    for name in ("loss.png", "kappa.png"):
        assert (out / name).stat().st_size > 0, name
    import _lm_report

    groups = _lm_report.base_groups([recs["default"], recs["conditioned"]])
    assert [g.label for g in groups] == ["default", "conditioned"]
    run = groups[0].runs[0]
    assert run.eval_curve("eval_loss") == ([s for s, _ in recs["default"]["eval_curve"]],
                                           [v for _, v in recs["default"]["eval_curve"]])
    assert [k.step for k in run.kappa] == [0, 20]


def _story_files(tmp_path, n_files: int = 2) -> list:
    """The first stories of the data as ``n_files`` files of whole stories, in a directory."""
    text = open(_data_file(tmp_path), encoding="utf-8").read(120_000)
    stories = [s.strip() for s in text.split("<|endoftext|>")[:-1] if s.strip()]
    folder = tmp_path / "stories"
    folder.mkdir()
    per = len(stories) // n_files
    paths = []
    for i in range(n_files):
        path = folder / f"part{i}.txt"
        path.write_text("\n<|endoftext|>\n".join(stories[i * per:(i + 1) * per]) + "\n<|endoftext|>\n")
        paths.append(path)
    return paths, per * n_files


def _eval_text(tmp_path):
    if WIKI_VALID.exists():
        text = WIKI_VALID.read_text(encoding="utf-8")[:40_000]
    else:
        text = "\n".join(f" = Article {i} = \n\n The number {i} is followed by {i + 1} . \n" for i in range(300))
    path = tmp_path / "held_out_text.raw"
    path.write_text(text)
    return path


def test_compare_eval_files_tokens_per_param_and_resume(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_condinit.data.documents import read_documents

    compare = _load_compare()
    files, n_docs = _story_files(tmp_path)
    eval_a = _eval_text(tmp_path)
    out = tmp_path / "tpp"
    k = 0.05
    argv = ["--quick", "--data", str(files[0].parent), "--out", str(out), "--threads", "1", "--kappa-at",
            "--tokens-per-param", str(k), "--eval-file", str(eval_a)]
    results = compare.main(argv)

    # --data: the directory's files in name order, every story one document, none lost
    assert results["data"]["files"] == [str(f) for f in files]
    assert results["data"]["documents"] == n_docs

    # --tokens-per-param: steps from the non-embedding count (GPT-2: 12 L D^2 + 13 L D + 2 D), reported
    spec = results["base_spec"]
    L, D = spec["n_layer"], spec["n_embd"]
    non_emb = 12 * L * D * D + 13 * L * D + 2 * D
    steps = math.ceil(k * non_emb / (spec["batch_size"] * spec["block_size"]))
    arms = results["settings"]["base"]["arms"]
    for a in arms.values():
        assert a["n_params_non_embedding"] == non_emb and a["n_params"] > non_emb
        assert a["steps"] == steps and a["tokens_seen"] == steps * spec["batch_size"] * spec["block_size"]
        assert math.isclose(a["tokens_per_param"], a["tokens_seen"] / non_emb)

    # same training batches for every arm of a seed
    recs = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs" / "base").rglob("seed0.json")}
    assert recs["default"]["train_batches_sha256"] == recs["conditioned"]["train_batches_sha256"]

    # --eval-file: perplexity per file in results.json, equal to a direct evaluation of the saved model
    name = eval_a.name
    on_disk = json.loads((out / "results.json").read_text())
    assert name in on_disk["eval_files"]
    for arm, a in on_disk["settings"]["base"]["arms"].items():
        e = a["eval_files"][name]
        assert math.isfinite(e["ppl_mean"]) and math.isclose(e["ppl_mean"], math.exp(e["loss_mean"]), rel_tol=1e-9)
        assert ("delta_mean" in e) == (arm != "default")
    run_dir = recs["conditioned"]["run_dir"]
    tok = AutoTokenizer.from_pretrained(next((out / "cache").glob("data_*/tokenizer")))
    ids = []
    for doc in read_documents([str(eval_a)]):
        ids += tok(doc)["input_ids"] + [tok.eos_token_id]
    block = spec["block_size"]
    model = AutoModelForCausalLM.from_pretrained(run_dir).eval()
    losses = []
    with torch.no_grad():
        for i in range(0, len(ids) // block * block, block):
            x = torch.tensor([ids[i:i + block]])
            losses.append(float(model(input_ids=x, labels=x).loss))
    direct = sum(losses) / len(losses)
    assert math.isclose(recs["conditioned"]["eval_files"][name]["loss"], direct, rel_tol=2e-3)

    # resumable: another --eval-file later evaluates the saved models without retraining
    eval_b = tmp_path / "second.txt"
    eval_b.write_text(eval_a.read_text()[:20_000])
    states = {p: p.stat().st_mtime_ns for p in (out / "trainer").rglob("trainer_state.json")}
    again = compare.main(argv + ["--eval-file", str(eval_b)])
    assert {p: p.stat().st_mtime_ns for p in states} == states
    assert set(again["eval_files"]) == {name, eval_b.name}
    for a in again["settings"]["base"]["arms"].values():
        assert set(a["eval_files"]) == {name, eval_b.name}


def test_compare_user_errors_exit_2(tmp_path, capsys):
    compare = _load_compare()
    data = _data_file(tmp_path)
    cases = [
        ["--data", data, "--eval-file", str(tmp_path / "missing.raw")],
        ["--data", str(tmp_path / "nothing_here")],
        ["--data", data, "--steps", "10", "--tokens-per-param", "1"],
        ["--data", data, "--tokens-per-param", "0"],
        ["--data", data, "--arms", "default", "no_such_arm"],
        ["--data", data, "--checkpoint-minutes", "-1"],
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as err:
            compare.main(["--quick", "--out", str(tmp_path / "never")] + argv)
        assert err.value.code == 2, argv
        msg = capsys.readouterr().err.strip().splitlines()
        assert len(msg) == 1 and msg[0].startswith("compare.py: error: "), msg
    assert not (tmp_path / "never").exists()


def test_compare_diverged_run_is_recorded_not_a_crash(tmp_path):
    """A run whose loss becomes NaN (the Trainer stops it) is a finished run with loss NaN and the step it diverged
    at, so a sweep's workers go on (a too-large learning rate of a grid is a result)."""
    compare = _load_compare()
    out = tmp_path / "diverged"
    results = compare.main(["--quick", "--data", _data_file(tmp_path), "--max-bytes", "100000", "--out", str(out),
                            "--threads", "1", "--steps", "8", "--lr", "1e30", "--arms", "default", "--kappa-at"])
    rec = json.loads((out / "runs/base/default/seed0.json").read_text())
    assert "diverged" in rec["diverged"] and 0 < rec["diverged_at"] < 8 and math.isnan(rec["final_eval_loss"])
    assert rec["tokens_seen"] == rec["steps"] * 8 * 64 and rec["steps"] < 8
    assert results["settings"]["base"]["arms"]["default"]["diverged"] == [0]
