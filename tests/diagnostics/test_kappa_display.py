"""κ lower bounds are marked wherever κ is shown (kappa.png, the compare table and figure,
the model card, the console line, ``print(report)``), never passed off as measurements; compare figures label each
arm with its recipe; the card names a warm-up ratio as a ratio."""

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_condinit
from hf_condinit.callbacks.condition_number import console_line
from hf_condinit.compare import KAPPA_LOWER_BOUND_NOTE, compare_table, format_table, load_run
from hf_condinit.diagnostics.condition_number import BOUND_NOTES, head_condition_number
from hf_condinit.diagnostics.jacobian import attention_head_output
from hf_condinit.reporting.model_card import _kappa_section, _warmup_named
from hf_condinit.reporting.plots import (
    LOWER_BOUND_LABEL,
    LOWER_BOUND_MARKER,
    RunGroup,
    curves_figure,
    kappa_curves,
    kappa_layers_figure,
)
from hf_condinit.reporting.runs import read_kappa_records


def _record(step, layers):
    """One condition_number.jsonl line; ``layers``: ``(mean, n_lower_bound)`` per layer (max = 2 × mean)."""
    rows = [{"layer": i, "mean": m, "max": 2 * m, "bound": 10 * m, "n_lower_bound": n} for i, (m, n) in enumerate(layers)]
    log = {"kappa/mean": sum(m for m, _ in layers) / len(layers), "kappa/max": 2 * max(m for m, _ in layers)}
    return json.dumps({"step": step, "epoch": 0, "log": log, "layers": rows})


def _run(root, name, kappa, method="conditioned", seed=0):
    d = root / name
    d.mkdir()
    steps = [s for s, _ in kappa]
    history = [{"loss": 3.0, "step": s} for s in steps] + [{"eval_loss": 3.0 - 0.01 * s, "step": s} for s in steps]
    (d / "trainer_state.json").write_text(json.dumps({"global_step": steps[-1], "log_history": history}))
    (d / "eval_results.json").write_text(json.dumps({"eval_loss": 2.0, "perplexity": 7.39}))
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "condinit": {"method": method, "seed": seed}}))
    (d / "condition_number.jsonl").write_text("\n".join(_record(s, lay) for s, lay in kappa) + "\n")
    return d


# layer 0 saturated (1e6, 2 heads at the resolution) at step 0 only; layer 1 measured throughout
KAPPA = [(0, [(1e6, 2), (300.0, 0)]), (10, [(5e5, 0), (400.0, 0)])]


def test_records_carry_the_lower_bound_flags(tmp_path):
    first, last = read_kappa_records(str(_run(tmp_path, "B", KAPPA) / "condition_number.jsonl"))
    assert first.is_lower_bound and first.n_lower_bound == 2 and first.layer_is_lower_bound(0)
    assert not first.layer_is_lower_bound(1) and not last.is_lower_bound


def test_kappa_png_marks_lower_bounds_with_a_legend_entry(tmp_path):
    records = read_kappa_records(str(_run(tmp_path, "B", KAPPA) / "condition_number.jsonl"))
    fig = kappa_layers_figure(records)
    for ax in fig.axes:  # mean and max panels: one hollow triangle at (0, layer 0's value), in the legend
        marked = [line for line in ax.get_lines() if line.get_marker() == LOWER_BOUND_MARKER["marker"]]
        assert len(marked) == 1 and list(marked[0].get_xdata()) == [0]
        assert LOWER_BOUND_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    unmarked = kappa_layers_figure(records[1:])
    assert not [line for ax in unmarked.axes for line in ax.get_lines() if line.get_marker() == "^"]


def test_compare_table_and_figure_mark_lower_bounds_and_label_recipes(tmp_path):
    a = load_run(str(_run(tmp_path, "A", [(0, [(100.0, 0)]), (10, [(120.0, 0)])], method="default")))
    b = load_run(str(_run(tmp_path, "B", KAPPA)))
    rows = compare_table([a, b])
    assert rows[1]["kappa_start_lower_bound"] and not rows[1]["kappa_end_lower_bound"]
    assert not rows[0]["kappa_start_lower_bound"]
    table = format_table(rows)
    assert "| ≥5e+05 @0 | 2.5e+05 @10 |" in table  # step 0 averages a saturated layer: a lower bound
    assert "| 100 @0 | 120 @10 |" in table and KAPPA_LOWER_BOUND_NOTE in table
    assert KAPPA_LOWER_BOUND_NOTE not in format_table(rows[:1])
    # a group of seeds: a step is a lower bound when any seed's value is
    b1 = load_run(str(_run(tmp_path, "B1", [(0, [(10.0, 0), (20.0, 0)]), (10, [(30.0, 0), (40.0, 0)])], seed=1)))
    group_rows = compare_table([RunGroup("cond", [b, b1])])
    assert group_rows[0]["kappa_start_lower_bound"] and format_table(group_rows).count("≥") == 2  # cell + note
    curves = kappa_curves([a, b, RunGroup("cond", [b, b1])])
    assert [c.label for c in curves] == ["A: default (seed 0)", "B: conditioned (seed 0)", "cond (n=2): conditioned"]
    assert [c.lower_bound for c in curves] == [[False, False], [True, False], [True, False]]
    ax = curves_figure(curves, ylabel="κ", title="κ", logy=True).axes[0]
    assert len([line for line in ax.get_lines() if line.get_marker() == "^"]) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()].count(LOWER_BOUND_LABEL) == 1


