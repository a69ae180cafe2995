"""The report of ``compare.py --task vision`` (``_vision``'s docstring), read only from the run records under
``<out>/runs``: per setting and arm the test accuracy mean ± std over seeds, the paired difference to default with
its verdict, the steps to reach default's final curve accuracy (:func:`crossing_step`), step-0 diagnostics and κ
(:func:`aggregate`), the Markdown (:func:`markdown`) and figures (:func:`plots`); :func:`collect` /
:func:`report` put them together."""

from __future__ import annotations

import json
import os

import _common as C
from hf_condinit import stats as V


def crossing_step(curve: list[dict], target: float) -> float | None:
    """First step at which the accuracy curve reaches ``target`` (linear interpolation between points); None if
    never."""
    return C.crossing_step([(p["step"], p["accuracy"]) for p in curve], target, lower_better=False)


def aggregate(recs: list[dict], arms) -> dict:
    """Per arm of one setting: accuracy / loss mean ± std, paired Δ to default, steps to default's final curve
    accuracy, κ at init and end (first seed), step-0 diagnostics (first seed), mean curves; the arms in the order of
    ``arms`` (``_vision.ARMS``)."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in recs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    default = by_arm.get("default", {})
    target = V.mean_std([r["curve"][-1]["accuracy"] for r in default.values()])[0]
    out = {}
    for arm in [a for a in arms if a in by_arm]:
        runs = by_arm[arm]
        seeds = sorted(runs)
        acc = [runs[s]["test_accuracy"] for s in seeds]
        loss = [runs[s]["test_loss"] for s in seeds]
        paired = V.paired({s: V.entry(runs[s], runs[s]["test_accuracy"]) for s in seeds},
                          {s: V.entry(r, r["test_accuracy"]) for s, r in default.items()})
        steps_to = [crossing_step(runs[s]["curve"], target) if target is not None else None for s in seeds]
        first = runs[seeds[0]]
        steps = sorted({p["step"] for s in seeds for p in runs[s]["curve"]})
        mean_curve = [dict(step=st, accuracy=V.mean_std([p["accuracy"] for s in seeds for p in runs[s]["curve"]
                                                          if p["step"] == st])[0],
                           loss=V.mean_std([p["loss"] for s in seeds for p in runs[s]["curve"] if p["step"] == st])[0])
                      for st in steps]
        tsteps = sorted({p["step"] for s in seeds for p in runs[s]["train_curve"]})
        train_curve = [dict(step=st, loss=V.mean_std([p["loss"] for s in seeds for p in runs[s]["train_curve"]
                                                       if p["step"] == st])[0]) for st in tsteps]
        kinit = next((runs[s]["kappa_init"] for s in seeds if runs[s].get("kappa_init")), None)
        kend = next((runs[s]["kappa_end"] for s in seeds if runs[s].get("kappa_end")), None)
        out[arm] = dict(
            seeds=seeds, test_accuracy=acc, acc_mean=V.mean_std(acc)[0], acc_std=V.mean_std(acc)[1],
            test_loss=loss, loss_mean=V.mean_std(loss)[0], loss_std=V.mean_std(loss)[1],
            paired_delta=paired, delta_mean=V.mean_std(paired.values())[0],
            delta_std=V.mean_std(paired.values())[1], devices=sorted({runs[s].get("device") or "?" for s in seeds}),
            steps_to_default_final=steps_to, default_final_curve_accuracy=target,
            run_steps=first["spec"]["steps"], initial_curve_loss=V.mean_std([runs[s]["curve"][0]["loss"]
                                                                               for s in seeds])[0],
            kappa_init=kinit, kappa_end=kend, step0=first["step0"], curve=mean_curve, train_curve=train_curve,
            images_per_second=V.mean_std([runs[s]["train_images_per_second"] for s in seeds])[0],
        )
    return out


def _f(x, nd=3):
    if x is None:
        return "–"
    if isinstance(x, float) and (abs(x) >= 1e4 or (x != 0 and abs(x) < 1e-3)):
        return f"{x:.2e}"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _pct(m, s):
    return "–" if m is None else f"{100 * m:.2f} ± {100 * s:.2f}"


def markdown(results: dict) -> str:
    lines = ["# Vision: ViT on CIFAR-10 (benchmarks/compare.py --task vision)", ""]
    spec = results.get("spec", {})
    lines.append(f"Model `{spec.get('model_config')}` (overrides: {spec.get('config_overrides')}), "
                 f"{spec.get('steps')} steps × batch {spec.get('batch_size')}, AdamW lr {spec.get('lr')} cosine, "
                 f"weight decay {spec.get('weight_decay')}, random crop (pad 4) + flip. Top-1 on "
                 f"{results['n_test']} test_dev images; Δ = paired difference to default over seeds (percentage "
                 f"points).")
    lines.append("Seed paper Table 2 (ViT-T, CIFAR-10, full training, top-1 %): default 92.4 / mimetic 93.6 / "
                 "conditioned 94.1 — a far larger scale: compare the arms with each other.")
    lines.append("")
    verdicts = V.judge({(name, arm): a["paired_delta"] for name, arms in results["settings"].items()
                        for arm, a in arms.items() if arm != "default"}, higher_is_better=True)
    for name, arms in results["settings"].items():
        n = next(iter(arms.values()))
        lines.append(f"## {name}: {results['n_train'].get(name)} training images")
        lines.append("")
        lines.append("| arm | seeds | device | top-1 % (mean ± std) | Δ vs default (pp), paired: mean [95 % CI] "
                     "verdict | test loss | steps to default's final curve acc | κ init (mean / max) | "
                     "κ end (mean / max) | images/s |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for arm, a in arms.items():
            d = "–" if arm == "default" else V.fmt(verdicts.get((name, arm)), 2, 100)
            st = [s for s in a["steps_to_default_final"]]
            st_txt = ", ".join("never" if s is None else f"{s:.0f}" for s in st)
            ki, ke = a["kappa_init"], a["kappa_end"]
            kit = "–" if not ki else f"{_f(ki['mean'], 0)} / {_f(ki['max'], 0)} ({ki['n_saturated']} sat.)"
            ket = "–" if not ke else f"{_f(ke['mean'], 0)} / {_f(ke['max'], 0)} ({ke['n_saturated']} sat.)"
            lines.append(f"| {arm} | {len(a['seeds'])} | {', '.join(a['devices'])} | "
                         f"{_pct(a['acc_mean'], a['acc_std'])} | {d} | "
                         f"{_f(a['loss_mean'])} | {st_txt} (of {a['run_steps']}) | {kit} | {ket} | "
                         f"{_f(a['images_per_second'], 0)} |")
        lines.append("")
        lines.append(C.family_caption("the Δ cells of both settings' tables (every arm against default)",
                                      len([v for v in verdicts.values() if v["n"] >= 2])))
        lines.append("")
        lines.append(f"Default's final curve accuracy (1,000-image subset): {_f(n['default_final_curve_accuracy'])}. "
                     "κ: one test image, layers " + ", ".join(str(l["layer"]) for l in (n["kappa_init"] or n["kappa_end"] or {"layers": []})["layers"]) +
                     ", first seed; \"sat.\": heads whose κ hit the float64 resolution (their value is a lower bound).")
        lines.append("")
        lines.append("Step-0 diagnostics (first seed; per layer first / last): attention entropy vs uniform log N, "
                     "logit std, max prob, RMS of X / Q / K / V / attention output; initial curve loss.")
        lines.append("")
        lines.append("| arm | entropy (first, last) / log N | logit std | max prob | X rms | Q rms | K rms | V rms | "
                     "attn out rms | logits std | initial loss |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for arm, a in arms.items():
            L = a["step0"]["layers"]
            fl = (L[0], L[-1])

            def pair(key):
                return " / ".join(_f(l[key], 2) for l in fl)

            lines.append(f"| {arm} | {pair('attn_entropy')} / {_f(L[0]['uniform_entropy'], 2)} | {pair('logit_std')} | "
                         f"{pair('max_prob')} | {pair('x_rms')} | {pair('q_rms')} | {pair('k_rms')} | {pair('v_rms')} "
                         f"| {pair('attn_out_rms')} | {_f(a['step0']['logits_std'], 3)} | "
                         f"{_f(a['initial_curve_loss'])} |")
        lines.append("")
    lines.append(f"Runs: {results['n_runs']}; total training time {results['total_train_seconds']:.0f} s "
                 "(shared machine: see each run's loadavg_1m_at_end).")
    return "\n".join(lines) + "\n"


def plots(results: dict, out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    written = []
    for fname, what in (("accuracy.png", "accuracy"), ("loss.png", "loss")):
        fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
        for ax, name in zip(axes[0], names):
            for arm, a in results["settings"][name].items():
                if what == "accuracy":
                    xs = [p["step"] for p in a["curve"]]
                    ax.plot(xs, [100 * p["accuracy"] for p in a["curve"]], marker="o", label=arm)
                else:
                    ax.plot([p["step"] for p in a["train_curve"]], [p["loss"] for p in a["train_curve"]],
                            label=f"{arm} (train)")
            ax.set_title(f"{name}: {results['n_train'].get(name)} images")
            ax.set_xlabel("step")
            ax.set_ylabel("test_dev subset top-1 %" if what == "accuracy" else "training loss (mean over seeds)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def collect(out: str, arms) -> dict:
    """Read only: the aggregate of the finished records under ``out``/runs (what ``results.json`` holds)."""
    recs: dict[str, list] = {}
    runs_dir = os.path.join(out, "runs")
    for root, _, files in os.walk(runs_dir):
        for fn in sorted(files):
            if fn.endswith(".json"):
                with open(os.path.join(root, fn)) as f:
                    r = json.load(f)
                recs.setdefault(r["setting"], []).append(r)
    if not recs:
        raise SystemExit(f"no finished runs under {runs_dir}")
    order = sorted(recs, key=lambda n: (n != "full", n))
    any_rec = recs[order[0]][0]
    spec = {k: v for k, v in any_rec["spec"].items() if k not in ("arm", "seed", "setting", "n_train")}
    results = {"spec": spec,
               "n_train": {n: recs[n][0]["n_train"] for n in order}, "n_test": any_rec["n_test"],
               "settings": {n: aggregate(recs[n], arms) for n in order},
               "n_runs": sum(len(v) for v in recs.values()),
               "total_train_seconds": sum(r["train_seconds"] for v in recs.values() for r in v)}
    for arms in results["settings"].values():
        for arm, a in arms.items():
            if a["kappa_init"] is None:
                a["kappa_init"] = next((o[arm]["kappa_init"] for o in results["settings"].values()
                                        if arm in o and o[arm]["kappa_init"]), None)
    return results


def report(out: str, arms) -> dict:
    results = collect(out, arms)
    results["machine"] = C.machine_info()  # where the report was made (not in markdown)
    C.write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(results))
    results["plots"] = plots(results, out)
    return results
