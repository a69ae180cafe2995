"""Write README's "What we found" and docs/results.md's result tables from the committed run records.

Every figure in those blocks is computed here from ``benchmarks/results/{compare,scale,depth,vision}/runs`` with the
harness's own aggregation (``_lm_report.collect``, ``_scale_report.collect``, ``_depth_report.collect``, ``_vision_report.collect``: read
only) and judged by the one verdict rule (``hf_condinit.stats``). The blocks sit between markers:

- README.md: ``<!-- BEGIN GENERATED: findings -->`` … ``<!-- END GENERATED: findings -->``;
- docs/results.md: ``<!-- BEGIN GENERATED: results-<mode> -->`` … ``<!-- END GENERATED: results-<mode> -->`` for mode
  compare, scale, depth, vision (each the mode's ``results.md``, headings moved below the page's), and
  ``results-vision-study``: the vision study's report (``hf_condinit.study``) from its committed record in
  ``benchmarks/results/vision_study/study`` (:func:`vision_study_block`: one line while it is missing or unfinished).

    python benchmarks/findings.py            # rewrite the blocks
    python benchmarks/findings.py --check    # exit 1 when a committed block differs (tests/benchmarks/test_findings.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from hf_condinit import stats as V  # noqa: E402

RESULTS = os.path.join(C.REPO_ROOT, "benchmarks", "results")
README = os.path.join(C.REPO_ROOT, "README.md")
RESULTS_DOC = os.path.join(C.REPO_ROOT, "docs", "results.md")
EVAL = "wiki.valid.raw"
VISION_STUDY = os.path.join(RESULTS, "vision_study", "study")


def begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED: {name} -->"


def end(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def splice(text: str, name: str, block: str) -> str:
    """``text`` with the lines between the markers of ``name`` replaced by ``block``; ValueError without them."""
    b, e = begin(name), end(name)
    if b not in text or e not in text:
        raise ValueError(f"markers {b} / {e} not found")
    i, j = text.index(b) + len(b), text.index(e)
    return text[:i] + "\n" + block.strip("\n") + "\n" + text[j:]


def _demote(md: str, levels: int = 2) -> str:
    return "\n".join(("#" * levels + line) if line.startswith("#") else line for line in md.splitlines()) + "\n"


def _dev(devices) -> str:
    words = sorted({"CPU" if d in ("cpu", "CPU") else d.replace("cuda: NVIDIA ", "") for d in devices})
    return " and ".join(words)


def _v(v: dict, nd: int = 3, scale: float = 1.0, unit: str = "") -> str:
    """A verdict record in a sentence: ``+0.590 [+0.399, +0.781]{unit}, n = 3, worse``."""
    if not v or not v.get("n"):
        return "no pairs"
    if v["n"] < 2:
        return f"{scale * v['mean']:+.{nd}f}{unit}, n = 1, {V.NA}"
    return (f"{scale * v['mean']:+.{nd}f}{unit} [{scale * v['lo']:+.{nd}f}, {scale * v['hi']:+.{nd}f}], "
            f"n = {v['n']}, {v['verdict']}")


def collect_all() -> dict:
    """Every mode's aggregate and markdown from the committed records (read only)."""
    import _depth_plan as DP
    import _depth_report as DR
    import _scale_plan as SP
    import _scale_report as SR
    import _vision as VI
    import _vision_report as VR
    import _lm_report as R

    cmp_results, _ = R.collect(os.path.join(RESULTS, "compare"))
    cells, scale, scale_md = SR.collect(os.path.join(RESULTS, "scale"), SP.FULL, EVAL)
    own_grid = dataclasses.replace(DP.FULL, own_grid_depths=(DP.FULL.rate_check_depth,))
    depth_plan = own_grid if DP.plan_finished(os.path.join(RESULTS, "depth"), own_grid, EVAL) else DP.FULL
    depth, depth_md = DR.collect(os.path.join(RESULTS, "depth"), depth_plan, EVAL)
    vision = VR.collect(os.path.join(RESULTS, "vision"), VI.ARMS)
    return dict(compare=cmp_results, compare_md=R.markdown(cmp_results), scale_cells=cells, scale=scale,
                scale_md=scale_md, depth=depth, depth_md=depth_md, vision=vision, vision_md=VR.markdown(vision))