def test_model_card_kappa_section_marks_lower_bounds(tmp_path):
    records = read_kappa_records(str(_run(tmp_path, "B", KAPPA) / "condition_number.jsonl"))
    text = _kappa_section(records)
    assert "| 0 | ≥1e+06 / ≥2e+06 | 5e+05 / 1e+06 |" in text
    assert "| 1 | 300 / 600 | 400 / 800 |" in text
    assert "| all layers | ≥5.002e+05 / ≥2e+06 | 2.502e+05 / 1e+06 |" in text and "≥: a lower bound" in text
    assert "≥" not in _kappa_section(records[1:])


def test_card_names_a_warmup_fraction_a_ratio():
    hp = {"learning_rate": 3e-4, "lr_scheduler_warmup_steps": 0.05, "training_steps": 200}
    assert list(_warmup_named(hp)) == ["learning_rate", "lr_scheduler_warmup_ratio", "training_steps"]
    assert _warmup_named({"lr_scheduler_warmup_steps": 100}) == {"lr_scheduler_warmup_steps": 100}


@pytest.fixture(scope="module")
def report():
    cfg = AutoConfig.for_model("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                               bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "conditioned", "seed": 0})
    ids = torch.arange(1, 13).reshape(2, 6)
    return hf_condinit.attention_jacobian_condition_number(model, ids)


def test_print_report_is_a_per_layer_table(report):
    text = repr(report)
    lines = text.splitlines()
    assert lines[0].startswith("ConditionReport(gpt2, method='eig', probe (2, 6),")
    assert lines[1].split() == ["layer", "heads", "κ", "mean", "κ", "max", "κ", "≤", "surrogate", "κ(P)", "κ(PX)",
                                "lower", "bounds"]
    for lc, line in zip(report.layers, lines[2:4]):
        cells = line.split()
        assert cells[:2] == [str(lc.layer), "2"] and float(cells[2]) == pytest.approx(lc.mean, rel=1e-3)
        assert float(cells[3]) == pytest.approx(lc.max, rel=1e-3)
        assert float(cells[4]) == pytest.approx(lc.upper_bound, rel=1e-3) and lc.upper_bound >= lc.mean
        assert float(cells[5]) == pytest.approx(lc.mean_of("bound"), rel=1e-3)
    assert lines[4].split()[0] == "all" and "≥" not in text
    assert lines[5:] == [f"  {note}" for note in BOUND_NOTES]  # what the two bounds are, every time
    # a saturated head turns its layer's and the overall values into marked lower bounds
    report.layers[1].heads[0].kappa_is_lower_bound = True
    try:
        marked = repr(report)
        assert marked.splitlines()[3].split()[2].startswith("≥") and marked.splitlines()[4].split()[2].startswith("≥")
        assert not marked.splitlines()[2].split()[2].startswith("≥") and "≥: a lower bound" in marked
        assert "; 1 head(s) at the float64 resolution: lower bounds" in console_line(7, report)
    finally:
        report.layers[1].heads[0].kappa_is_lower_bound = False


def test_console_line_is_one_short_line(report):
    line = console_line(100, report)
    metrics = report.to_log_dict()
    assert line.startswith(f"κ(J) at step 100: mean {metrics['kappa/mean']:.4g}, max {metrics['kappa/max']:.4g} "
                           f"over 2 layer(s)") and "\n" not in line and "≥" not in line


# ---- what the bounds beside κ bound ---------------------------------------------------------------
F64 = torch.float64


def _autograd_jacobian(X, W, scaling, causal):
    """∂ A / ∂ (W_Q, W_K, W_V) by autograd, columns [W_Q | W_K | W_V] (κ does not depend on the order)."""
    def head(wq, wk, wv):
        return attention_head_output(X, wq, wk, wv, scaling=scaling, causal=causal).reshape(-1)

    return torch.cat([j.reshape(j.shape[0], -1) for j in torch.autograd.functional.jacobian(head, tuple(W))], 1)


def _kappa(J):
    s = torch.linalg.svdvals(J)
    return float(s[0] / s[-1])


def test_upper_bound_holds_and_the_surrogate_is_blind_to_the_scale_of_w_v():
    """Scaling W_V by c leaves the surrogate unchanged; under a causal mask κ(J) ≥ ‖J_QK‖₂ / |x_0| grows ∝ c past it,
    and the proven bound holds throughout (all against an autograd Jacobian)."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 4, 10, dtype=F64, generator=g)  # T = 8 tokens ≤ D = 10: the upper bound applies
    W = [torch.randn(10, 2, dtype=F64, generator=g) * 0.5 for _ in range(3)]
    surrogates, kappas = [], []
    for c in (1.0, 1e2, 1e4):
        Wc = [W[0], W[1], W[2] * c]
        hc = head_condition_number(X, *Wc, scaling=2 ** -0.5, causal=True, method="svd")
        J = _autograd_jacobian(X, Wc, 2 ** -0.5, True)
        kappa = _kappa(J)
        assert hc.kappa == pytest.approx(kappa, rel=1e-6) and not hc.kappa_is_lower_bound
        assert kappa <= hc.upper_bound * (1 + 1e-9)
        qk_norm = float(torch.linalg.matrix_norm(J[:, : 2 * 10 * 2], ord=2))
        assert kappa >= qk_norm / float(X[:, 0].norm(dim=-1).min()) * (1 - 1e-9)  # the first queries' rows
        surrogates.append(hc.bound)
        kappas.append(kappa)
    assert surrogates == pytest.approx([surrogates[0]] * 3, rel=1e-9)
    assert kappas[0] < surrogates[0] < kappas[2]  # κ passes the surrogate as W_V grows
    assert kappas[2] / kappas[1] == pytest.approx(100, rel=0.05)  # ∝ c


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_upper_bound_holds_on_random_heads(causal):
    applied = 0
    for seed in range(12):
        g = torch.Generator().manual_seed(100 + seed)
        X = torch.randn(2, 3, 7, dtype=F64, generator=g) * (0.5 + seed % 3)
        W = [torch.randn(7, 2, dtype=F64, generator=g) * (0.2 + seed % 4) for _ in range(3)]
        hc = head_condition_number(X, *W, scaling=0.7, causal=causal, method="svd")
        if math.isnan(hc.upper_bound):  # P X lost full row rank (a saturated softmax): the bound does not apply
            continue
        applied += 1
        assert _kappa(_autograd_jacobian(X, W, 0.7, causal)) <= hc.upper_bound * (1 + 1e-9)
    assert applied >= 8


def test_upper_bound_does_not_apply_with_more_tokens_than_width(report):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1, 6, 3, dtype=F64, generator=g)
    W = [torch.randn(3, 1, dtype=F64, generator=g) for _ in range(3)]
    assert math.isnan(head_condition_number(X, *W, scaling=1.0, causal=True).upper_bound)
    cfg = AutoConfig.for_model("gpt2", n_layer=1, n_embd=8, n_head=2, vocab_size=64, n_positions=16,
                               bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    wide = hf_condinit.attention_jacobian_condition_number(model, torch.arange(1, 13).reshape(2, 6))  # 12 > 8
    assert repr(wide).splitlines()[2].split()[4] == "n/a" and math.isnan(wide.layers[0].to_dict()["upper_bound"])


def test_report_of_a_model_with_a_grown_value_projection():
    """A tiny GPT-2 whose value projection is scaled up 10⁴-fold (as training may grow it): the surrogate does not
    move, the report's κ passes it and stays under the proven bound, and the notes under the table say why."""
    cfg = AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                               bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, condinit={"method": "conditioned", "seed": 0})
    ids = torch.arange(1, 13).reshape(2, 6)
    before = hf_condinit.attention_jacobian_condition_number(model, ids).layers[0].heads
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[:, 32:] *= 1e4  # Conv1D (in, out): columns [2D, 3D) are V
    report = hf_condinit.attention_jacobian_condition_number(model, ids)
    for old, new in zip(before, report.layers[0].heads):
        assert new.bound == pytest.approx(old.bound, rel=1e-6)  # blind to the scale of W_V
        assert old.kappa <= old.upper_bound and new.kappa <= new.upper_bound
        assert new.kappa > 10 * new.bound and not new.kappa_is_lower_bound
    assert "not an upper bound" in repr(report)
