"""Compare finished runs side by side: ``python -m hf_condinit.compare RUN_DIR [RUN_DIR ...] [--out DIR]``
(console script ``hf-condinit-compare``); how to read it: docs/diagnostics.md, "Reading your runs".

Reads the output folder of each run (any script; :mod:`hf_condinit.reporting.runs` for the files) and prints a
Markdown table; with ``--out DIR`` it also writes ``DIR/compare.md``, ``compare_eval.png`` (the metric vs step) and
``compare_kappa.png`` (κ vs step, log scale, a lower bound as a hollow triangle). A figure whose runs have one point
each is not drawn.

Table columns (:func:`compare_table`): the arm (folder name), its init recipe (``config.json``'s ``condinit`` and
attention), the final value of the run's own evaluation metric (or ``--metric``), the first evaluated step at which
the run is at least as good as the best *other* run's final value ("not reached"), κ(J) (``kappa/mean``) at the
first and last measurement (``≥``: a lower bound), training tokens/s with the machine, thread count and load average
it was measured on, and the zero-shot BLiMP accuracy when some run has it.

**Seeds and the paired verdict.** Runs with the same recipe and learning rate but different seeds are one arm (one
row, the means over its seeds; :func:`group_runs`; seed and rate read from the run's model card). Below the table,
every arm is compared with the baseline (``--baseline``; default: the model's default init with the default
attention, else the first arm) by :func:`paired_rows`: the paired difference by seed of the final metric (pairs only
on the same machine and the same data), its mean, 95 % Student-t interval and Holm-corrected verdict over the
table's rows (:mod:`hf_condinit.stats`), steps to reach the baseline's final value and whether the arm's eval curve
is flat. An arm is paired with the baseline at its own learning rate when the baseline ran at it, else at the
baseline's best rate; arms at different rates get a warning unless both recipes ran at several rates.

Public API (reused by ``benchmarks/`` and :mod:`hf_condinit.study`): :func:`load_run`, :func:`compare_table`,
:func:`format_table`, :func:`plot_eval_curves`, :func:`plot_kappa`, :func:`main`; :class:`RunGroup` (the seeds of one
arm, summarised by their mean) and :class:`Curve` (a curve given directly) are accepted wherever runs are;
:class:`Arm`, :func:`group_runs`, :func:`choose_baselines`, :func:`paired_rows`, :func:`format_paired`.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Sequence, Union

from . import stats
from .reporting.plots import Curve, RunGroup, aggregate_curves, common_metric, plot_eval_curves, plot_kappa
from .reporting.runs import RunSummary, lower_is_better, recipe_summary, summarize_run
from .errors import check_writable_folder

__all__ = [
    "Arm",
    "choose_baselines",
    "format_paired",
    "group_runs",
    "paired_rows",
    "training_facts",
    "RunSummary",
    "RunGroup",
    "Curve",
    "load_run",
    "compare_table",
    "format_table",
    "plot_eval_curves",
    "plot_kappa",
    "steps_to_reach",
    "throughput_label",
    "write_figures",
    "main",
]

#: The line under a table holding a κ lower bound.
KAPPA_LOWER_BOUND_NOTE = ("≥: a lower bound of κ — some head's κ hit the float64 resolution (`n_lower_bound` in "
                          "`condition_number.jsonl`), so the true value is larger.")

TABLE_FILE = "compare.md"
EVAL_FIGURE = "compare_eval.png"
KAPPA_FIGURE = "compare_kappa.png"


def load_run(path: str, name: str | None = None) -> RunSummary:
    """Read a finished run folder (:func:`hf_condinit.reporting.runs.summarize_run`).

    Raises ``NotARunFolderError`` (a ``ValueError``) when ``path`` is missing or holds no run, ``ValueError`` for an
    unreadable file."""
    return summarize_run(path, name)


def steps_to_reach(steps: Sequence[int], values: Sequence[float], target: float, lower_better: bool) -> int | None:
    """The first step whose value is at least as good as ``target`` (``<=`` when lower is better, else ``>=``);
    ``None`` when no value is."""
    for step, value in zip(steps, values):
        if (value <= target) if lower_better else (value >= target):
            return step
    return None


def _final_value(run: RunSummary, metric: str) -> float | None:
    if metric in run.final_metrics:
        return float(run.final_metrics[metric])
    _, values = run.eval_curve(metric)
    return values[-1] if values else None


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)


def _recipe(item: Union[RunSummary, RunGroup]) -> str:
    """The run's recipe; a group's without the seed (its runs differ in it)."""
    if isinstance(item, RunSummary):
        return item.recipe
    if not item.runs:
        return ""
    first = item.runs[0]
    return recipe_summary({k: v for k, v in first.condinit.items() if k != "seed"}, first.attention)


def throughput_label(run: RunSummary) -> str | None:
    """What a run's tokens/s was measured on, from its ``train_results.json`` (``train_machine``,
    ``train_torch_threads``, ``train_load_average``: :func:`hf_condinit.scripts.lifecycle.throughput_context`):
    ``"cpu AMD EPYC, 2 cores; 2 threads; load 4.1"``; ``None`` when the run recorded none of them."""
    m = run.final_metrics
    parts = []
    if m.get("train_machine"):
        parts.append(str(m["train_machine"]))
    if m.get("train_torch_threads") is not None:
        parts.append(f"{m['train_torch_threads']} threads")
    if m.get("train_load_average") is not None:
        parts.append(f"load {float(m['train_load_average']):.2g}")
    return "; ".join(parts) or None


def _arm_stats(item: Union[RunSummary, RunGroup], metric: str | None) -> dict:
    """Final value, curve, κ first/last and tokens/s of a run, or the mean over a group's runs (geometric for κ)."""
    runs = item.runs if isinstance(item, RunGroup) else [item]

    def mean(xs, log=False):
        xs = [x for x in xs if x is not None and not math.isnan(x) and (x > 0 or not log)]
        if len(xs) < 2:
            return xs[0] if xs else None
        return 10 ** (sum(map(math.log10, xs)) / len(xs)) if log else sum(xs) / len(xs)

    curve = (aggregate_curves("", [r.eval_curve(metric) for r in runs]) if metric else Curve("", [], []))
    return {
        "arm": f"{item.label} (n={len(runs)})" if isinstance(item, RunGroup) else item.name,
        "recipe": _recipe(item),
        "final": mean([_final_value(r, metric) for r in runs]) if metric else None,
        "curve": (curve.steps, curve.values),
        "kappa_start": mean([r.kappa[0].mean if r.kappa else None for r in runs], log=True),
        "kappa_end": mean([r.kappa[-1].mean if r.kappa else None for r in runs], log=True),
        "kappa_start_lower_bound": any(r.kappa[0].is_lower_bound for r in runs if r.kappa),
        "kappa_end_lower_bound": any(r.kappa[-1].is_lower_bound for r in runs if r.kappa),
        "kappa_start_step": runs[0].kappa[0].step if runs and runs[0].kappa else None,
        "kappa_end_step": runs[0].kappa[-1].step if runs and runs[0].kappa else None,
        "tokens_per_second": mean([r.tokens_per_second for r in runs]),
        "tokens_per_second_on": "; ".join(dict.fromkeys(c for c in map(throughput_label, runs) if c)) or None,
        "blimp_accuracy": mean([_float_or_none(r.final_metrics.get("blimp_accuracy")) for r in runs]),
        "global_step": runs[0].global_step if runs else None,
    }


