"""What a run tells about itself: the model card, loss.png / kappa.png, and ``hf_condinit.compare``.

A tiny GPT-2 (conditioned init, κ every 3 steps) and a tiny ViT classifier train through the scripts' shared tail
(``scripts_common.train_and_save``), so the card and figures come from the same code path as ``run_*.py``; the
compare tests use hand-made run folders whose numbers are known.
"""

import json
import logging
import math
import os
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (the declared floor): tomli, the same parser (dev extra)
    import tomli as tomllib

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import yaml
from datasets import Dataset
from huggingface_hub import ModelCard
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from hf_condinit.callbacks import RunReportCallback
from hf_condinit.callbacks import report as report_module
from hf_condinit.compare import (
    Curve,
    RunGroup,
    compare_table,
    format_table,
    load_run,
    main,
    plot_eval_curves,
    plot_kappa,
    steps_to_reach,
)
from hf_condinit.reporting.plots import aggregate_curves
from hf_condinit.reporting.model_card import _dataset_name, describe_data, script_command, write_model_card
from hf_condinit.reporting.runs import read_kappa_records
from hf_condinit.scripts_common import (
    CondInitArguments,
    CondInitTrainer,
    evaluate_with_perplexity,
    make_condition_number_callback,
    train_and_save,
)
from utils import REPO, mini_config

PNG = b"\x89PNG\r\n\x1a\n"


