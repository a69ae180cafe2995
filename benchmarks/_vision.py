"""``benchmarks/compare.py --task vision``: does mimetic / conditioned init help a ViT trained from scratch on CIFAR-10?

The positive control: mimetic init is known to make small ViTs trained from scratch on small data clearly
better (Trockman & Kolter 2023); the seed paper's Table 2 (ViT-T, CIFAR-10 top-1 %) reads default 92.4 / mimetic 93.6
/ conditioned 94.1. Our scale is far smaller (a 6 × 128 ViT, a few hundred steps on 2 CPU cores): compare the arms
with each other, not with those absolute numbers.

Arms (:data:`ARMS`): default, mimetic, conditioned, conditioned with ``v_gain=0.25`` (the LM sweep's gain),
affine_scaled; seeds 0..S-1; two data settings: the full 20,000-image training set and a class-balanced 5,000-image
subset (fixed, the same for every arm and seed). Every run trains through the same code as
``run_image_classification.py`` (``build_trainer``: the same data loading, augmentation, model building, Trainer), so
for one seed every arm sees the same batches in the same order with the same augmentation (the Trainer's sampler is
seeded by the seed, the augmentation has its own generator seeded by the seed; the model never touches either).

Per run: top-1 accuracy and loss on the whole test_dev split (5,000 images) at the end; an accuracy / loss curve on a
class-balanced 1,000-image subset of test_dev at step 0 and every ``eval_every`` steps; the training-loss curve;
step-0 diagnostics (attention entropy per layer against the uniform reference log N, logit std, max probability,
RMS of X, Q, K, V and of the attention output; final-logit std); κ(J) of the attention Jacobian (an encoder has no
mask: this is the unmasked κ) on one test image, at init and at the end, for the first ``kappa_seeds`` seeds
(the 5,000-image setting reuses the 20,000 run's init κ: same seed, same model). The report gives per setting and arm
the mean ± std over seeds, the paired difference to default, and the steps each arm needs to reach default's final
curve accuracy.

Outputs in ``--out``: ``data/`` (the two subsets as parquet), ``runs/<setting>/<arm>/seed<k>.json`` (one per
finished run, written as it finishes; a rerun skips finished runs whose spec is unchanged), ``results.json``,
``results.md``, ``accuracy.png``, ``loss.png`` (``_vision_report``). ``--report-only`` rebuilds the last three from
whatever runs exist. Several workers may share ``--out`` (each run is claimed with a lock file, as in the LM modes).
Measured on 2026-12-03: one ``--threads 1`` worker ran the 30 runs of the default mode in 78 minutes (116–233 s per
run) while another job held the second core; two workers should take about 40 minutes on 2 idle cores (not
measured).

    python benchmarks/compare.py --task vision --out /tmp/vision --threads 1  # default: 5 arms × 3 seeds × 2 sizes
    python benchmarks/compare.py --task vision --out /tmp/vision --threads 1  # (a second worker, same folder)
    python benchmarks/compare.py --task vision --quick --out /tmp/vq        # tiny ViT, 2 arms, 1 seed, ≤ 60 s
    python benchmarks/compare.py --task vision --out /tmp/vision --report-only
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass

import _common as C
from _vision_report import report

DATA_DIR = os.path.join(C.SHARED_DATA, "cifar10")
TRAIN_FILE = os.path.join(DATA_DIR, "train.parquet")
TEST_FILE = os.path.join(DATA_DIR, "test_dev.parquet")

ARMS = ("default", "mimetic", "conditioned", "conditioned_v0.25", "affine_scaled")  # recipes: _common.RECIPES
QUICK_ARMS = ("default", "mimetic")


@dataclass(frozen=True)
class VisionSpec:
    """One run. ``n_train``: training images (None: all of train.parquet)."""

    arm: str
    seed: int
    setting: str
    n_train: int | None
    steps: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup: float
    model_config: str
    config_overrides: str | None
    eval_every: int
    curve_images: int
    logging_steps: int
    n_test: int | None  # test_dev images for the final top-1 (None: all 5,000; a balanced subset otherwise)
    kappa: bool  # measure κ at the end (and at init unless kappa_init is False)
    kappa_init: bool
    kappa_layers: tuple[int, ...] | None
    diag_images: int

    def key(self) -> str:
        return C.stable_hash(asdict(self))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["vision"], default="vision")
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/vision[_quick])")
    p.add_argument("--quick", action="store_true",
                   help="tiny ViT, 2 arms, 1 seed, 250 training / 200 test images, 6 steps (≤ 60 s on 2 idle cores)")
    p.add_argument("--arms", nargs="+", default=None, help=f"subset of {list(ARMS)}")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick 1)")
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="training-set sizes (class-balanced subsets); 0 = all 20,000 images (default: 0 5000; "
                        "quick: 250)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 160; quick 6)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64 (quick 16)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3)")
    p.add_argument("--model-config", default=None, help="configs/ name or path (default vit-cpu-cifar)")
    p.add_argument("--config-overrides", default=None, help="e.g. num_hidden_layers=4 (quick: a 1-layer ViT)")
    p.add_argument("--eval-every", type=int, default=None, help="curve evaluation interval in steps (default 40)")
    p.add_argument("--curve-images", type=int, default=None, help="class-balanced test_dev subset for the curves")
    p.add_argument("--kappa-seeds", type=int, default=1, help="κ(J) for the first K seeds (default 1; 0: none)")
    p.add_argument("--kappa-layers", type=int, nargs="*", default=None,
                   help="layers measured for κ (default 0 2 5: first, middle, last of the 6-layer ViT)")
    p.add_argument("--train-file", default=TRAIN_FILE)
    p.add_argument("--test-file", default=TEST_FILE)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--report-only", action="store_true", help="only aggregate the finished runs")
    return p.parse_args(argv)


def plan(args) -> list[VisionSpec]:
    """Every run of this invocation, in priority order: seed-major, so an interrupted run has whole seeds."""
    q = args.quick
    arms = args.arms or (list(QUICK_ARMS) if q else list(ARMS))
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"--arms: unknown {sorted(unknown)}; known: {list(ARMS)}")
    seeds = args.seeds if args.seeds is not None else (1 if q else 3)
    sizes = args.sizes or ([250] if q else [0, 5000])
    steps = args.steps or (6 if q else 160)
    common = dict(
        steps=steps,
        batch_size=args.batch_size or (16 if q else 64),
        lr=args.lr or 1e-3,
        weight_decay=0.05,
        warmup=0.05,
        model_config=args.model_config or "vit-cpu-cifar",
        config_overrides=args.config_overrides or (
            "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64,patch_size=8" if q else None),
        eval_every=args.eval_every or (3 if q else 40),
        curve_images=args.curve_images or (60 if q else 1000),
        n_test=200 if q else None,
        logging_steps=1 if q else 5,
        kappa_layers=tuple(args.kappa_layers) if args.kappa_layers is not None else ((0,) if q else (0, 2, 5)),
        diag_images=4 if q else 8,
    )
    specs = []
    for seed in range(seeds):
        for size in sizes:
            for arm in arms:
                setting = "full" if size == 0 else f"n{size}"
                kappa = seed < args.kappa_seeds
                specs.append(VisionSpec(arm=arm, seed=seed, setting=setting, n_train=size or None, kappa=kappa,
                                        kappa_init=kappa and size == sizes[0], **common))
    return specs


# ---------------------------------------------------------------------------------------------------------------
# data: class-balanced subsets, written once as parquet (the runs read files, like the script)
# ---------------------------------------------------------------------------------------------------------------


def balanced_subset(src: str, n: int, dst: str, seed: int = 0) -> str:
    """Write ``n`` images of ``src`` (n / classes per class, drawn with a generator seeded by ``seed``) to ``dst``.

    The same file for every arm and seed; rows in class-interleaved order. Reused when it already exists."""
    if os.path.isfile(dst):
        return dst
    import datasets
    import torch

    ds = datasets.load_dataset("parquet", data_files={"train": src}, split="train")
    labels = torch.tensor(ds["label"])
    classes = sorted(set(labels.tolist()))
    per = n // len(classes)
    gen = torch.Generator().manual_seed(seed)
    picks = []
    for c in classes:
        idx = (labels == c).nonzero().flatten()
        if len(idx) < per:
            raise SystemExit(f"{src}: class {c} has {len(idx)} images, fewer than {per}")
        picks.append(idx[torch.randperm(len(idx), generator=gen)[:per]])
    order = torch.stack(picks, dim=1).flatten().tolist()  # c0, c1, ..., c9, c0, ...
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.tmp{os.getpid()}"  # several workers may build the same subset at once
    ds.select(order).to_parquet(tmp)
    os.replace(tmp, dst)
    return dst


# ---------------------------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------------------------


def _rms(t) -> float:
    return float(t.float().pow(2).mean().sqrt())


def step0_diagnostics(model, pixels) -> dict:
    """Per attention layer (through the model's layout, so ViT / DeiT / Swin alike): softmax entropy (nats, mean
    over heads and queries) against the uniform reference log N, std of the attention logits, mean max probability,
    RMS of the block input X, of Q, K, V and of the block output; plus the std of the classifier logits.

    ``pixels``: (B, C, H, W) normalised images. Unmasked (encoder). For attention variants, the plain softmax."""
    import torch

    from hf_condinit.layouts import get_layout

    layout = get_layout(model)
    blocks = layout.attention_modules(model)
    caps: dict[int, dict] = {}
    handles = []
    for i, (_, block) in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(
            lambda m, a, kw, i=i: caps.setdefault(i, {}).__setitem__("x", kw.get("hidden_states", a[0] if a else None)),
            with_kwargs=True))
        handles.append(block.register_forward_hook(
            lambda m, a, out, i=i: caps.setdefault(i, {}).__setitem__("o", out[0] if isinstance(out, tuple) else out)))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(pixel_values=pixels).logits
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    layers = []
    with torch.no_grad():
        for i, (_, block) in enumerate(blocks):
            g = layout.geometry(block, model.config)
            projs = layout.projections(block, g)
            x = caps[i]["x"].float()
            B, N, _ = x.shape

            def heads(role):
                p = projs[role]
                y = p.linear(x, p.weight) + (p.bias if p.bias is not None else 0.0)
                return y.view(B, N, -1, g.head_dim).transpose(1, 2)  # (B, H, N, d)

            q, k, v = heads("q"), heads("k"), heads("v")
            core = layout.core_module(block)
            scaling = float(getattr(core, "scaling", g.head_dim ** -0.5))
            S = scaling * q @ k.transpose(-1, -2)
            P = S.softmax(-1)
            ent = -(P * P.clamp_min(1e-30).log()).sum(-1)
            layers.append(dict(layer=i, attn_entropy=float(ent.mean()), uniform_entropy=math.log(N),
                               logit_std=float(S.std()), max_prob=float(P.max(-1).values.mean()),
                               x_rms=_rms(x), q_rms=_rms(q), k_rms=_rms(k), v_rms=_rms(v),
                               attn_out_rms=_rms(caps[i]["o"])))
    return dict(probe_shape=list(pixels.shape), layers=layers, logits_std=float(logits.float().std()))


def measure_kappa(model, pixels, layers) -> dict:
    """κ(J) per layer (mean / max over heads), its surrogate bound, saturation count, seconds (unmasked: encoder)."""
    import hf_condinit

    t0 = time.perf_counter()
    rep = hf_condinit.attention_jacobian_condition_number(model, pixels, layers=list(layers) if layers else None)
    per_layer = [dict(layer=lc.layer, mean=lc.mean, max=lc.max, n_saturated=lc.n_saturated,
                      bound=lc.mean_of("bound")) for lc in rep.layers]
    flat = rep.to_log_dict()
    return dict(mean=flat["kappa/mean"], max=flat["kappa/max"], n_saturated=sum(lc.n_saturated for lc in rep.layers),
                layers=per_layer, seconds=time.perf_counter() - t0, probe_shape=list(pixels.shape))


# ---------------------------------------------------------------------------------------------------------------
# one run, through run_image_classification.build_trainer
# ---------------------------------------------------------------------------------------------------------------


def _load_script():
    import importlib.util

    name = "hf_condinit_run_image_classification"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(C.REPO_ROOT, "run_image_classification.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def train_run(spec: VisionSpec, train_file: str, curve_file: str, test_file: str, workdir: str) -> dict:
    import torch
    from transformers.trainer_callback import PrinterCallback

    from hf_condinit.scripts_common import CondInitArguments
    from hf_condinit.study.recipes import parse_recipe
    from hf_condinit.vision import ImageTransform, load_image_datasets

    ric = _load_script()
    recipe = parse_recipe(C.RECIPES[spec.arm])
    cond_args = CondInitArguments(init=recipe.init, attention=recipe.attention, **recipe.typed_options())
    model_args = ric.ModelArguments(model_config=spec.model_config, config_overrides=spec.config_overrides)
    data_args = ric.DataTrainingArguments(train_file=train_file, validation_file=curve_file)
    training_args = ric.ImageTrainingArguments(
        output_dir=workdir, do_train=True, do_eval=True, max_steps=spec.steps,
        per_device_train_batch_size=spec.batch_size, per_device_eval_batch_size=250, learning_rate=spec.lr,
        weight_decay=spec.weight_decay, warmup_steps=spec.warmup, eval_strategy="steps", eval_steps=spec.eval_every,
        logging_steps=spec.logging_steps, save_strategy="no", report_to="none", disable_tqdm=True, seed=spec.seed,
        use_cpu=True, dataloader_num_workers=0,
    )
    trainer, train_dataset, curve_dataset = ric.build_trainer(model_args, data_args, cond_args, training_args)
    trainer.remove_callback(PrinterCallback)  # no per-step prints: one line per run from main()
    proc = trainer.processing_class
    eval_transform = ImageTransform("img", "label", (proc.size["height"], proc.size["width"]), proc.image_mean,
                                    proc.image_std, train=False)
    curve_raw = curve_dataset.with_format(None)
    probe = ric.probe_pixels(curve_raw, eval_transform, max(1, spec.diag_images))
    model = trainer.model
    rec: dict = {"arm": spec.arm, "seed": spec.seed, "setting": spec.setting, "spec": asdict(spec), "key": spec.key(),
                 "n_train": len(train_dataset), "n_params": sum(p.numel() for p in model.parameters()),
                 "condinit": getattr(model.config, "condinit", None)}
    rec["step0"] = step0_diagnostics(model, probe)
    first = trainer.evaluate()
    rec["curve"] = [dict(step=0, accuracy=first["eval_accuracy"], loss=first["eval_loss"])]
    rec["kappa_init"] = measure_kappa(model, probe[:1], spec.kappa_layers) if spec.kappa_init else None

    t0, c0 = time.perf_counter(), time.process_time()
    result = trainer.train()  # CondInitTrainer: a signal raises TrainingPreempted (no record of a partial run)
    rec["train_seconds"] = time.perf_counter() - t0
    rec["train_cpu_seconds"] = time.process_time() - c0  # all threads: wall time on idle cores ≈ this / threads
    rec["train_images_per_second"] = spec.steps * spec.batch_size / rec["train_seconds"]
    rec["train_loss_mean"] = result.training_loss
    hist = trainer.state.log_history
    rec["train_curve"] = [dict(step=h["step"], loss=h["loss"]) for h in hist if "loss" in h and "step" in h]
    rec["curve"] += [dict(step=h["step"], accuracy=h["eval_accuracy"], loss=h["eval_loss"])
                     for h in hist if "eval_accuracy" in h]
    rec["kappa_end"] = measure_kappa(model, probe[:1], spec.kappa_layers) if spec.kappa else None

    test = load_image_datasets(validation_file=test_file)["validation"]
    test.set_transform(eval_transform)
    t1 = time.perf_counter()
    final = trainer.evaluate(eval_dataset=test, metric_key_prefix="test")
    rec["test_seconds"] = time.perf_counter() - t1
    rec["test_accuracy"], rec["test_loss"], rec["n_test"] = final["test_accuracy"], final["test_loss"], len(test)
    rec["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rec["loadavg_1m_at_end"] = os.getloadavg()[0]
    rec["torch_threads"] = torch.get_num_threads()
    return rec


def run_path(out: str, spec: VisionSpec) -> str:
    return os.path.join(out, "runs", spec.setting, spec.arm, f"seed{spec.seed}.json")




def main(argv=None) -> dict:
    args = parse_args(argv)
    out = args.out or os.path.join(C.REPO_ROOT, "benchmarks", "results", "vision_quick" if args.quick else "vision")
    os.makedirs(out, exist_ok=True)
    if args.report_only:
        return report(out, ARMS)
    for path in (args.train_file, args.test_file):
        if not os.path.isfile(path):
            C.fail(f"missing {path}: the vision mode needs CIFAR-10 parquet files (see the data's SOURCES.md)")
    C.set_threads(args.threads)
    C.quiet_transformers()
    specs = plan(args)
    data_dir = os.path.join(out, "data")
    curve_n, test_n = specs[0].curve_images, specs[0].n_test
    curve_file = balanced_subset(args.test_file, curve_n, os.path.join(data_dir, f"test_dev_balanced{curve_n}.parquet"))
    test_file = args.test_file if not test_n else balanced_subset(
        args.test_file, test_n, os.path.join(data_dir, f"test_dev_balanced{test_n}.parquet"), seed=1)
    train_files = {}
    for spec in specs:
        if spec.n_train and spec.n_train not in train_files:
            train_files[spec.n_train] = balanced_subset(
                args.train_file, spec.n_train, os.path.join(data_dir, f"train_balanced{spec.n_train}.parquet"))
    todo = [s for s in specs if C.finished_record(run_path(out, s), s) is None]
    print(f"[vision] {len(specs)} runs planned, {len(specs) - len(todo)} already finished; output {out}",
          file=sys.stderr, flush=True)
    t0 = time.time()
    for i, spec in enumerate(todo):
        path = run_path(out, spec)
        with C.run_slot(path, spec) as slot:
            if slot != "claimed":  # done or running in another worker sharing --out
                continue
            t1 = time.time()
            workdir = os.path.join(out, "work", spec.setting, spec.arm, f"seed{spec.seed}")
            shutil.rmtree(workdir, ignore_errors=True)  # a stopped run's checkpoint: a run of minutes starts over
            with C.exit_75_when_preempted("vision"):
                rec = train_run(spec, train_files.get(spec.n_train, args.train_file), curve_file, test_file, workdir)
            rec.update(C.provenance(), device="cpu")  # the vision mode trains on the CPU only (use_cpu=True)
            C.write_json(path, rec)
        print(f"[vision] {i + 1}/{len(todo)} {spec.setting}/{spec.arm}/seed{spec.seed}: top-1 "
              f"{rec['test_accuracy']:.4f}, {rec['train_images_per_second']:.0f} img/s, {time.time() - t1:.0f} s",
              file=sys.stderr, flush=True)
        report(out, ARMS)  # results as they come
    print(f"[vision] done in {time.time() - t0:.0f} s", file=sys.stderr)
    return report(out, ARMS)


if __name__ == "__main__":
    main()