def compare_table(runs: Sequence[Union[RunSummary, RunGroup]], metric: str | None = None) -> list[dict]:
    """One row per run (or group of seeds) with the keys ``arm``, ``recipe``, ``metric``, ``final``, ``target``
    (the best final value among the other rows), ``steps_to_target`` (:func:`steps_to_reach` on the row's eval
    curve; ``None`` when not reached or with a single row), ``kappa_start``, ``kappa_end`` (κ at the first / last
    measurement, ``None`` when not logged), ``kappa_start_lower_bound``, ``kappa_end_lower_bound`` (the value is
    only a lower bound: some head of some run hit the float64 resolution), ``kappa_start_step``, ``kappa_end_step``,
    ``tokens_per_second``, ``tokens_per_second_on`` (:func:`throughput_label`; a group's distinct ones joined),
    ``blimp_accuracy`` (``None`` when not evaluated) and ``global_step``. A group's values are the means over its
    runs (geometric for κ).

    ``metric`` defaults to :func:`hf_condinit.reporting.plots.common_metric` of all the runs."""
    flat = [r for item in runs for r in (item.runs if isinstance(item, RunGroup) else [item])]
    metric = metric or common_metric(flat)
    stats = [_arm_stats(item, metric) for item in runs]
    lower = lower_is_better(metric) if metric else True
    rows = []
    for i, s in enumerate(stats):
        others = [o["final"] for j, o in enumerate(stats) if j != i and o["final"] is not None]
        target = (min(others) if lower else max(others)) if others else None
        reached = steps_to_reach(*s["curve"], target, lower) if target is not None else None
        row = {k: v for k, v in s.items() if k != "curve"}
        row.update(metric=metric, target=target, steps_to_target=reached)
        rows.append(row)
    return rows


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e4 or 0 < abs(value) < 1e-3 else f"{value:.{digits}g}"
    return str(value)


