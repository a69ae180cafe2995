"""The report of ``compare.py``'s LM mode, read only from the run records under ``<out>/runs``: the aggregate per
setting and arm (:func:`collect`: perplexity mean ± std over seeds, the paired difference to default with its 95 %
interval and verdict, steps to default's final loss, κ(J), step-0 diagnostics), its Markdown (:func:`markdown`) and
its figures (:func:`plots`). ``findings.py`` reads the committed records through the same functions."""

from __future__ import annotations

import json
import math
import os
import statistics

import _common as C
import _lm_zero_shot as ZS
from hf_condinit import stats as V
from _common import fail
from _lm_run import GAIN_KEYS, SWEEP_KEYS

def eval_file_stats(name: str, seeds: dict, default: dict) -> dict:
    """Loss / perplexity on one ``--eval-file`` over seeds (mean ± std) and, given the default arm's runs, the
    paired loss difference to default (``hf_condinit.stats.paired``: same device and batches; mean ± std)."""
    loss = {s: r["eval_files"][name]["loss"] for s, r in sorted(seeds.items()) if name in r.get("eval_files", {})}
    ppl = [math.exp(v) if v < 700 else float("inf") for v in loss.values()]
    out = dict(seeds=list(loss), loss=list(loss.values()), ppl=ppl)
    out["loss_mean"], out["loss_std"] = V.mean_std(out["loss"])
    out["ppl_mean"], out["ppl_std"] = V.mean_std(ppl)
    if default:
        side = lambda runs: {s: V.entry(r, r.get("eval_files", {}).get(name, {}).get("loss"))  # noqa: E731
                             for s, r in runs.items()}
        diffs = list(V.paired(side(seeds), side(default)).values())
        out["delta_loss_vs_default"] = diffs
        out["delta_mean"], out["delta_std"] = V.mean_std(diffs)
    return out


