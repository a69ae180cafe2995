"""Zero-shot minimal-pair scoring (hf_condinit.evaluation.minimal_pairs, hf_condinit.zero_shot): batched scores
against a one-sentence-at-a-time reference, the bookkeeping, the command line, and pair-by-pair agreement with
lm-evaluation-harness on the shipped ``blimp_local`` task YAMLs.

Models are tiny random GPT-2s over a small BPE trained on the BLiMP sentences used; nothing is downloaded.
"""

import json
import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_condinit  # noqa: F401
from hf_condinit.data import train_bpe_tokenizer
from hf_condinit.evaluation.minimal_pairs import (
    MinimalPairItem,
    load_minimal_pairs,
    score_items,
    sentence_log_probs,
    summarize,
    summarize_recorded,
)
from hf_condinit.evaluation.binomial import accuracy_stats, wilson_interval
from hf_condinit.zero_shot import evaluate_blimp, main, save_results

from utils import SHARED_DATA, mini_config, require

BLIMP = SHARED_DATA / "blimp"
# Three paradigms, one per field kind, of different sentence lengths.
PARADIGMS = ("anaphor_gender_agreement", "wh_island", "existential_there_quantifiers_1")


def _copy_paradigms(dst, names=PARADIGMS, n=None):
    """The first ``n`` lines (all when None) of each paradigm's file, copied into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        with open(require(BLIMP / f"{name}.jsonl"), encoding="utf-8") as f:
            lines = f.readlines()
        (dst / f"{name}.jsonl").write_text("".join(lines[:n] if n else lines), encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def blimp_subset(tmp_path_factory):
    return _copy_paradigms(tmp_path_factory.mktemp("blimp"), n=40)


@pytest.fixture(scope="module")
def tokenizer(blimp_subset):
    pairs = load_minimal_pairs(str(blimp_subset))
    return train_bpe_tokenizer([s for it in pairs.items for s in it.choices], vocab_size=400, model_max_length=64)


def _model(tokenizer, attention="sdpa", seed=0):
    torch.manual_seed(seed)
    config = mini_config("gpt2", vocab_size=len(tokenizer), n_positions=64)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    with torch.no_grad():  # non-trivial holders (they are zero-initialised): the variants must matter
        for name, p in model.named_parameters():
            if "condinit_" in name:
                p.normal_(0, 0.5)
    return model.eval()


def _reference_log_prob(model, tokenizer, sentence, prefix):
    """Independent reference: one sentence, no padding, no mask, float64 log-softmax, an explicit loop."""
    ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    if prefix != "none":
        ids = [getattr(tokenizer, f"{prefix}_token_id")] + ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return sum(torch.log_softmax(logits[i - 1], dim=-1)[ids[i]].item() for i in range(1, len(ids)))


@pytest.mark.parametrize("attention", ["sdpa", "eager", "affine_scaled", "attention_sink", "preconditioned"])
def test_batched_scores_equal_one_sentence_at_a_time(tokenizer, blimp_subset, attention):
    model = _model(tokenizer, attention)
    items = load_minimal_pairs(str(blimp_subset)).items[::8]
    sentences = [s for it in items for s in it.choices]
    for prefix in ("eos", "none"):
        batched = sentence_log_probs(model, tokenizer, sentences, batch_size=7, prefix=prefix)
        reference = [_reference_log_prob(model, tokenizer, s, prefix) for s in sentences]
        assert batched.dtype == torch.float64 and batched.shape == (len(sentences),)
        assert batched.tolist() == pytest.approx(reference, abs=2e-4), (attention, prefix)
    assert not model.training


def test_prefix_choices(tokenizer):
    """bos and eos are the same token for the project's tokenizers; ``none`` scores nothing of a one-token sentence;
    a prefix the tokenizer lacks is refused."""
    model = _model(tokenizer)
    sentences = ["The boy ate.", "Who left?"]
    eos, bos = (sentence_log_probs(model, tokenizer, sentences, prefix=p) for p in ("eos", "bos"))
    assert torch.equal(eos, bos)
    one_token = tokenizer.decode([300])
    assert len(tokenizer(one_token, add_special_tokens=False)["input_ids"]) == 1
    assert sentence_log_probs(model, tokenizer, [one_token], prefix="none").item() == 0.0
    no_bos = train_bpe_tokenizer(["a b c"] * 3, vocab_size=300, bos_token=None)
    with pytest.raises(ValueError, match="no BOS token"):
        sentence_log_probs(model, no_bos, sentences, prefix="bos")
    with pytest.raises(ValueError, match="choose one of eos, bos, none"):
        sentence_log_probs(model, tokenizer, sentences, prefix="space")


def test_accuracy_bookkeeping():
    items = [MinimalPairItem(("a", "b"), 0, "p1", "syntax"), MinimalPairItem(("c", "d"), 0, "p1", "syntax"),
             MinimalPairItem(("e", "f"), 0, "p2", "morphology"),
             MinimalPairItem(("g", "h"), 0, "p3", "syntax_semantics"),
             MinimalPairItem(("h", "i", "j"), 2, "p3", "syntax_semantics"), MinimalPairItem(("k", "l"), 0, "p3")]
    correct = [True, False, True, False, True, True]
    out = summarize(items, correct, "blimp", "eos")
    assert out["blimp_accuracy"] == pytest.approx(4 / 6)
    assert out["blimp_field_accuracy"] == {"morphology": 1.0, "syntax": 0.5, "syntax_semantics": 0.5}  # ungrouped out
    assert out["blimp_paradigm_accuracy"] == pytest.approx({"p1": 0.5, "p2": 1.0, "p3": 2 / 3})
    assert out["blimp_n_pairs"] == 6 and out["blimp_prefix"] == "eos"
    # intervals: Wilson 95 % of the counts; chance = mean of 1 / (number of choices)
    assert out["blimp_n_correct"] == 4 and out["blimp_chance"] == pytest.approx((5 / 2 + 1 / 3) / 6)
    assert out["blimp_ci95"] == list(wilson_interval(4, 6)) and out["blimp_interval"] == "wilson 95%"
    assert out["blimp_field_stats"]["syntax"] == accuracy_stats(1, 2, 0.5)
    assert out["blimp_paradigm_stats"]["p3"] == accuracy_stats(2, 3, (1 / 2 + 1 / 3 + 1 / 2) / 3)
    assert out["blimp_at_chance"] and out["blimp_vs_chance"] == "at"


def test_blimp_intervals_per_field_and_paradigm_from_a_recorded_run():
    """The whole shared BLiMP with a planted pattern of right pairs: the field counts are sums of the paradigm
    counts; a record that keeps only accuracies (as the committed harness records) gives the same intervals."""
    pairs = load_minimal_pairs(str(require(BLIMP)))
    correct = [(i * 7919) % 100 < 52 + (it.group == "morphology") * 20 for i, it in enumerate(pairs.items)]
    out = summarize(pairs.items, correct, "blimp", "eos")
    fields = out["blimp_field_stats"]
    assert {g: s["n"] for g, s in fields.items()} == {"morphology": 5400, "semantics": 2700, "syntax": 7800,
                                                       "syntax_semantics": 4200}
    assert fields["morphology"]["vs_chance"] == "above" and out["blimp_vs_chance"] == "above"
    assert sum(s["correct"] for s in fields.values()) == out["blimp_n_correct"] == sum(correct)
    assert all(s["n"] == 300 and s["chance"] == 0.5 for s in out["blimp_paradigm_stats"].values())
    recorded = {k: out[k] for k in ("blimp_accuracy", "blimp_field_accuracy", "blimp_paradigm_accuracy",
                                    "blimp_n_pairs", "blimp_prefix")}
    again = summarize_recorded(recorded, pairs)
    assert again["blimp_field_stats"] == fields and again["blimp_paradigm_stats"] == out["blimp_paradigm_stats"]
    assert again["blimp_ci95"] == out["blimp_ci95"]
    recorded["blimp_paradigm_accuracy"] = dict(recorded["blimp_paradigm_accuracy"], wh_island=0.1234)
    with pytest.raises(ValueError, match="wh_island: accuracy 0.1234 is no count out of 300"):
        summarize_recorded(recorded, pairs)


def test_score_items_decides_by_total_log_probability(tokenizer, blimp_subset):
    model = _model(tokenizer, seed=1)
    items = load_minimal_pairs(str(blimp_subset)).items[:30]
    items.append(MinimalPairItem(("The cat slept.", "Cat the slept.", "Slept the cat."), 1, "mc"))
    items.append(MinimalPairItem(("The cat slept.", "The cat slept."), 0, "tie"))
    scores, correct = score_items(model, tokenizer, items, batch_size=5)
    assert correct[-1] is False  # identical sentences tie: wrong (strictly higher is required)
    items, scores, correct = items[:-1], scores[:-1], correct[:-1]
    for it, sc, ok in zip(items, scores, correct):
        ref = [_reference_log_prob(model, tokenizer, s, "eos") for s in it.choices]
        assert sc == pytest.approx(ref, abs=2e-4)
        assert ok == (max(range(len(ref)), key=ref.__getitem__) == it.label)


def test_loader_forms_groups_and_errors(tmp_path):
    d = tmp_path / "set"
    d.mkdir()
    (d / "b.jsonl").write_text(json.dumps({"sentence_good": "x y", "sentence_bad": "y x", "field": "syntax/semantics"})
                               + "\n\n" + json.dumps({"choices": ["p", "q", "r"], "label": 2}) + "\n")
    (d / "a.jsonl").write_text(json.dumps({"sentence_good": "u", "sentence_bad": "v", "field": "morphology"}) + "\n")
    pairs = load_minimal_pairs(str(d))
    assert pairs.paradigms == ["a", "b"] and len(pairs) == 3
    assert pairs.items[1] == MinimalPairItem(("x y", "y x"), 0, "b", "syntax_semantics")
    assert pairs.items[2] == MinimalPairItem(("p", "q", "r"), 2, "b", None)
    for bad, message in [({"sentence_good": "x"}, "needs 'sentence_good' and 'sentence_bad'"),
                         ({"choices": ["p", "q"], "label": 5}, "'label' an index"),
                         ({"sentence_good": "", "sentence_bad": "y"}, "non-empty")]:
        (d / "c.jsonl").write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=f"c.jsonl:1: .*{message}"):
            load_minimal_pairs(str(d))
    (d / "c.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="c.jsonl:1: not JSON"):
        load_minimal_pairs(str(d))
    with pytest.raises(ValueError, match="no such folder"):
        load_minimal_pairs(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="holds no \\*.jsonl"):
        load_minimal_pairs(str(tmp_path))


def test_shared_blimp_has_the_four_fields():
    pairs = load_minimal_pairs(str(require(BLIMP)))
    assert len(pairs) == 20_100 and len(pairs.paradigms) == 67
    assert {it.group for it in pairs.items} == {"morphology", "syntax", "semantics", "syntax_semantics"}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, tokenizer):
    """A saved affine_scaled model (loads only with hf_condinit imported) with its tokenizer."""
    out = tmp_path_factory.mktemp("run")
    model = _model(tokenizer, "affine_scaled", seed=2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "eval_results.json").write_text(json.dumps({"eval_loss": 3.0, "perplexity": math.exp(3.0)}))
    return out, model


def test_command_line_scores_a_saved_run(saved_run, blimp_subset, tokenizer, capsys):
    """``main`` is what ``python -m hf_condinit.zero_shot`` runs (in-process here: a subprocess costs ~10 s of
    imports); the folder holds an affine_scaled model, which loads as itself only with hf_condinit imported."""
    run_dir, model = saved_run
    main([str(run_dir), "--blimp_dir", str(blimp_subset), "--batch_size", "16", "--save"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = evaluate_blimp(model, tokenizer, str(blimp_subset), batch_size=16)  # the in-memory model
    assert printed["blimp_n_pairs"] == 120 and printed["blimp_prefix"] == "eos"
    assert printed == expected
    assert set(printed["blimp_field_accuracy"]) == {"morphology", "syntax", "semantics"}
    saved = json.loads((run_dir / "eval_results.json").read_text())
    assert saved["eval_loss"] == 3.0 and saved["blimp_accuracy"] == printed["blimp_accuracy"]


def test_command_line_user_errors_exit_2_before_loading(tmp_path, blimp_subset, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    cases = [([str(tmp_path), "--blimp_dir", str(tmp_path / "nope")], "no such folder"),
             ([str(tmp_path), "--blimp_dir", str(tmp_path)], "holds no \\*.jsonl"),
             ([str(tmp_path / "none"), "--blimp_dir", str(blimp_subset)], "is not a saved model folder"),
             ([str(tmp_path), "--blimp_dir", str(blimp_subset), "--batch_size", "0"], "--batch_size 0")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("python -m hf_condinit.zero_shot: error:")
        assert __import__("re").search(message, err), err


def test_save_results_keeps_other_keys(tmp_path):
    (tmp_path / "all_results.json").write_text(json.dumps({"train_loss": 1.0, "blimp_accuracy": 0.1}))
    written = save_results(str(tmp_path), {"blimp_accuracy": 0.7, "blimp_n_pairs": 3})
    assert sorted(os.path.basename(p) for p in written) == ["all_results.json", "eval_results.json"]
    assert json.loads((tmp_path / "all_results.json").read_text()) == {"train_loss": 1.0, "blimp_accuracy": 0.7,
                                                                       "blimp_n_pairs": 3}
    assert json.loads((tmp_path / "eval_results.json").read_text())["blimp_accuracy"] == 0.7


def test_shipped_lm_eval_tasks_cover_every_paradigm():
    from hf_condinit.lm_eval_tasks import TASKS_DIR

    shipped = {f[: -len(".yaml")] for f in os.listdir(os.path.join(TASKS_DIR, "blimp_local"))
               if f.endswith(".yaml") and not f.startswith("_")}
    assert shipped == set(load_minimal_pairs(str(require(BLIMP))).paradigms)
    group = open(os.path.join(TASKS_DIR, "blimp_local", "_blimp_local.yaml")).read()
    assert all(f"  - blimp_local_{p}\n" in group for p in shipped)


def test_lm_eval_harness_agrees_pair_by_pair(tokenizer, tmp_path):
    """lm-evaluation-harness (HFLM around the same in-memory model, the shipped blimp_local YAMLs, log_samples)
    gives the same log-likelihoods and the same decision for every pair of three paradigms (the first 100 pairs of
    each; all 67 paradigms of the 20,100 shared pairs: benchmarks/blimp_agreement.py)."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hf_condinit.lm_eval_tasks import TASKS_DIR

    data = _copy_paradigms(tmp_path / "blimp", n=100)
    model = _model(tokenizer, seed=3)
    ours = load_minimal_pairs(str(data))
    scores, correct = score_items(model, tokenizer, ours.items, batch_size=32)
    ours_by_pair = {(it.paradigm, it.choices): (sc, ok) for it, sc, ok in zip(ours.items, scores, correct)}

    results = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=32, device="cpu"),
        tasks=[f"blimp_local_{p}" for p in PARADIGMS],
        task_manager=TaskManager(include_path=TASKS_DIR, metadata={"blimp_dir": str(data)}),
        log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
    )
    compared = 0
    for p in PARADIGMS:
        samples = results["samples"][f"blimp_local_{p}"]
        assert len(samples) == 100
        for s in samples:
            doc = s["doc"]
            lls = [r[0] for r in s["filtered_resps"]]
            our_scores, our_ok = ours_by_pair[(p, (doc["sentence_good"], doc["sentence_bad"]))]
            assert lls == pytest.approx(our_scores, abs=2e-4)
            if abs(lls[0] - lls[1]) > 1e-4:  # lm-eval's argmax counts an exact tie as right; there is none here
                assert bool(s["acc"]) == our_ok
                compared += 1
        ours_acc = sum(ok for (q, _), (_, ok) in ours_by_pair.items() if q == p) / 100
        assert results["results"][f"blimp_local_{p}"]["acc,none"] == pytest.approx(ours_acc)
    assert compared == 300