def flat_summary(r: dict) -> str:
    """Which cells' default eval curves are flat by ``hf_condinit.stats.flat_curve`` (the only ones that may be called near
    convergence; the cosine schedule flattens the end of every run, so flat is not enough)."""
    import _scale_plan as SP

    flat, falling = [], []
    spec = r["compare"]["base_spec"]
    d = r["compare"]["settings"]["base"]["arms"]["default"]
    groups = [("the default mode", d["eval_curves"].values(), spec["steps"])]
    for (size, tpp, lr), cell in sorted(r["scale_cells"].items(), key=str):
        if lr == SP.FULL.shared_lr and "default" in cell:
            runs = cell["default"].values()
            groups.append((f"width {size} at {tpp:g} tokens per non-embedding parameter",
                           [x["eval_curve"] for x in runs], next(iter(runs))["steps"]))
    for depth, row in r["depth"]["depths"].items():
        if "default" in row:
            groups.append((f"depth {depth}", row["default"]["eval_curves"], row["default"]["steps"]))
    for name, curves, steps in groups:
        (flat if V.flat_curve(curves, steps)["flat"] else falling).append(name)
    return ("Default's eval curve is still falling over the last third of the run (not flat by "
            "`_verdict.flat_curve`, so not near convergence) in " + ", ".join(falling) + "; flat by that rule in "
            + (", ".join(flat) or "none") + " — through a large seed spread or the cosine schedule's flat end, "
            "which is not convergence either.")