def _args(out, **kw):
    return TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, report_to="none", use_cpu=True,
                             save_strategy="no", disable_tqdm=True, seed=0, **kw)


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory):
    """A finished tiny causal-LM run: 6 steps, loss logged every step, eval every 2, κ at steps 0, 3, 6."""
    out = tmp_path_factory.mktemp("clm") / "conditioned-run"
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                               bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "conditioned", "seed": 3})
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(16):
        ids = torch.randint(1, 64, (8,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    data = Dataset.from_list(rows)  # in-memory: no builder name (HF's card would say "the None dataset")
    trainer = CondInitTrainer(model=model, args=_args(out, max_steps=6, logging_steps=1, eval_strategy="steps",
                                                      eval_steps=2), train_dataset=data, eval_dataset=data.select(range(8)))
    cond = CondInitArguments(init="conditioned", log_condition_number_every=3, condition_number_probe_length=6)
    make_condition_number_callback(cond, data, trainer)
    train = train_and_save(trainer, data, None, block_size=8)
    evaluate = evaluate_with_perplexity(trainer, data.select(range(8)))
    return out, train, evaluate


def _png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG and os.path.getsize(path) > 5000


def test_run_writes_figures_and_keeps_every_loss_entry(clm_run):
    out, _, _ = clm_run
    assert _png(out / "loss.png") and _png(out / "kappa.png")
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    # κ is logged at steps 3 and 6 through trainer.log; the Trainer's own loss entry of those steps must survive
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in history if "kappa/mean" in e] == [0, 3, 6]


def test_model_card_content_and_metadata(clm_run):
    out, train, evaluate = clm_run
    text = (out / "README.md").read_text()
    card = ModelCard.load(str(out / "README.md"))
    metadata = yaml.safe_load(text.split("---\n")[1])  # the YAML block HF's Hub parses
    assert metadata["library_name"] == "transformers" and "base_model" not in metadata
    assert "This model was trained from scratch on an unknown dataset." in text
    for tag in ("hf_condinit", "hf_condinit-conditioned", "generated_from_trainer"):
        assert tag in card.data.tags and tag in metadata["tags"]

    condinit = json.loads((out / "config.json").read_text())["condinit"]
    assert "| method | `conditioned` |" in text and "| seed | `3` |" in text
    assert f"| layout | `{condinit['layout']}` |" in text
    assert f"| hf_condinit version | `{condinit['hf_condinit_version']}` |" in text
    assert json.dumps(condinit, indent=2, sort_keys=True) in text  # the full recipe
    assert "Attention implementation: `sdpa`." in text
    assert "- train: 16 examples, 8 tokens per example (first)" in text
    # final metrics: the evaluation after train_and_save (refreshed card) and the training summary
    assert f"| eval_loss | {evaluate['eval_loss']:.4g} |" in text
    assert f"| perplexity | {evaluate['perplexity']:.4g} |" in text
    assert f"| train_loss | {train['train_loss']:.4g} |" in text
    # κ at the first and the last measurement, as in condition_number.jsonl
    records = read_kappa_records(str(out / "condition_number.jsonl"))
    first, last = records[0], records[-1]
    assert (first.step, last.step) == (0, 6)
    assert "| layer | first (step 0) | last (step 6) |" in text
    assert f"| 1 | {first.layers[1]['mean']:.4g} / {first.layers[1]['max']:.4g} | " \
           f"{last.layers[1]['mean']:.4g} / {last.layers[1]['max']:.4g} |" in text
    assert "![training and evaluation loss](loss.png)" in text and "![κ(J) per layer](kappa.png)" in text
    assert "More information needed" in text  # HF's remaining sections are kept (extended, not replaced)


def test_model_card_keeps_a_users_readme(tmp_path, caplog):
    (tmp_path / "README.md").write_text("# my notes\n")
    trainer = type("T", (), {"is_world_process_zero": lambda self: True, "args": _args(tmp_path)})()
    with caplog.at_level(logging.WARNING):
        assert write_model_card(trainer) is None
    assert (tmp_path / "README.md").read_text() == "# my notes\n"
    assert "not a trainer model card" in caplog.text


def test_card_records_the_command_and_its_data_flags(tmp_path):
    argv = ["/repo/run_clm.py", "--train_file", "my data.txt", "--dataset-config-name=x", "--init", "conditioned"]
    assert script_command(argv) == "python run_clm.py --train_file 'my data.txt' --dataset-config-name=x --init conditioned"
    assert script_command(["/usr/bin/pytest", "-q"]) is None  # main(argv) called from Python: no command
    assert _dataset_name(argv) == "my data.txt" and _dataset_name(["run_glue.py", "--task_name", "rte"]) == "GLUE RTE"
    stub = type("T", (), {"train_dataset": [{"input_ids": [1, 2, 3]}] * 5, "eval_dataset": {"a": [{"x": 1}]}})()
    assert describe_data(stub, argv).splitlines() == [
        "- `--train_file my data.txt`", "- `--dataset_config_name x`",
        "- train: 5 examples, 3 tokens per example (first)", "- eval (a): 1 example"]
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"task_name": "rte", "output_dir": "o"}))
    assert describe_data(stub, ["run_glue.py", str(args_file)]).splitlines()[0] == "- `--task_name rte`"
    assert "embedded default data of `run_clm.py`" in describe_data(stub, ["run_clm.py", "--init", "default"])