def aggregate_setting(recs: list[dict]) -> dict:
    by_arm: dict[str, dict[int, dict]] = {}
    for r in recs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    out = {"arms": {}}
    family: dict = {}  # (arm, "loss" | "blimp") -> seed -> paired Δ: the verdicts of one table (hf_condinit.stats.judge)
    default = by_arm.get("default", {})
    target = None
    if default:
        target = statistics.fmean(r["eval_curve"][-1][1] for r in default.values())
        out["target_eval_loss"] = target
    for arm, seeds in by_arm.items():
        rs = [seeds[s] for s in sorted(seeds)]
        losses = [r["final_eval_loss"] for r in rs]
        ppls = [r["final_eval_ppl"] for r in rs]
        lm, ls = V.mean_std(losses)
        pm, ps = V.mean_std(ppls)
        steps_total = rs[0]["spec"]["steps"]
        a = dict(seeds=sorted(seeds), final_eval_loss=losses, final_eval_ppl=ppls, loss_mean=lm, loss_std=ls,
                 ppl_mean=pm, ppl_std=ps, steps=steps_total,
                 initial_eval_loss=V.mean_std([r["initial_eval_loss"] for r in rs])[0],
                 tokens_per_s=V.mean_std([r["tokens_per_s"] for r in rs])[0],
                 train_seconds=V.mean_std([r["train_seconds"] for r in rs])[0],
                 epochs=rs[0].get("epochs"), diverged=[r["seed"] for r in rs if "diverged_at" in r],
                 n_params=rs[0]["n_params"], n_params_non_embedding=rs[0]["n_params_non_embedding"],
                 tokens_seen=rs[0]["tokens_seen"],
                 tokens_per_param=rs[0]["tokens_seen"] / rs[0]["n_params_non_embedding"],
                 devices=sorted({r.get("device") or "unknown" for r in rs}))
        acc = [ZS.blimp_accuracy(r) for r in rs]
        a["blimp_accuracy"] = acc
        a["blimp_mean"], a["blimp_std"] = V.mean_std(acc)
        if arm != "default" and default:
            d_acc = V.paired({s: V.entry(r, ZS.blimp_accuracy(r)) for s, r in seeds.items()},
                             {s: V.entry(r, ZS.blimp_accuracy(r)) for s, r in default.items()})
            a["delta_blimp_vs_default"] = list(d_acc.values())
            a["delta_blimp_mean"], a["delta_blimp_std"] = V.mean_std(list(d_acc.values()))
            family[(arm, "blimp")] = d_acc
        files = sorted({n for r in rs for n in r.get("eval_files", {})})
        if files:
            a["eval_files"] = {name: eval_file_stats(name, seeds, default if arm != "default" else {})
                               for name in files}
        if target is not None:
            cross = [C.crossing_step(r["eval_curve"], target) for r in rs]
            reached = [c for c in cross if c is not None]
            a["steps_to_default_final"] = cross
            a["steps_to_default_final_mean"] = statistics.fmean(reached) if reached else None
            a["n_reached"] = len(reached)
            a["ratio_to_run_length"] = (a["steps_to_default_final_mean"] / steps_total) if reached else None
        if arm != "default" and default:
            diffs = V.paired({s: V.entry(r, r["final_eval_loss"]) for s, r in seeds.items()},
                             {s: V.entry(r, r["final_eval_loss"]) for s, r in default.items()})
            a["delta_loss_vs_default"] = list(diffs.values())
            a["delta_mean"], a["delta_std"] = V.mean_std(list(diffs.values()))
            family[(arm, "loss")] = diffs
        # κ curve (runs that measured it)
        kruns = [r for r in rs if r.get("kappa")]
        if kruns:
            kr = kruns[0]
            a["kappa_seed"] = kr["seed"]
            a["kappa"] = [{k: v for k, v in m.items() if k != "layers"} | {
                "layer_mean": [l["mean"] for l in m["layers"]],
                "layer_unmasked_mean": [l.get("unmasked_mean") for l in m["layers"]],
                "layer_bound": [l["bound"] for l in m["layers"]],
                "layer_kappa_p": [l["kappa_p"] for l in m["layers"]],
                "layer_kappa_px": [l["kappa_px"] for l in m["layers"]]} for m in kr["kappa"]]
        s0 = rs[0]["step0"]
        a["step0"] = dict(
            uniform_causal_entropy=s0["uniform_causal_entropy"],
            attn_entropy=[l["attn_entropy"] for l in s0["layers"]],
            logit_std=[l["logit_std"] for l in s0["layers"]],
            max_prob=[l["max_prob"] for l in s0["layers"]],
            x_rms=[l["x_rms"] for l in s0["layers"]], q_rms=[l["q_rms"] for l in s0["layers"]],
            v_rms=[l["v_rms"] for l in s0["layers"]], attn_out_rms=[l["attn_out_rms"] for l in s0["layers"]],
            resid_rms=[l["resid_rms"] for l in s0["layers"]], logits_std=s0["logits_std"])
        a["eval_curves"] = {r["seed"]: r["eval_curve"] for r in rs}
        a["train_curves"] = {r["seed"]: [[t[0], t[1]] for t in r["train_curve"]] for r in rs}
        out["arms"][arm] = a
    out["verdict_family_size"] = {}
    for what in ("loss", "blimp"):  # one family per metric column of the table
        verdicts = V.judge({arm: d for (arm, w), d in family.items() if w == what}, higher_is_better=what == "blimp")
        for arm, v in verdicts.items():
            out["arms"][arm][f"{what}_verdict"] = v
        out["verdict_family_size"][what] = len([v for v in verdicts.values() if v["n"] >= 2])
    return out


def _fmt(x, nd=3):
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, float) and (abs(x) >= 1e4 or (0 < abs(x) < 1e-3)):
        return f"{x:.2e}"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _pct(x, sign=False):
    """A 0-1 accuracy (or difference) in percent (points), "–" when missing."""
    if x is None:
        return "–"
    return f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}"


def arm_order(arms):
    order = list(C.ARMS)
    return sorted(arms, key=lambda a: order.index(a) if a in order else len(order))