def format_table(rows: Sequence[dict]) -> str:
    """The rows of :func:`compare_table` as a Markdown table (one header line, one line per row)."""
    metric = next((r["metric"] for r in rows if r.get("metric")), None) or "metric"
    header = ["arm", "init recipe", f"final {metric}", "steps to best other's final", "κ first (@step)",
              "κ last (@step)", "tokens/s", "tokens/s measured on"]
    blimp = any(r.get("blimp_accuracy") is not None for r in rows)
    if blimp:
        header.append("BLiMP acc")
    align = ["---"] * 2 + ["---:"] * 5 + ["---"] + ["---:"] * (len(header) - 8)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        if r.get("steps_to_target") is not None:
            steps = f"{r['steps_to_target']} (target {_fmt(r['target'])})"
        else:
            steps = "—" if r.get("target") is None else f"not reached (target {_fmt(r['target'])})"
        kappa = [("≥" if r.get(k + "_lower_bound") and r.get(k) is not None else "") + _fmt(r.get(k))
                 + (f" @{r[k + '_step']}" if r.get(k) is not None else "") for k in ("kappa_start", "kappa_end")]
        tps = r.get("tokens_per_second")
        on = r.get("tokens_per_second_on") or ("—" if tps is None else "not recorded")
        cells = [r["arm"], r["recipe"], _fmt(r.get("final")), steps, *kappa,
                 "—" if tps is None else f"{tps:,.0f}", on]
        if blimp:
            cells.append(_fmt(r.get("blimp_accuracy")))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if any(r.get(k + "_lower_bound") and r.get(k) is not None for r in rows for k in ("kappa_start", "kappa_end")):
        lines += ["", KAPPA_LOWER_BOUND_NOTE]
    return "\n".join(lines) + "\n"


# ---- seeds grouped into arms, and the paired verdict ---------------------------------------------------------------

_HYPERPARAMETER = re.compile(r"^- (seed|learning_rate): (\S+)\s*$", re.M)


def training_facts(run: RunSummary) -> dict:
    """``seed``, ``learning_rate`` (the model card's hyperparameter lines; the recipe's seed when there is no card),
    ``device`` (``train_results.json``'s ``train_machine``) and ``data`` (a digest of the card's "Training and
    evaluation data" section); None for what the folder does not say."""
    card = os.path.join(run.path, "README.md")
    text = open(card, encoding="utf-8", errors="replace").read() if os.path.isfile(card) else ""
    found = dict(_HYPERPARAMETER.findall(text))
    section = re.search(r"^## Training and evaluation data\n(.*?)(?=^## )", text, re.M | re.S)
    seed = found.get("seed", run.condinit.get("seed"))
    return dict(seed=None if seed is None else int(seed),
                learning_rate=float(found["learning_rate"]) if "learning_rate" in found else None,
                device=run.final_metrics.get("train_machine"),
                data=hashlib.sha256(section.group(1).encode()).hexdigest()[:12] if section else None)


@dataclass
class Arm:
    """The runs of one recipe at one learning rate, by seed; ``label`` names it in tables."""

    label: str
    recipe: str
    learning_rate: float | None
    runs: dict = field(default_factory=dict)  # seed -> RunSummary

    def item(self) -> Union[RunSummary, RunGroup]:
        """What :func:`compare_table` takes: the run itself when there is one, else a :class:`RunGroup`."""
        runs = list(self.runs.values())
        return runs[0] if len(runs) == 1 else RunGroup(self.label, runs)


def _rate(lr: float | None) -> str:
    return "—" if lr is None else f"{lr:g}"


def group_runs(runs: Sequence[RunSummary]) -> list[Arm]:
    """Runs with the same recipe (seed aside) and learning rate, with distinct known seeds, as one :class:`Arm`
    each, in the order of their first run; a run whose seed is unknown or already in its group is an arm of its own
    (labelled by its folder name, as is an arm of one run)."""
    arms: list[Arm] = []
    open_groups: dict = {}
    for run in runs:
        facts = training_facts(run)
        recipe = _recipe(RunGroup("", [run]))
        key = (recipe, facts["learning_rate"])
        arm = open_groups.get(key)
        if arm is None or facts["seed"] is None or facts["seed"] in arm.runs:
            arm = Arm(run.name, recipe, facts["learning_rate"])
            arms.append(arm)
            if facts["seed"] is not None:
                open_groups[key] = arm
        arm.runs[facts["seed"]] = run
    for arm in arms:
        if len(arm.runs) > 1:
            arm.label = f"{arm.recipe} @ lr {_rate(arm.learning_rate)}"
    return arms