def test_image_classifier_card(tmp_path):
    """run_image_classification.py goes through the same tail: the card has eval_accuracy and loads."""
    torch.manual_seed(0)
    cfg = mini_config("vit", num_labels=3)
    model = AutoModelForImageClassification.from_config(cfg, condinit={"method": "mimetic", "seed": 1})
    (tmp_path / "vit.json").write_text("{}")
    model.config._name_or_path = str(tmp_path / "vit.json")  # as run_clm.py's config files: not a base model
    g = torch.Generator().manual_seed(0)
    data = [{"pixel_values": torch.randn(3, 8, 8, generator=g), "labels": i % 3} for i in range(8)]

    def accuracy(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    trainer = CondInitTrainer(model=model, args=_args(tmp_path, max_steps=2, logging_steps=1), train_dataset=data,
                              eval_dataset=data, compute_metrics=accuracy)
    train_and_save(trainer, data)
    metrics = trainer.evaluate()
    card = ModelCard.load(str(tmp_path / "README.md"))
    assert "hf_condinit-mimetic" in card.data.tags and "base_model" not in card.data.to_dict()
    assert f"Built from the local config / model `{tmp_path / 'vit.json'}`." in card.text
    assert f"| eval_accuracy | {metrics['eval_accuracy']:.4g} |" in card.text
    assert _png(tmp_path / "loss.png") and not (tmp_path / "kappa.png").exists()
    assert "### Training results" not in card.text  # no evaluation during training, no empty table


def _end_of_training(out, log_history, **kw):
    state = TrainerState(log_history=log_history)
    RunReportCallback(model_card=False, **kw).on_train_end(_args(out), state, TrainerControl())


def test_figure_errors_are_warnings(tmp_path, caplog):
    (tmp_path / "condition_number.jsonl").write_text('{"step": 0, "layers": []}\nnot json\n')
    history = [{"loss": 2.0, "step": 1}, {"loss": 1.5, "step": 2}]
    with caplog.at_level(logging.WARNING):
        _end_of_training(tmp_path, history)  # must not raise
    assert _png(tmp_path / "loss.png") and not (tmp_path / "kappa.png").exists()
    assert "kappa.png" in caplog.text and "condition_number.jsonl:2" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO):  # fewer than two losses is no figure and no warning
        _end_of_training(tmp_path / "empty", [])
        _end_of_training(tmp_path / "one", [{"loss": 2.0, "step": 1}, {"eval_loss": 2.1, "step": 1}])
    assert not (tmp_path / "empty" / "loss.png").exists() and not (tmp_path / "one" / "loss.png").exists()
    assert "loss.png not drawn: 1 training and 1 evaluation loss(es) logged" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_crashing_plot_is_a_warning(tmp_path, caplog, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("matplotlib exploded")

    monkeypatch.setattr(report_module, "plot_loss", broken)
    with caplog.at_level(logging.WARNING):
        _end_of_training(tmp_path, [{"loss": 1.0, "step": 1}])
    assert "matplotlib exploded" in caplog.text and not (tmp_path / "loss.png").exists()


# ---- compare ------------------------------------------------------------------------------------------------------


def _kappa_line(step, layer_means):
    layers = [{"layer": i, "mean": m, "max": 2 * m, "bound": 10 * m} for i, m in enumerate(layer_means)]
    log = {"kappa/mean": sum(layer_means) / len(layer_means), "kappa/max": 2 * max(layer_means)}
    return json.dumps({"step": step, "epoch": 0, "log": log, "layers": layers})


def _fake_run(root, name, evals, final, *, method="default", seed=0, kappa=None, tps=None, metric="eval_loss",
              perplexity=True, attention=None):
    """A run folder as the scripts leave it: trainer_state.json (evals during training), eval_results.json (the final
    evaluation, after the state was saved), train_results.json, config.json, condition_number.jsonl."""
    d = root / name
    d.mkdir()
    last = max(evals) if evals else 0
    history = [{"loss": 3.0, "step": s} for s in evals] + [{metric: v, "step": s} for s, v in evals.items()]
    (d / "trainer_state.json").write_text(json.dumps({"global_step": last, "log_history": history}))
    results = {metric: final, **({"perplexity": math.exp(final)} if perplexity else {})}
    (d / "eval_results.json").write_text(json.dumps(results))
    (d / "train_results.json").write_text(json.dumps({"train_loss": 3.0, **({"train_tokens_per_second": tps}
                                                                           if tps else {})}))
    condinit = {"method": method, "seed": seed, "qk_gain": 2.0 if method == "conditioned" else 1.0,
                "layout": "gpt2_fused", "hf_condinit_version": "0.1.0"}
    config = {"model_type": "gpt2", "condinit": condinit, **({"condinit_attention": attention} if attention else {})}
    (d / "config.json").write_text(json.dumps(config))
    if kappa:
        (d / "condition_number.jsonl").write_text("\n".join(_kappa_line(s, m) for s, m in kappa) + "\n")
    return d


def test_steps_to_reach():
    assert steps_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 2.0, lower_better=True) == 20
    assert steps_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 0.5, lower_better=True) is None
    assert steps_to_reach([10, 20, 30], [0.1, 0.5, 0.4], 0.45, lower_better=False) == 20