def markdown(results: dict) -> str:
    lines = []
    base = results["settings"].get("base")
    info = results["data"]
    lines.append(f"Data: `{os.path.basename(info.get('path', '?'))}`, {info.get('train_tokens')} training tokens, "
                 f"{info.get('val_tokens')} held-out tokens (BPE vocab {info.get('vocab_size')}, block "
                 f"{info.get('block_size')}).\n")
    if base:
        spec = results["base_spec"]
        a0 = next(iter(base["arms"].values()))
        lines.append(f"Model: GPT-2 {spec['n_layer']} layers × {spec['n_embd']} wide, {spec['n_head']} heads, context "
                     f"{spec['block_size']}; {spec['steps']} steps × batch {spec['batch_size']} × {spec['block_size']}"
                     f" tokens = {a0.get('epochs', 0):.2f} epochs of the training split; AdamW lr {spec['lr']}, "
                     f"β (0.9, 0.95), wd 0.1, warmup {spec['warmup']}, cosine, clip 1.0.\n")
        devices = sorted({d for a in base["arms"].values() for d in a["devices"]})
        flat = V.flat_curve(base["arms"]["default"]["eval_curves"].values(), spec["steps"]) \
            if "default" in base["arms"] else None
        lines.append(f"Parameters: {a0['n_params']:,} ({a0['n_params_non_embedding']:,} non-embedding); tokens seen "
                     f"{a0['tokens_seen']:,} = {a0['tokens_seen'] / a0['n_params']:.3f} tokens per parameter "
                     f"({a0['tokens_per_param']:.3f} per non-embedding parameter), {a0['epochs']:.2f} epochs"
                     + (": training blocks are seen more than once" if a0["epochs"] > 1 else "")
                     + f". Ran on: {', '.join(devices)}. {C.flat_sentence(flat)}\n")
        lines.append("| arm | seeds | eval ppl (mean ± std) | eval loss | Δ loss vs default, paired: mean [95 % CI] "
                     "verdict | BLiMP acc. % (mean ± std) | Δ BLiMP pts, paired: mean [95 % CI] verdict | "
                     "steps to default's final loss (ratio) | tokens/s |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            a = base["arms"][arm]
            st = a.get("steps_to_default_final_mean")
            reach = (f"{st:.0f} ({a['ratio_to_run_length']:.2f}), {a['n_reached']}/{len(a['seeds'])} seeds"
                     if st is not None else f"not reached (0/{len(a['seeds'])})")
            lines.append(f"| {arm} | {len(a['seeds'])} | {_fmt(a['ppl_mean'], 2)} ± {_fmt(a['ppl_std'], 2)} | "
                         f"{_fmt(a['loss_mean'])} | {V.fmt(a.get('loss_verdict'))} | {_pct(a.get('blimp_mean'))} ± "
                         f"{_pct(a.get('blimp_std'))} | {V.fmt(a.get('blimp_verdict'), 2, 100)} | {reach} | "
                         f"{_fmt(a['tokens_per_s'], 0)} |")
        lines.append("")
        lines.append(C.family_caption("this table's Δ loss cells (arms against default)",
                                      base["verdict_family_size"]["loss"])
                     + " The Δ BLiMP column is its own family of "
                     f"{base['verdict_family_size']['blimp']} cells.")
        lines.append("")
        files = sorted({n for a in base["arms"].values() for n in a.get("eval_files", {})})
        if files:
            lines.append("Perplexity on the `--eval-file` texts (every document, same tokenizer and blocks; mean ± std "
                         "over seeds; Δ = paired loss difference to default):\n")
            lines.append("| arm | " + " | ".join(f"{n} ppl | Δ loss" for n in files) + " |")
            lines.append("|---|" + "---|---|" * len(files))
            for arm in arm_order(base["arms"]):
                cells = []
                for n in files:
                    e = base["arms"][arm].get("eval_files", {}).get(n)
                    if e is None:
                        cells += ["–", "–"]
                        continue
                    cells.append(f"{_fmt(e['ppl_mean'], 2)} ± {_fmt(e['ppl_std'], 2)}")
                    cells.append("–" if "delta_mean" not in e else f"{_fmt(e['delta_mean'])} ± {_fmt(e['delta_std'])}")
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
            lines.append("")
        lines.append("κ(J) of the attention Jacobian (mean over layers of the per-layer mean over heads; probe "
                     f"{spec['kappa_probe'][0]} × {spec['kappa_probe'][1]} held-out tokens; causal = the mask the "
                     "model uses, unmasked = same heads without it; surrogate = the papers' S of docs/methods.md §1, causal, "
                     "which is not an upper bound of κ):\n")
        lines.append("| arm | step | κ causal | κ unmasked | surrogate | κ(P) layer 0 | saturated heads | s/measurement |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            for m in base["arms"][arm].get("kappa", []):
                lines.append(f"| {arm} | {m['step']} | {_fmt(m['mean'], 1)} | {_fmt(m.get('unmasked_mean'), 1)} | "
                             f"{_fmt(m['bound_mean'], 1)} | {_fmt(m['layer_kappa_p'][0], 1)} | "
                             f"{m['n_saturated']}/{m['n_heads']} | {_fmt(m['seconds'], 1)} |")
        lines.append("")
        lines.append("Step-0 diagnostics (first seed; per layer 0..L-1): initial eval loss, softmax attention entropy "
                     "(nats; uniform causal attention = "
                     f"{_fmt(next(iter(base['arms'].values()))['step0']['uniform_causal_entropy'], 2)}), std of "
                     "the attention logits, RMS of V and of the attention block output:\n")
        lines.append("| arm | initial loss | attention entropy | logit std | V rms | attn out rms | logits std |")
        lines.append("|---|---|---|---|---|---|---|")
        for arm in arm_order(base["arms"]):
            s = base["arms"][arm]["step0"]
            j = lambda xs, nd=2: " / ".join(_fmt(x, nd) for x in xs)  # noqa: E731
            lines.append(f"| {arm} | {_fmt(base['arms'][arm]['initial_eval_loss'])} | {j(s['attn_entropy'])} | "
                         f"{j(s['logit_std'])} | {j(s['v_rms'])} | {j(s['attn_out_rms'], 3)} | "
                         f"{_fmt(s['logits_std'], 2)} |")
        lines.append("")
    sweep = {k: v for k, v in results["settings"].items() if k != "base"}
    if sweep:
        lines.append("Sweep (conditioned vs default; the default arm of gain-only settings is the base default; "
                     "Δ = conditioned − default final eval loss, paired by seed):\n")
        rows = {name: agg["arms"] for name, agg in results["settings"].items()
                if "conditioned" in agg["arms"] and "default" in agg["arms"]}
        verdicts = V.judge({name: arms["conditioned"].get("loss_verdict", {}).get("diffs", {})
                            for name, arms in rows.items()})
        lines.append("| setting | seeds | default loss | conditioned loss | Δ: mean [95 % CI] verdict | "
                     "cond. step-0 entropy (layers) | default step-0 entropy |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, arms in rows.items():
            c, d = arms["conditioned"], arms["default"]
            j = lambda xs: " / ".join(_fmt(x, 2) for x in xs)  # noqa: E731
            lines.append(f"| {name} | {verdicts[name]['n']} | {_fmt(d['loss_mean'])} | {_fmt(c['loss_mean'])} | "
                         f"{V.fmt(verdicts[name])} | {j(c['step0']['attn_entropy'])} | "
                         f"{j(d['step0']['attn_entropy'])} |")
        lines.append("")
        lines.append(C.family_caption("this table's rows (conditioned against default per setting)",
                                      len([v for v in verdicts.values() if v["n"] >= 2])))
        lines.append("")
    lines.append("BLiMP: accuracy on the minimal pairs of `--blimp-dir` (a pair is right when the grammatical "
                 "sentence has the higher total log-probability, EOS prefix; chance 50 %); '–' = run recorded "
                 "without it.\n")
    lines.append("Steps to default's final loss: first crossing of the mean final eval-curve loss of default "
                 "(eval-curve subset, linear interpolation).")
    return "\n".join(lines) + "\n"


def plots(results: dict, out: str, groups: list) -> list[str]:
    """``loss.png`` (held-out loss vs step per arm, mean over seeds with a ±1 std band: ``hf_condinit.compare``'s
    ``plot_eval_curves`` of one ``RunGroup`` per arm), ``kappa.png`` (κ(J) vs step, ``plot_kappa``, when measured)
    and, with a sweep, ``sweep.png`` (the eval curves of every sweep setting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_condinit.compare import RunGroup, plot_eval_curves, plot_kappa

    written = []
    colors = {a: plt.cm.tab10(i) for i, a in enumerate(C.ARMS)}
    base = results["settings"].get("base")
    if groups:
        written.append(plot_eval_curves(groups, os.path.join(out, "loss.png"), metric="eval_loss"))
        measured = [RunGroup(g.label, [r for r in g.runs if r.kappa]) for g in groups]  # κ: the seeds that measured it
        if any(g.runs for g in measured):
            written.append(plot_kappa([g for g in measured if g.runs], os.path.join(out, "kappa.png")))
    sweep = [(k, v) for k, v in results["settings"].items() if k != "base"]
    if sweep:
        n = len(sweep)
        cols = min(4, n)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
        for ax, (name, agg) in zip(axes.flat, sweep):
            arms = dict(agg["arms"])
            if "default" not in arms and base and "default" in base["arms"]:
                arms["default"] = base["arms"]["default"]
            for arm in arm_order(arms):
                for s, c in arms[arm]["eval_curves"].items():
                    ax.plot([p[0] for p in c], [p[1] for p in c], color=colors.get(arm), lw=1.2,
                            label=arm if str(s) == str(min(arms[arm]["eval_curves"], key=str)) else None)
            ax.set_title(name, fontsize=9)
            lo = min(p[1] for a in arms.values() for c in a["eval_curves"].values() for p in c)
            ax.set_ylim(lo - 0.1, lo + 2.0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        p = os.path.join(out, "sweep.png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written


def base_groups(recs: list[dict]) -> list:
    """One ``hf_condinit.compare.RunGroup`` per arm, in arm order, built from the committed records (so the figures
    come from what is committed, whatever machine each run trained on): :func:`run_from_record`."""
    from hf_condinit.compare import RunGroup

    by_arm: dict[str, list] = {}
    for r in sorted(recs, key=lambda r: r["seed"]):
        by_arm.setdefault(r["arm"], []).append(run_from_record(r))
    return [RunGroup(arm, by_arm[arm]) for arm in arm_order(by_arm)]


def run_from_record(rec: dict):
    """A ``hf_condinit.reporting.runs.RunSummary`` of one run record: its eval curve (``eval_loss`` by step), its
    κ(J) measurements (layer mean and max; a measurement with saturated heads is a lower bound), its recipe."""
    from hf_condinit.reporting.runs import KappaRecord, RunSummary

    kappa = [KappaRecord(step=k["step"], mean=k["mean"], max=k["max"], n_lower_bound=k.get("n_saturated", 0))
             for k in rec.get("kappa") or []]
    return RunSummary(path=rec.get("run_dir", ""), name=f"{rec['arm']}/seed{rec['seed']}", condinit=rec["condinit"],
                      attention=None, recipe=rec["recipe"], log_history=[{"step": s, "eval_loss": v}
                                                                         for s, v in rec["eval_curve"]],
                      final_metrics={}, kappa=kappa, tokens_per_second=rec.get("tokens_per_s"),
                      global_step=rec["steps"])


def collect(out: str) -> tuple[dict, list]:
    """The aggregate of the finished records under ``out``/runs (read only): ``(results, base records)``;
    ``results`` is what ``results.json`` holds and :func:`markdown` reads."""
    recs_by_setting: dict[str, list] = {}
    runs_dir = os.path.join(out, "runs")
    for root, _, files in os.walk(runs_dir):
        for fn in files:
            if fn.endswith(".json"):
                with open(os.path.join(root, fn)) as f:
                    r = json.load(f)
                recs_by_setting.setdefault(r["setting"], []).append(r)
    if not recs_by_setting:
        fail(f"no finished runs under {runs_dir}; run without --report-only first")
    base_recs = recs_by_setting.get("base", [])
    results = {"settings": {},
               "data": (base_recs or next(iter(recs_by_setting.values())))[0]["data"]}
    results["eval_files"] = {n: i for rs in recs_by_setting.values() for r in rs
                             for n, i in r.get("eval_file_info", {}).items()}
    if base_recs:
        spec = dict(base_recs[0]["spec"])
        for k in ("arm", "seed", "setting"):
            spec.pop(k, None)
        results["base_spec"] = spec
    for name in sorted(recs_by_setting, key=lambda n: (n != "base", n)):
        recs = list(recs_by_setting[name])
        if not any(r["arm"] == "default" for r in recs):
            # the default arm ignores the gains: take it from the setting with the same non-gain options
            def core(r):
                return {k: v for k, v in r["spec"].items() if k in SWEEP_KEYS and k not in GAIN_KEYS}

            want = core(recs[0])
            seeds = {r["seed"] for r in recs}
            recs += [r for rs in recs_by_setting.values() for r in rs
                     if r["arm"] == "default" and r["seed"] in seeds and core(r) == want]
        results["settings"][name] = aggregate_setting(recs)
        if name != "base":
            results["settings"][name]["overrides"] = {k: v for k, v in recs[0]["spec"].items() if k in SWEEP_KEYS}
    results["total_train_seconds"] = sum(r["train_seconds"] for rs in recs_by_setting.values() for r in rs)
    results["total_kappa_seconds"] = sum(r["kappa_seconds"] for rs in recs_by_setting.values() for r in rs)
    results["n_runs"] = sum(len(v) for v in recs_by_setting.values())
    return results, base_recs