def findings_block(r: dict) -> str:
    """README's "What we found" bullets."""
    import _scale_plan as SP
    import _scale_report as SR

    base = r["compare"]["settings"]["base"]["arms"]
    d0 = base["default"]
    tpp_all = d0["tokens_seen"] / d0["n_params"]
    ppl = lambda a: f"{base[a]['ppl_mean']:.2f} ± {base[a]['ppl_std']:.2f}"  # noqa: E731
    lines = [
        "Generated by `python benchmarks/findings.py` from the committed records (`benchmarks/results/*/runs`); "
        "intervals are 95 % Student-t intervals of the paired difference to default over n seeds, and *better* / "
        "*worse* / *no* is the Holm-corrected verdict of `benchmarks/_verdict.py` within the table the number comes "
        "from. " + flat_summary(r) + " Tables, commands and limits: [docs/results.md](docs/results.md).",
        "",
    ]
    others = [a for a in base if a not in ("default", "conditioned", "affine_scaled", "preconditioned")]
    lines.append(
        f"- **GPT-2 4 × 256 on a 2 MiB TinyStories sample** ({_dev(d0['devices'])}, fp32, "
        f"{len(d0['seeds'])} seeds, {tpp_all:.3f} tokens per parameter ({d0['tokens_per_param']:.3f} per "
        f"non-embedding parameter), {d0['epochs']:.2f} epochs). Perplexity: default {ppl('default')}, conditioned "
        f"{ppl('conditioned')} (Δ loss {_v(base['conditioned']['loss_verdict'])}), affine_scaled "
        f"{ppl('affine_scaled')} ({_v(base['affine_scaled']['loss_verdict'])}), preconditioned "
        f"{ppl('preconditioned')} ({_v(base['preconditioned']['loss_verdict'])}); "
        + ", ".join(f"{a} {_v(base[a]['loss_verdict'])}" for a in others) + ".")
    k = {a: base[a].get("kappa") for a in ("default", "conditioned", "mimetic", "spectral")}
    if all(k.values()):
        lines.append(
            f"- **κ(J) does not order the arms by quality** (same runs, seed {base['default']['kappa_seed']}, "
            f"causal mask, layer mean): at init conditioned {k['conditioned'][0]['mean']:.0f} against default "
            f"{k['default'][0]['mean']:.0f} (unmasked {k['conditioned'][0]['unmasked_mean']:.0f} against "
            f"{k['default'][0]['unmasked_mean']:.0f}); over the run mimetic stays at most "
            f"{max(m['mean'] for m in k['mimetic']):.1f} and spectral at most "
            f"{max(m['mean'] for m in k['spectral']):.1f} (unmasked at most "
            f"{max(m['unmasked_mean'] for m in k['spectral']):.1f}) while their perplexity ties default's.")
    vis = r["vision"]["settings"]
    vfull = vis["full"]
    vv = V.judge({(n, a): x["paired_delta"] for n, arms in vis.items() for a, x in arms.items() if a != "default"},
                 higher_is_better=True)
    lines.append(
        f"- **ViT 6 × 128 on CIFAR-10** ({_dev(vfull['default']['devices'])}, 160 steps, top-1 points against "
        f"default on 20k images): conditioned {_v(vv[('full', 'conditioned')], 2, 100)}, mimetic "
        f"{_v(vv[('full', 'mimetic')], 2, 100)}, affine_scaled {_v(vv[('full', 'affine_scaled')], 2, 100)}; on "
        f"5k images conditioned {_v(vv[('n5000', 'conditioned')], 2, 100)}.")
    cells, p = r["scale_cells"], SP.FULL
    mid = SP.size_name(p.sizes[p.middle])

    def sv(size, tpp, arm):
        keys = sorted((k for k in cells if (k[1] == p.main_tpp and k[2] == p.shared_lr)
                       or (k[0] == mid and k[2] == p.shared_lr)), key=str)
        if (size, tpp, p.shared_lr) not in cells:
            return None
        fam_keys = ([k for k in keys if k[1] == p.main_tpp] if tpp == p.main_tpp and size != mid
                    else [k for k in keys if k[0] == mid] if tpp != p.main_tpp else
                    [k for k in keys if k[1] == p.main_tpp])
        return SR.table_verdicts(cells, fam_keys, p.arms)[((size, tpp, p.shared_lr), arm)]

    def tpp_all(size, tpp):
        run = next(iter(cells[(size, tpp, p.shared_lr)]["default"].values()))
        return run["tokens_seen"] / run["n_all"]

    sizes = [SP.size_name(s) for s in p.sizes]
    devices = {s: _dev(r0["device"] or "?" for a in cells[(s, p.main_tpp, p.shared_lr)].values()
                       for r0 in a.values()) for s in sizes}
    lines.append(
        f"- **Width sweep, depth 2** (enwiki + WikiText-2, loss on WikiText-2 valid, {p.main_tpp:g} tokens per "
        "non-embedding parameter = " + " / ".join(f"{tpp_all(s, p.main_tpp):.1f}" for s in sizes)
        + " per parameter at " + " / ".join(sizes) + "; " + "; ".join(f"{s}: {devices[s]}" for s in sizes)
        + "). Conditioned against default: " + "; ".join(f"{s} {_v(sv(s, p.main_tpp, 'conditioned'))}"
                                                           for s in sizes)
        + f". The other arms at {sizes[-1]}: " + "; ".join(f"{a} {_v(sv(sizes[-1], p.main_tpp, a))}"
                                                           for a in p.arms if a not in ("default", "conditioned"))
        + f". At {mid} with training length: {p.length_tpps[-1]:g} tokens per non-embedding parameter "
        f"({tpp_all(mid, p.length_tpps[-1]):.2f} per parameter) {_v(sv(mid, p.length_tpps[-1], 'conditioned'))}, "
        f"{p.main_tpp:g} ({tpp_all(mid, p.main_tpp):.2f}) {_v(sv(mid, p.main_tpp, 'conditioned'))}. "
        "The extrapolation to 472M / 1.72B: "
        + r["scale"]["size_trend"]["conditioned"]["extrapolation_size_means"] + ".")
    dep = r["depth"]["depths"]
    same = r["depth"].get("same_rate", {}).get("conditioned")
    own, check = r["depth"]["plan"]["own_grid_depths"], r["depth"]["plan"]["rate_check_depth"]
    lines.append(
        "- **Depth sweep, width 64** (20 tokens per non-embedding parameter = "
        + " / ".join(f"{dep[d]['default']['tokens_seen'] / dep[d]['default']['n_all']:.1f}" for d in dep)
        + " per parameter at depth " + " / ".join(map(str, dep)) + "; "
        + "; ".join(f"depth {d}: {_dev(dep[d]['default']['devices'])}" for d in dep)
        + "; each arm at its best rate of a grid at depth 4"
        + "".join(f", at depth {d} of its own grid there" for d in own)
        + "). Conditioned against default, each at its own rate: "
        + "; ".join(f"depth {d} {_v(dep[d]['conditioned'].get('loss_verdict'))}"
                    for d in dep if "conditioned" in dep[d])
        + (f". At depth {check} with default at conditioned's rate too: {_v(same['verdict'])}"
           if same and check not in own else "")  # with its own grid there each arm is at its own rate already
        + ("" if check not in own else f". The other arms at depth {check}, each at its own rate: " + "; ".join(
            f"{a} {_v(dep[check][a].get('loss_verdict'))}" for a in r["depth"]["plan"]["arms"]
            if a not in ("default", "conditioned") and a in dep.get(check, {})))
        + ("." if check in own else f". Provisional at depth {check}: not every arm has its seeds at the best rate of "
           "its own grid there yet (docs/results.md \"Across depth\")."))
    accs = [x for cell in r["scale_cells"].values() for a in cell.values() for x in a.values()
            if x.get("blimp") is not None]
    accs = [x["blimp"] for x in accs] + [b for row in dep.values() for a in row.values() for b in a["blimp"].values()
                                          if b is not None] + [b for a in base.values() for b in a["blimp_accuracy"]
                                                               if b is not None]
    lines.append(
        f"- **BLiMP** (every LM run that scored BLiMP, {len(accs)} runs): accuracy {100 * min(accs):.1f}–"
        f"{100 * max(accs):.1f} %, within {100 * max(abs(a - 0.5) for a in accs):.1f} points of chance (50 %); "
        "near chance a point of accuracy is heuristic bias, not grammar, so these runs cannot rank the arms by it.")
    return "\n".join(_wrap(line) for line in lines) + "\n"