def test_compare_table_against_the_folders(tmp_path):
    # A ends at 2.5 (final evaluation); B passes 2.5 at step 20 and ends at 2.2 (its final eval replaces step 40's)
    a = _fake_run(tmp_path, "A", {10: 4.0, 20: 3.0, 30: 2.8, 40: 2.6}, 2.5, kappa=[(0, [100.0, 300.0]),
                                                                                  (40, [150.0, 450.0])], tps=1234.5)
    b = _fake_run(tmp_path, "B", {10: 3.5, 20: 2.4, 30: 2.3, 40: 2.25}, 2.2, method="conditioned",
                  kappa=[(0, [10.0, 30.0]), (40, [12.0, 36.0])], attention="affine_scaled")
    rows = compare_table([load_run(str(a)), load_run(str(b))])
    ra, rb = rows
    assert ra["metric"] == rb["metric"] == "eval_loss"
    assert (ra["arm"], ra["recipe"]) == ("A", "default (seed 0)")
    assert rb["recipe"] == "conditioned qk_gain=2.0 (seed 0), attention affine_scaled"
    assert (ra["final"], rb["final"]) == (2.5, 2.2)
    assert (ra["target"], ra["steps_to_target"]) == (2.2, None)  # A never reaches B's 2.2
    assert (rb["target"], rb["steps_to_target"]) == (2.5, 20)
    assert (ra["kappa_start"], ra["kappa_end"]) == (200.0, 300.0)
    assert (rb["kappa_start_step"], rb["kappa_end_step"]) == (0, 40)
    assert (ra["tokens_per_second"], rb["tokens_per_second"]) == (1234.5, None)
    table = format_table(rows)
    assert table.splitlines()[0].startswith("| arm | init recipe | final eval_loss |")
    assert ("| A | default (seed 0) | 2.5 | not reached (target 2.2) | 200 @0 | 300 @40 | 1,234 | not recorded |"
            in table)
    assert ("| B | conditioned qk_gain=2.0 (seed 0), attention affine_scaled | 2.2 | 20 (target 2.5) | 20 @0 | 24 @40 "
            "| — | — |") in table


def test_compare_higher_is_better_and_seed_groups(tmp_path):
    kw = dict(metric="eval_accuracy", perplexity=False)
    a0 = _fake_run(tmp_path, "a0", {5: 0.50, 10: 0.60}, 0.62, **kw)
    a1 = _fake_run(tmp_path, "a1", {5: 0.54, 10: 0.64}, 0.66, **kw)
    b0 = _fake_run(tmp_path, "b0", {5: 0.65, 10: 0.70}, 0.70, method="conditioned", seed=1, **kw)
    rows = compare_table([RunGroup("a", [load_run(str(a0)), load_run(str(a1))]), load_run(str(b0))])
    ra, rb = rows
    assert ra["metric"] == "eval_accuracy" and ra["arm"] == "a (n=2)" and ra["recipe"] == "default"
    assert ra["final"] == pytest.approx(0.64)
    assert (ra["target"], ra["steps_to_target"]) == (0.70, None)
    assert rb["target"] == pytest.approx(0.64) and rb["steps_to_target"] == 5  # 0.65 >= 0.64 at step 5


def test_aggregate_curves_mean_and_band():
    c = aggregate_curves("x", [([0, 1, 2], [1.0, 2.0, 3.0]), ([1, 2], [3.0, 4.0])])  # steps both have: 1, 2
    sd = math.sqrt(0.5)  # sample std of {2, 3} and of {3, 4}
    assert c.steps == [1, 2] and c.values == [2.5, 3.5]
    assert c.lower == pytest.approx([2.5 - sd, 3.5 - sd]) and c.upper == pytest.approx([2.5 + sd, 3.5 + sd])
    g = aggregate_curves("k", [([0], [10.0]), ([0], [1000.0])], log=True)  # geometric: 100 ×/÷ 10^std(1, 3)
    assert g.values == pytest.approx([100.0])
    assert g.lower == pytest.approx([10 ** (2 - math.sqrt(2))]) and g.upper == pytest.approx([10 ** (2 + math.sqrt(2))])
    single = aggregate_curves("one", [([0, 1], [1.0, 2.0])])
    assert single.values == [1.0, 2.0] and single.lower is None


