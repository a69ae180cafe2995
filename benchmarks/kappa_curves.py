"""κ(J) over training for chosen cells of a vision study, measured afterwards from the checkpoints they kept, on the
SVD path (the in-training ``eig`` κ saturates at ~1e6 on the ViT; docs/results.md, "Vision").

    python benchmarks/kappa_curves.py --study runs/vision_study \\
        --image_file ../shared/data/cifar10/test_dev.parquet --seeds 1 2 3 4 5 --epochs 0 1 2 5 10 \\
        --out benchmarks/results/vision_study/kappa.json          # the record and kappa.png beside it

Points: every (arm, seed, epoch) asked (default: every arm of the plan, its verdict seeds, every kept epoch and 0).
A cell is the arm's cell at its chosen rate (the plan's rule, as the report has it). Its weights at an epoch:

- epoch 0, the init: no checkpoint holds it, so it is rebuilt from the cell's ``config.json`` (the model config and
  the ``condinit`` recipe with its seed, as the run saved them) the way ``run_image_classification.py`` builds it:
  ``set_seed(seed)``, then ``AutoModelForImageClassification.from_config(config, condinit=recipe)`` (the
  non-attention weights come from the seeded global generator, the recipe's from its own);
- any other epoch: the kept ``checkpoint-*`` whose ``trainer_state.json`` epoch is nearest to it, or the cell's
  final model (its own ``trainer_state.json``), whichever is nearer; the record keeps the epoch and step measured.

κ: :func:`hf_condinit.attention_jacobian_condition_number` with ``method="svd"`` (float64, the explicit Jacobian's
singular values through a QR: :func:`hf_condinit.diagnostics.condition_number.singular_values`), every head of the
``--layers`` (default all) on the first ``--images`` images of ``--image_file`` as evaluation sees them (resized
and normalised, no augmentation). One head of ``vit-cpu-cifar`` (J of 2,080 × 12,288) costs about 6 CPU-s.

The record (``--out``) is written after every point, so a stopped run goes on where it stopped (a point in the record
is not measured again); ``kappa.png`` beside it draws, per arm, the geometric mean over heads and layers of each
cell against epochs, mean ± 1 std of log10 over the seeds (a hollow triangle where a head's κ is a lower bound).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def probe_pixels(image_file: str, config, n: int):
    """``(n, 3, H, W)``: the first ``n`` images of the parquet file ``image_file`` (an ``img`` column) as
    ``run_image_classification.py`` evaluates them (its default processor for ``config``'s image size)."""
    import datasets
    import torch
    from transformers import ViTImageProcessorPil

    from hf_condinit.vision import ImageTransform

    images = datasets.load_dataset("parquet", data_files={"probe": image_file}, split=f"probe[:{n}]")
    size = (config.image_size, config.image_size)
    proc = ViTImageProcessorPil(size={"height": size[0], "width": size[1]})
    transform = ImageTransform("img", "label", size, proc.image_mean, proc.image_std, train=False)
    return torch.stack(transform({"img": images["img"]})["pixel_values"])


def rebuild_init(cell: str, seed: int):
    """The model of run folder ``cell`` at step 0 (module docstring)."""
    from transformers import AutoConfig, AutoModelForImageClassification, set_seed

    import hf_condinit  # noqa: F401  (the condinit= keyword of from_config)

    config = AutoConfig.from_pretrained(cell)
    recipe = getattr(config, "condinit", None)
    set_seed(seed)
    kwargs = {"condinit": dict(recipe)} if recipe else {}
    return AutoModelForImageClassification.from_config(config, **kwargs).eval()


def kept_epochs(cell: str) -> list[tuple[float, int, str]]:
    """``(epoch, step, folder)`` of every set of weights the cell kept: its ``checkpoint-*`` folders and its final
    model, by step (one per step: a checkpoint at the final step stands for both)."""
    found = {}
    for folder in [*glob.glob(os.path.join(cell, "checkpoint-*")), cell]:
        state = os.path.join(folder, "trainer_state.json")
        if not (os.path.isfile(state) and glob.glob(os.path.join(folder, "model*.safetensors"))):
            continue
        with open(state, encoding="utf-8") as f:
            s = json.load(f)
        if s.get("epoch") is not None and s.get("global_step") is not None:
            found.setdefault(int(s["global_step"]), (float(s["epoch"]), int(s["global_step"]), folder))
    return [found[k] for k in sorted(found)]


def measure(model, pixels, layers) -> dict:
    import hf_condinit

    t0 = time.process_time()
    rep = hf_condinit.attention_jacobian_condition_number(model, pixels, layers=layers, method="svd")
    return dict(layers=[dict(layer=lc.layer, kappa=[h.kappa for h in lc.heads],
                             lower_bound=[bool(h.kappa_is_lower_bound) for h in lc.heads]) for lc in rep.layers],
                cpu_s=time.process_time() - t0)


def cells_of(study: str, arms, seeds) -> list[tuple[str, int, str]]:
    """``(arm, seed, folder)`` of every cell asked, at each arm's chosen rate; exits with one line for an arm the
    plan lacks or a rate not decided yet."""
    from hf_condinit.study.cells import outcome_of
    from hf_condinit.study.plan import Cell, Plan, arm_rates, verdict_seeds

    plan = Plan.load(study)
    if plan is None:
        C.fail(f"--study {study}: no study.json there")
    out = []
    for arm in arms or plan.arms:
        if arm not in plan.arms:
            C.fail(f"--arms {arm}: not an arm of {study} ({', '.join(plan.arms)})")
        if plan.grid:
            rates = arm_rates(plan, arm, outcome_of(plan, study))
            if not rates["decided"] or rates["best"] is None:
                C.fail(f"{arm}: its rate is not chosen yet in {study}")
            rate = rates["best"]
        else:
            rate = plan.lrs[0] if plan.lrs else None
        for seed in seeds if seeds is not None else verdict_seeds(plan):
            out.append((arm, seed, Cell(arm, seed, rate).folder(study)))
    return out


def plot(record: dict, path: str) -> str:
    from hf_condinit.reporting.plots import Curve, aggregate_curves, plot_curves

    by_arm: dict = {}
    for p in record["points"].values():
        kappas = [k for lc in p["layers"] for k in lc["kappa"] if k > 0 and math.isfinite(k)]
        if kappas:
            geo = 10 ** (sum(math.log10(k) for k in kappas) / len(kappas))
            bound = any(b for lc in p["layers"] for b in lc["lower_bound"])
            by_arm.setdefault(p["arm"], {}).setdefault(p["seed"], []).append((p["epoch_asked"], geo, bound))
    curves = []
    for arm, seeds in by_arm.items():
        series = [sorted(pts) for pts in seeds.values()]
        curve = aggregate_curves(f"{arm} (n={len(series)})", [([e for e, _, _ in s], [k for _, k, _ in s])
                                                              for s in series], log=True)
        bounded = {e for s in series for e, _, b in s if b}
        curve.lower_bound = [e in bounded for e in curve.steps]
        curves.append(curve)
    return plot_curves([c for c in curves if isinstance(c, Curve)], path, logy=True, xlabel="epoch (nearest kept)",
                       ylabel="κ(J), geometric mean over heads and layers",
                       title="κ(J) on the SVD path: mean ± 1 std of log10 over seeds")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True, help="the study folder (with the cells' checkpoints)")
    ap.add_argument("--image_file", required=True, help="parquet file with an `img` column: the probe images")
    ap.add_argument("--out", required=True, help="the record (JSON); the figure goes beside it as kappa.png")
    ap.add_argument("--arms", nargs="+", help="default: every arm of the plan")
    ap.add_argument("--seeds", nargs="+", type=int, help="default: the plan's verdict seeds")
    ap.add_argument("--epochs", nargs="+", type=float, help="default: 0 and every kept epoch")
    ap.add_argument("--layers", nargs="+", type=int, help="default: every layer")
    ap.add_argument("--images", type=int, default=1, help="probe images (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForImageClassification

    if not os.path.isfile(args.image_file):
        C.fail(f"--image_file {args.image_file}: no such file")
    if args.images < 1:
        C.fail(f"--images {args.images}: give at least 1")
    torch.set_num_threads(args.threads)
    cells = cells_of(args.study, args.arms, args.seeds)
    for arm, seed, folder in cells:
        if not os.path.isfile(os.path.join(folder, "config.json")):
            C.fail(f"{arm} seed {seed}: {folder} holds no config.json (not run yet?)")
    record = dict(study=os.path.relpath(args.study, C.REPO_ROOT), image_file=os.path.basename(args.image_file),
                  images=args.images, layers=args.layers, method="svd", points={})
    if os.path.isfile(args.out):
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)
        if {k: old.get(k) for k in ("image_file", "images", "layers")} != {k: record[k] for k in
                                                                             ("image_file", "images", "layers")}:
            C.fail(f"--out {args.out} holds points of another probe or other layers; give another --out")
        record["points"] = old["points"]
    record.update(device="cpu", threads=args.threads, **C.provenance())
    pixels = None
    for arm, seed, folder in cells:
        kept = kept_epochs(folder)
        asked = args.epochs if args.epochs is not None else [0.0] + [e for e, _, _ in kept]
        for epoch in asked:
            key = f"{arm}/seed{seed}/epoch{epoch:g}"
            if key in record["points"]:
                continue
            if epoch == 0:
                model, at = rebuild_init(folder, seed), (0.0, 0, "init (rebuilt)")
            else:
                if not kept:
                    C.fail(f"{folder}: no kept weights (checkpoint-* or a final model) to measure epoch {epoch:g}")
                at = min(kept, key=lambda k: abs(k[0] - epoch))
                model = AutoModelForImageClassification.from_pretrained(at[2]).eval()
            if pixels is None:
                pixels = probe_pixels(args.image_file, model.config, args.images)
            point = dict(arm=arm, seed=seed, epoch_asked=epoch, epoch=at[0], step=at[1],
                         weights=os.path.relpath(at[2], args.study) if epoch else at[2],
                         **measure(model, pixels, args.layers))
            record["points"][key] = point
            C.write_json(args.out, record)
            kappas = [k for lc in point["layers"] for k in lc["kappa"]]
            print(f"{key}: step {at[1]}, κ {min(kappas):.3g} .. {max(kappas):.3g} over {len(kappas)} heads, "
                  f"{point['cpu_s']:.0f} CPU-s", flush=True)
    C.write_json(args.out, record)
    if record["points"]:
        print(plot(record, os.path.join(os.path.dirname(os.path.abspath(args.out)), "kappa.png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