def choose_baselines(arms: Sequence[Arm], baseline: str | None = None) -> tuple[list[tuple[Arm, Arm]], list[str]]:
    """``(pairs, warnings)``: each arm whose recipe is not the baseline's, with the baseline arm it is compared with
    (module docstring: same rate, else the baseline's best rate), and one warning per pair at different rates
    unless both recipes ran at several rates. ``baseline``: a recipe or a label; default: the model's default init
    ("default" / "model default" recipe), else the first arm. ``ValueError`` for a ``baseline`` no arm has."""
    if baseline is not None:
        base = next((a.recipe for a in arms if baseline in (a.recipe, a.label)), None)
        if base is None:
            names = sorted({a.recipe for a in arms} | {a.label for a in arms})
            raise ValueError(f"--baseline {baseline!r}: no run has that recipe or label; known: {', '.join(names)}")
    else:
        base = next((a.recipe for a in arms if a.recipe in ("default", "model default")), arms[0].recipe)
    bases = [a for a in arms if a.recipe == base]
    rates = {}
    for a in arms:
        rates.setdefault(a.recipe, set()).add(a.learning_rate)
    metric = common_metric([r for a in arms for r in a.runs.values()])
    lower = lower_is_better(metric) if metric else True

    def mean_final(a: Arm) -> float:
        xs = [v for v in (_final_value(r, metric) for r in a.runs.values()) if v is not None] if metric else []
        return (sum(xs) / len(xs)) * (1 if lower else -1) if xs else math.inf

    best = min(bases, key=mean_final)
    pairs, warnings = [], []
    for a in arms:
        if a.recipe == base:
            continue
        partner = next((b for b in bases if b.learning_rate == a.learning_rate), best)
        pairs.append((a, partner))
        if partner.learning_rate != a.learning_rate and not (len(rates[a.recipe]) > 1 and len(rates[base]) > 1):
            warnings.append(f"warning: {a.label} ran at learning rate {_rate(a.learning_rate)} and {partner.label} at "
                            f"{_rate(partner.learning_rate)}, without a grid of rates for both: the difference may be "
                            "the rates', not the recipes' (python -m hf_condinit.study --lr ... picks each arm's "
                            "rate on a grid)")
    return pairs, warnings


def paired_rows(pairs: Sequence[tuple[Arm, Arm]], metric: str) -> list[dict]:
    """One row per ``(arm, baseline)`` pair: ``arm``, ``baseline`` (labels), ``lr``, ``baseline_lr``, ``verdict``
    (:func:`hf_condinit.stats.judge` of the paired differences of the final ``metric``, every row one family),
    ``steps_to_baseline`` (mean over the arm's seeds of :func:`hf_condinit.stats.crossing_step` to the baseline's
    mean final value, and ``reached`` of ``n``), ``flat`` (:func:`hf_condinit.stats.flat_curve` of the arm's eval
    curves) and ``baseline_flat``."""
    lower = lower_is_better(metric)

    def side(arm: Arm) -> dict:
        out = {}
        for seed, run in arm.runs.items():
            facts = training_facts(run)
            out[seed] = dict(value=_final_value(run, metric), device=facts["device"], batches=facts["data"])
        return out

    def curves(arm: Arm) -> list:
        return [list(zip(*r.eval_curve(metric))) for r in arm.runs.values()]

    def flat(arm: Arm) -> dict:
        steps = max((r.global_step or 0) for r in arm.runs.values())
        return stats.flat_curve(curves(arm) if steps else [], steps or 1)

    verdicts = stats.judge({i: stats.paired(side(a), side(b)) for i, (a, b) in enumerate(pairs)},
                           higher_is_better=not lower)
    rows = []
    for i, (a, b) in enumerate(pairs):
        finals = [v["value"] for v in side(b).values() if v["value"] is not None]
        target = sum(finals) / len(finals) if finals else None
        cross = [stats.crossing_step(c, target, lower) for c in curves(a)] if target is not None else []
        reached = [c for c in cross if c is not None]
        rows.append(dict(arm=a.label, baseline=b.label, lr=a.learning_rate, baseline_lr=b.learning_rate,
                         metric=metric, verdict=verdicts[i], target=target,
                         steps_to_baseline=sum(reached) / len(reached) if reached else None,
                         reached=len(reached), n=len(cross), flat=flat(a), baseline_flat=flat(b)))
    return rows