# ------------------------------------------------------------------------------------------------- run_clm.py


def _run_clm_args(tmp_path, train_file, blimp_dir):
    return ["--output_dir", str(tmp_path / "out"), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none",
            "--seed", "7", "--model_config", "gpt2-tiny", "--train_file", train_file, "--block_size", "64",
            "--tokenizer_vocab_size", "512", "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--max_eval_samples", "8", "--save_strategy", "no", "--blimp_dir", str(blimp_dir)]  # fmt: skip


def test_run_clm_writes_blimp_into_results_card_and_compare_table(ts_file, tmp_path, blimp_subset):
    from hf_condinit.compare import compare_table, format_table, load_run
    from transformers import AutoTokenizer

    from utils import load_script

    run_clm = load_script("run_clm.py")
    results = run_clm.main(_run_clm_args(tmp_path, ts_file, blimp_subset))
    out = tmp_path / "out"
    ev = json.loads((out / "eval_results.json").read_text())
    assert "perplexity" in ev and ev["blimp_n_pairs"] == 120 and ev["blimp_prefix"] == "eos"
    assert set(ev["blimp_paradigm_accuracy"]) == set(PARADIGMS)
    assert set(ev["blimp_field_accuracy"]) == {"morphology", "syntax", "semantics"}
    assert results["blimp_accuracy"] == ev["blimp_accuracy"]
    assert json.loads((out / "all_results.json").read_text())["blimp_accuracy"] == ev["blimp_accuracy"]
    # the saved model gives the same accuracy from the files (what hf_condinit.zero_shot reads)
    again = evaluate_blimp(AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out),
                           str(blimp_subset))
    assert again == {k: ev[k] for k in again}
    card = (out / "README.md").read_text()
    assert "## Zero-shot BLiMP" in card and "| wh_island |" in card
    assert f"| all | {100 * ev['blimp_accuracy']:.1f} % |" in card
    table = format_table(compare_table([load_run(str(out))]))
    assert "BLiMP acc" in table.splitlines()[0] and f"{ev['blimp_accuracy']:.4g}" in table.splitlines()[2]


def test_run_clm_bad_blimp_dir_is_a_user_error_before_any_work(ts_file, tmp_path, monkeypatch):
    from hf_condinit.scripts_common import UsageError

    from utils import load_script

    run_clm = load_script("run_clm.py")

    def boom(*a, **k):
        raise AssertionError("work started before the input was validated")

    monkeypatch.setattr(run_clm, "train_bpe_tokenizer", boom)
    monkeypatch.setattr(run_clm, "load_raw_datasets", boom)
    with pytest.raises(UsageError, match="no such folder"):
        run_clm.main(_run_clm_args(tmp_path, ts_file, tmp_path / "missing"))
    with pytest.raises(UsageError, match="--blimp_dir scores English sentences"):
        run_clm.main(["--output_dir", str(tmp_path / "out"), "--use_cpu", "--blimp_dir", str(tmp_path)])
    assert not (tmp_path / "out").exists()