def vision_study_block(folder: str | None = None) -> str:
    """docs/results.md's section on the vision study (docs/vision.md, "The full study"), from its committed record
    (``python -m hf_condinit.study --out RUN --export benchmarks/results/vision_study/study``): one line while there
    is no record or a cell is not finished (N of M cells done), else the study's report (every table of
    ``report.md``, computed here from the cells' files; the figures are the record's) and, when ``kappa.png`` lies
    beside the record (``benchmarks/kappa_curves.py --out .../kappa.json``), the κ(J) curves; headings below the
    page's."""
    from hf_condinit.study.cells import progress
    from hf_condinit.study.plan import Plan
    from hf_condinit.study.report import build_report, markdown

    folder = folder or VISION_STUDY
    where = os.path.relpath(folder, C.REPO_ROOT)
    plan = Plan.load(folder)
    if plan is None:
        return _wrap(f"Not run yet: no record of the study in `{where}` (docs/vision.md, \"The full study\", has "
                     "its command).") + "\n"
    counts = progress(plan, folder)
    total = counts["done"] + counts["running"] + counts["left"]
    if counts["failed"] or counts["running"] or counts["left"]:
        return _wrap(f"Not finished yet: {counts['done'] - counts['failed']} of {total} cells done"
                     + (f", {counts['failed']} failed" if counts["failed"] else "")
                     + f" in the committed record `{where}` (at most {total}: a grid may still grow); the verdict "
                       "follows when every cell is done.") + "\n"
    report = build_report(plan, folder)
    report.pop("_arms")
    report["figures"] = sorted(n for n in os.listdir(folder) if n.startswith("report_") and n.endswith(".png"))
    lines = markdown(plan, folder, report).splitlines()[1:]  # without its title: the page's heading names it
    link = os.path.relpath(folder, os.path.dirname(RESULTS_DOC))
    text = "\n".join(lines).replace("](report_", f"]({link}/report_")
    kappa = os.path.join(os.path.dirname(folder), "kappa.png")
    if os.path.isfile(kappa):
        text += ("\n\n## κ(J) over training\n\nOn the SVD path, from the cells' kept checkpoints "
                 f"(`benchmarks/kappa_curves.py`; record `{os.path.relpath(kappa, C.REPO_ROOT)[:-4]}.json`):\n\n"
                 f"![κ(J) per arm over epochs]({os.path.relpath(kappa, os.path.dirname(RESULTS_DOC))})\n")
    return f"Generated from the committed record `{where}` (its `report.md` says the same).\n" + _demote(text)


def _wrap(paragraph: str, width: int = 116) -> str:
    """One paragraph or bullet wrapped to ``width`` columns (README keeps every line within 120), a bullet's
    continuation lines indented two spaces so Markdown keeps them in the bullet."""
    indent = "  " if paragraph.startswith("- ") else ""
    return textwrap.fill(paragraph, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) if paragraph else paragraph


def blocks() -> dict:
    """path -> {marker name -> generated text}."""
    r = collect_all()
    return {README: {"findings": findings_block(r)},
            RESULTS_DOC: {**{f"results-{m}": _demote(r[f"{m}_md"]) for m in ("compare", "scale", "depth", "vision")},
                          "results-vision-study": vision_study_block()}}


def render(path: str, named: dict) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name, block in named.items():
        text = splice(text, name, block)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed block differs; write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path, named in blocks().items():
        try:
            new = render(path, named)
        except ValueError as err:
            C.fail(f"{os.path.relpath(path, C.REPO_ROOT)}: {err}; add the markers around the block first")
        with open(path, encoding="utf-8") as f:
            old = f.read()
        if new != old:
            stale.append(os.path.relpath(path, C.REPO_ROOT))
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if stale:
        print(("stale: " if args.check else "rewrote: ") + ", ".join(stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