def test_overlays_accept_groups_and_curves(tmp_path):
    runs = [load_run(str(_fake_run(tmp_path, f"s{i}", {10: 3.0 + i, 20: 2.0 + i}, 1.5 + i,
                                   kappa=[(0, [10.0 * (i + 1)]), (20, [12.0 * (i + 1)])]))) for i in range(2)]
    given = Curve("given", [10, 20], [2.5, 2.0], lower=[2.4, 1.9], upper=[2.6, 2.1])
    assert _png(plot_eval_curves([RunGroup("arm", runs), given], str(tmp_path / "e.png")))
    assert _png(plot_kappa([RunGroup("arm", runs), runs[0]], str(tmp_path / "k.png")))
    with pytest.raises(TypeError, match="Curve, RunSummary or RunGroup"):
        plot_kappa([{"steps": [1]}], str(tmp_path / "bad.png"))


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_compare_cli_writes_table_and_figures_only_under_out(tmp_path, monkeypatch, capsys):
    """run from an empty folder, compare writes nothing without --out, and with it only there."""
    runs = tmp_path / "runs"
    runs.mkdir()
    a = _fake_run(runs, "A", {10: 4.0, 20: 3.0}, 2.9, kappa=[(0, [100.0]), (20, [90.0])])
    b = _fake_run(runs, "B", {10: 3.5, 20: 2.8}, 2.7, kappa=[(0, [5.0]), (20, [6.0])])
    before = _tree(runs)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main([str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "| A | default (seed 0) | 2.9 | not reached (target 2.7) |" in printed and "wrote" not in printed
    assert _tree(cwd) == [] and _tree(runs) == before
    assert main([str(a), str(b), "--out", "figs"]) == 0
    printed = capsys.readouterr().out
    assert _tree(cwd) == ["figs", "figs/compare.md", "figs/compare_eval.png", "figs/compare_kappa.png"]
    assert _tree(runs) == before
    assert (cwd / "figs" / "compare.md").read_text() in printed
    for name in ("compare_eval.png", "compare_kappa.png"):
        assert _png(cwd / "figs" / name) and f"wrote figs/{name}" in printed


def test_compare_one_point_per_run_is_a_table_only(tmp_path, capsys):
    """Two default runs evaluated once at the end and κ measured once: no two-dot figures, the table only."""
    a = _fake_run(tmp_path, "A", {}, 2.9, kappa=[(0, [100.0])])
    b = _fake_run(tmp_path, "B", {}, 2.7, kappa=[(0, [5.0])])
    assert main([str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "one eval_loss per run: no eval figure" in printed and "one κ measurement per run: no κ figure" in printed
    assert _tree(tmp_path / "o") == ["compare.md"]
    assert "| A | default (seed 0) | 2.9 |" in printed


@pytest.mark.parametrize("results, metric", [
    ({"eval_loss": 1.2, "perplexity": 3.3, "eval_recall_accuracy": 0.4}, "eval_recall_accuracy"),  # synthetic task
    ({"eval_loss": 0.6, "eval_accuracy": 0.7}, "eval_accuracy"),  # classification
    ({"eval_loss": 0.6, "eval_matthews_correlation": 0.3}, "eval_matthews_correlation"),  # GLUE CoLA
    ({"eval_loss": 3.1, "perplexity": 22.2}, "eval_loss"),  # LM on text
])
def test_compare_default_metric_is_the_runs_own(tmp_path, results, metric):
    runs = []
    for name in ("A", "B"):
        d = tmp_path / name
        d.mkdir()
        (d / "eval_results.json").write_text(json.dumps(results))
        runs.append(load_run(str(d)))
    assert [r["metric"] for r in compare_table(runs)] == [metric, metric]


def test_compare_labels_tokens_per_second_with_the_machine(tmp_path):
    a = _fake_run(tmp_path, "A", {10: 3.0}, 2.9, tps=1000.0)
    extra = {"train_machine": "cpu AMD EPYC, 2 cores", "train_torch_threads": 2, "train_load_average": 4.12}
    results = json.loads((a / "train_results.json").read_text())
    (a / "train_results.json").write_text(json.dumps({**results, **extra}))
    b = _fake_run(tmp_path, "B", {10: 3.0}, 2.8, tps=500.0)
    table = format_table(compare_table([load_run(str(a)), load_run(str(b))]))
    assert table.splitlines()[0].endswith("| tokens/s | tokens/s measured on |")
    assert "| 1,000 | cpu AMD EPYC, 2 cores; 2 threads; load 4.1 |" in table
    assert "| 500 | not recorded |" in table


def test_compare_cli_on_a_real_run(clm_run, tmp_path, capsys):
    out, train, evaluate = clm_run
    run = load_run(str(out))
    assert run.final_metrics["eval_loss"] == evaluate["eval_loss"] and run.global_step == 6
    assert run.tokens_per_second == train["train_tokens_per_second"]
    records = [json.loads(line) for line in (out / "condition_number.jsonl").read_text().splitlines()]
    assert run.kappa[0].mean == records[0]["log"]["kappa/mean"] and run.kappa[-1].step == 6
    assert run.eval_curve("eval_loss") == ([2, 4, 6], [e["eval_loss"] for e in json.loads(
        (out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in e][:2] + [evaluate["eval_loss"]])
    assert {"train_machine", "train_torch_threads"} <= set(train) and train["train_torch_threads"] >= 1
    assert main([str(out), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| conditioned-run | conditioned (seed 3) |" in printed
    assert f"| {train['train_machine']}; {train['train_torch_threads']} threads" in printed


@pytest.mark.parametrize("case", ["missing", "not_a_run", "out_is_file", "bad_metric", "bad_json"])
def test_compare_cli_errors_exit_2(tmp_path, capsys, case):
    good = _fake_run(tmp_path, "good", {10: 1.0}, 1.0)
    args = {
        "missing": [str(tmp_path / "nope")],
        "not_a_run": [str(tmp_path)],
        "out_is_file": [str(good), "--out", str(good / "eval_results.json")],
        "bad_metric": [str(good), "--metric", "eval_bleu"],
        "bad_json": [str(good)],
    }[case]
    if case == "bad_json":
        (good / "trainer_state.json").write_text("{broken")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hf-condinit-compare: error: ")


def test_console_script_entry_point():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["hf-condinit-compare"].split(":")
    assert module == "hf_condinit.compare" and func == "main"


def test_kappa_records_skip_an_unfinished_last_line_and_refuse_a_bad_one(tmp_path):
    """A run read while it trains (or after a kill) may end in a line without its newline: skipped. A bad line
    anywhere else, or a complete last line that is not a record, is one error naming the file and line."""
    path = tmp_path / "condition_number.jsonl"
    lines = [json.dumps({"step": s, "log": {"kappa/mean": 2.0 + s, "kappa/max": 3.0 + s}}) + "\n" for s in (0, 4)]
    path.write_text("".join(lines) + lines[1][:12])
    assert [(r.step, r.mean) for r in read_kappa_records(str(path))] == [(0, 2.0), (4, 6.0)]
    for bad in (lines[0] + lines[1][:12] + "\n" + lines[1], "".join(lines) + '{"no_step": 1}'):
        path.write_text(bad)
        with pytest.raises(ValueError, match=r"condition_number.jsonl:[23]: not a condition-number record"):
            read_kappa_records(str(path))
