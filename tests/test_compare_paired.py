"""``python -m hf_condinit.compare`` groups run folders by recipe, learning rate and seed (the model
card's hyperparameters) and prints the paired interval and verdict of hf_condinit.stats, each group's rate, and a
warning when arms ran at different rates without a grid. Hand-made run folders whose numbers are known."""

import json

import pytest

from hf_condinit import stats
from hf_condinit.compare import choose_baselines, group_runs, load_run, main, paired_rows

pytest.importorskip("scipy")


def _run(root, method, seed, lr, final, machine="cpu X"):
    d = root / f"{method}-s{seed}-lr{lr:g}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"condinit": {"method": method, "seed": seed}}))
    history = [{"step": s, "eval_loss": final + 1.0 / s} for s in (10, 20, 30)]
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 30, "log_history": history}))
    (d / "eval_results.json").write_text(json.dumps({"eval_loss": final, "perplexity": 2.0}))
    (d / "train_results.json").write_text(json.dumps({"train_loss": final, "train_machine": machine}))
    (d / "README.md").write_text(f"# x\n\n## Training and evaluation data\n\n- my.txt\n\n## Training procedure\n\n"
                                 f"- learning_rate: {lr:g}\n- train_batch_size: 8\n- seed: {seed}\n")
    return str(d)


DEFAULT = {0: 3.00, 1: 3.10, 2: 2.95}
GAP = {0: -0.05, 1: -0.07, 2: -0.04}


def test_seeds_grouped_and_paired_at_the_same_rate(tmp_path, capsys):
    paths = [_run(tmp_path, "default", s, 3e-3, v) for s, v in DEFAULT.items()]
    paths += [_run(tmp_path, "conditioned", s, 3e-3, DEFAULT[s] + GAP[s]) for s in DEFAULT]
    arms = group_runs([load_run(p) for p in paths])
    assert [(a.label, a.learning_rate, sorted(a.runs)) for a in arms] == [
        ("default @ lr 0.003", 3e-3, [0, 1, 2]), ("conditioned @ lr 0.003", 3e-3, [0, 1, 2])]
    pairs, warnings = choose_baselines(arms)
    (row,) = paired_rows(pairs, "eval_loss")
    want = stats.judge({"c": GAP})["c"]
    assert row["verdict"]["lo"] == pytest.approx(want["lo"]) and row["verdict"]["verdict"] == "better"
    assert warnings == []
    assert main(paths) == 0
    printed = capsys.readouterr().out
    assert f"| conditioned @ lr 0.003 | 0.003 | default @ lr 0.003 | 0.003 | {stats.fmt(want, 4)} | 3 |" in printed
    assert "Verdict rule (hf_condinit.stats)" in printed and "warning" not in printed


def test_different_rates_without_a_grid_warn_and_other_machines_do_not_pair(tmp_path, capsys):
    paths = [_run(tmp_path, "default", s, 3e-3, v) for s, v in DEFAULT.items()]
    paths += [_run(tmp_path, "conditioned", s, 1e-2, DEFAULT[s] + GAP[s], machine="cuda Y" if s == 2 else "cpu X")
              for s in DEFAULT]
    assert main(paths) == 0
    printed = capsys.readouterr().out
    assert "| conditioned @ lr 0.01 | 0.01 | default @ lr 0.003 | 0.003 |" in printed
    assert "| 2 |" in printed  # seed 2 ran on another machine: 2 pairs
    assert "warning: conditioned @ lr 0.01 ran at learning rate 0.01 and default @ lr 0.003 at 0.003" in printed
    assert main(paths + ["--baseline", "mimetic"]) == 2
    assert "--baseline 'mimetic': no run has that recipe" in capsys.readouterr().err