def format_paired(rows: Sequence[dict], warnings: Sequence[str] = ()) -> str:
    """The rows of :func:`paired_rows` as a Markdown table with its caption (the verdict rule, the baseline's eval
    curve) and the warnings."""
    metric = rows[0]["metric"]
    flat_word = {True: "flat", False: "falling", None: "not known"}
    lines = [f"| arm | lr | against | its lr | Δ final {metric}, mean [95 % interval] verdict | n pairs | steps to "
             "baseline's final | eval curve |", "|---|---:|---|---:|---|---:|---:|---|"]
    for r in rows:
        steps = "—" if r["n"] == 0 else (f"{r['steps_to_baseline']:.0f} ({r['reached']} of {r['n']} seeds)"
                                         if r["reached"] else f"not reached ({r['n']} seeds)")
        lines.append("| " + " | ".join([r["arm"], _rate(r["lr"]), r["baseline"], _rate(r["baseline_lr"]),
                                         stats.fmt(r["verdict"], 4), str(r["verdict"]["n"]), steps,
                                         flat_word[r["flat"]["flat"]]]) + " |")
    family = rows[0]["verdict"]["family_size"]
    baselines = {}
    for r in rows:
        baselines.setdefault(r["baseline"], r["baseline_flat"])
    lines += ["", stats.family_caption("this table's rows (every arm against the baseline)", family)]
    for text in [*(stats.flat_sentence(f, who) for who, f in baselines.items()), *warnings]:
        lines += ["", text]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-condinit-compare",
        description="Compare finished runs (their --output_dir folders): a table on stdout; with --out, the table "
                    "and overlay figures written there.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="output folder of a finished run")
    p.add_argument("--out", default=None,
                   help=f"folder for {TABLE_FILE}, {EVAL_FIGURE} and {KAPPA_FIGURE} (default: none, nothing written)")
    p.add_argument("--metric", help="evaluation metric to compare (default: each run's own: recall accuracy for the "
                                    "synthetic task, accuracy for classification, eval_loss for LM runs on text)")
    p.add_argument("--baseline", help="recipe or arm label every other arm is paired with (default: the model's "
                                      "default init, else the first run's recipe)")
    return p


def write_figures(runs: Sequence[RunSummary], out: str, metric: str | None) -> list[str]:
    """Draw ``compare_eval.png`` / ``compare_kappa.png`` into ``out``; a figure whose runs have fewer than two
    points each is skipped with the reason. Returns one line per figure (written, or why not)."""
    lines = []
    if not metric:
        lines.append("no evaluation metric common to the runs: no eval figure")
    elif max(len(r.eval_curve(metric)[0]) for r in runs) < 2:
        lines.append(f"one {metric} per run: no eval figure, the table says it all (evaluate during training, "
                     f"e.g. --eval_strategy steps --eval_steps N, for a curve)")
    else:
        lines.append(f"wrote {plot_eval_curves(runs, os.path.join(out, EVAL_FIGURE), metric)}")
    if not any(r.kappa for r in runs):
        lines.append("no run logged κ (--log_condition_number_every): no κ figure")
    elif max(len(r.kappa) for r in runs) < 2:
        lines.append("one κ measurement per run: no κ figure (see the table)")
    else:
        lines.append(f"wrote {plot_kappa(runs, os.path.join(out, KAPPA_FIGURE))}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code (0, or 2 for a user error, reported in one line)."""
    args = _parser().parse_args(argv)
    try:
        runs = [load_run(path) for path in args.runs]
        names = [r.name for r in runs]
        for run, path in zip(runs, args.runs):
            if names.count(run.name) > 1:  # two folders with the same name: label them by the path given
                run.name = path
        if args.metric and not all(r.eval_curve(args.metric)[0] for r in runs):
            missing = [r.name for r in runs if not r.eval_curve(args.metric)[0]]
            raise ValueError(f"--metric {args.metric}: not evaluated in {', '.join(missing)}")
        if args.out is not None:
            check_writable_folder(args.out, "--out")  # a file there, or no write permission: one line, exit 2
        arms = group_runs(runs)
        pairs, warnings = choose_baselines(arms, args.baseline)
    except ValueError as e:  # NotARunFolderError included
        print(f"hf-condinit-compare: error: {e}", file=sys.stderr)
        return 2
    rows = compare_table([a.item() for a in arms], args.metric)
    table = format_table(rows)
    if pairs and rows[0]["metric"]:
        table += "\n" + format_paired(paired_rows(pairs, rows[0]["metric"]), warnings)
    print(table)
    if args.out is None:
        return 0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, TABLE_FILE), "w", encoding="utf-8") as f:
        f.write(table)
    print(f"wrote {os.path.join(args.out, TABLE_FILE)}")
    for line in write_figures(runs, args.out, rows[0]["metric"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
