"""The scale sweep's plan (``compare.py --scale-sweep``, ``_scale``'s docstring): its arms (:data:`ARMS`), sizes,
lengths, rates and seeds (:class:`ScalePlan`, :data:`FULL`, :data:`QUICK`), the runs in order (:func:`plan`), where
their records are (:func:`record_paths`, :func:`record_of`) and what they cost (:func:`measure_cost`,
:func:`estimate_lines`). The depth sweep plans with the same pieces (``_depth_plan``)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import _common as C
import _lm_run as LM

from hf_condinit.study.recipes import parse_recipe


#: The sweeps' arms (recipes in ``_common.RECIPES``). A run's spec names the LM arm (``_common.ARMS``) of the
#: recipe's init and attention and carries its options (the conditioned gains).
ARMS = ("default", "conditioned", "conditioned_v0.25", "mimetic", "affine_scaled")


@dataclass(frozen=True)
class ScalePlan:
    """What the sweep trains. ``sizes`` = (n_layer, n_embd, n_head), smallest first; ``seeds[i]`` seeds at size i;
    the length sweep (``length_tpps``, ``length_seeds`` seeds) and the LR sweep (``lrs``, ``lr_seeds`` seeds, at
    ``lr_tpp`` tokens per parameter, one of the length sweep's lengths so that its shared-LR runs are reused) are at
    the middle size ``sizes[len(sizes) // 2]``; every other run trains ``main_tpp`` tokens per non-embedding
    parameter at ``shared_lr``."""

    sizes: tuple
    seeds: tuple
    main_tpp: float
    length_tpps: tuple
    length_seeds: int
    lrs: tuple
    shared_lr: float
    lr_seeds: int
    lr_tpp: float
    arms: tuple
    batch_size: int
    block_size: int
    vocab_size: int
    eval_blocks: int  # held-out blocks of the eval curve
    final_eval_blocks: int  # held-out blocks of the final internal evaluation (WikiText-2 valid is evaluated whole)
    max_bytes: int | None = None

    @property
    def middle(self) -> int:
        return len(self.sizes) // 2


FULL = ScalePlan(sizes=((2, 32, 1), (2, 64, 2), (2, 96, 3)), seeds=(2, 3, 5), main_tpp=20.0, length_tpps=(1.0, 5.0),
                 length_seeds=3, lrs=(1e-3, 3e-3, 1e-2), shared_lr=3e-3, lr_seeds=2, lr_tpp=5.0, arms=ARMS,
                 batch_size=8, block_size=256, vocab_size=4096, eval_blocks=16, final_eval_blocks=64)
QUICK = ScalePlan(sizes=((1, 16, 2), (1, 32, 4), (2, 32, 4)), seeds=(1, 2, 1), main_tpp=0.25, length_tpps=(0.1,),
                  length_seeds=1, lrs=(3e-3, 1e-2), shared_lr=3e-3, lr_seeds=1, lr_tpp=0.1, arms=("default", "conditioned_v0.25"),
                  batch_size=4, block_size=32, vocab_size=512, eval_blocks=4, final_eval_blocks=8, max_bytes=200_000)


def size_name(size) -> str:
    return f"{size[0]}x{size[1]}"


def setting_name(size, tpp: float, lr: float) -> str:
    return f"{size_name(size)}_tpp{tpp:g}_lr{lr:g}"


def make_spec(p, label: str, size, tpp: float, lr: float, seed: int, kappa_at: tuple = ()) -> LM.TrainSpec:
    """One run of a sweep: arm ``label`` of :data:`ARMS`, ``size`` = (n_layer, n_embd, n_head), ``tpp`` training
    tokens per non-embedding parameter at learning rate ``lr``; batch, block and evaluation sizes from the plan
    ``p`` (a :class:`ScalePlan` or the depth sweep's plan); κ(J) at the fractions ``kappa_at`` of the run.
    ``label`` ``"<arm>@<device>"`` (e.g. ``default@cpu``): that arm's run again, bound to ``device`` ("cpu" or
    "cuda": only a worker on it trains it; :func:`arm_of`), its own record beside the arm's."""
    base, _, device = label.partition("@")
    recipe = parse_recipe(C.RECIPES[base])
    arm = next(a for a in C.ARMS if C.RECIPES[a] == f"{recipe.init}+{recipe.attention}")
    over = recipe.typed_options()
    if set(over) - set(LM.GAIN_KEYS):
        raise ValueError(f"arm {label!r}: a sweep's recipe may set only {', '.join(LM.GAIN_KEYS)}")
    n_layer, n_embd, n_head = size
    kw = dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, batch_size=p.batch_size, block_size=p.block_size,
              tokens_per_param=tpp)
    steps = C.steps_for_tokens_per_param(kw)
    return LM.TrainSpec(arm=arm, seed=seed, steps=steps, lr=lr, eval_every=max(1, steps // 10),
                       eval_blocks=p.eval_blocks, log_every=max(1, steps // 40), kappa_at=tuple(kappa_at),
                       diag_probe=(2, min(128, p.block_size)), qk_gain=over.get("qk_gain"),
                       v_gain=over.get("v_gain"),
                       setting=setting_name(size, tpp, lr),
                       extra=dict(label=label, size=size_name(size), final_eval_blocks=p.final_eval_blocks,
                                  **({"device": device} if device else {})), **kw)


def arm_of(spec: LM.TrainSpec) -> str:
    """The :data:`ARMS` label a run belongs to (``default`` for ``default@cpu``)."""
    return spec.extra["label"].partition("@")[0]


def trains_here(spec: LM.TrainSpec) -> bool:
    """Whether this process's device (``_common.TRAIN_DEVICE``) may train ``spec`` (a run bound to a device:
    :func:`make_spec`)."""
    return spec.extra.get("device", C.TRAIN_DEVICE) == C.TRAIN_DEVICE


def plan(p: ScalePlan) -> list[LM.TrainSpec]:
    """Every run, in the order of the module docstring (each prefix useful)."""
    runs = []
    for seed in range(max(p.seeds)):
        for i, size in enumerate(p.sizes):
            if seed >= p.seeds[i]:
                continue
            tpps = [p.main_tpp] + (list(p.length_tpps) if i == p.middle and seed < p.length_seeds else [])
            runs += [make_spec(p, a, size, t, p.shared_lr, seed) for t in tpps for a in p.arms]
    runs += [make_spec(p, a, p.sizes[p.middle], p.lr_tpp, lr, seed)
             for seed in range(p.lr_seeds) for lr in p.lrs if lr != p.shared_lr for a in p.arms]
    return runs


def record_paths(out: str, spec: LM.TrainSpec) -> tuple[str, str]:
    label = spec.extra["label"]
    return (os.path.join(out, "runs", spec.setting, label, f"seed{spec.seed}.json"),
            LM.trainer_folder(os.path.join(out, "trainer"), spec))


def record_of(out: str, spec: LM.TrainSpec) -> dict | None:
    """The finished record of ``spec`` under ``out`` (:func:`_common.finished_record`), or None."""
    return C.finished_record(record_paths(out, spec)[0], spec)


def _metric(rec: dict, eval_name: str | None) -> float:
    """The compared loss of a record: on ``eval_name`` (an ``--eval-file``) when evaluated there, else on the
    internal held-out split."""
    if eval_name and eval_name in rec.get("eval_files", {}):
        return rec["eval_files"][eval_name]["loss"]
    return rec["final_eval_loss"]


# ---------------------------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------------------------


def measure_cost(size, p: ScalePlan, steps: int = 4) -> dict:
    """CPU time (user + system of this process, at one torch thread) per token of one training step (forward,
    backward, AdamW) and of one forward pass of the ``size`` model, on random tokens of one batch; after one
    warm-up step."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = C.gpt2_config(n_layer=size[0], n_embd=size[1], n_head=size[2], n_positions=p.block_size,
                               vocab_size=p.vocab_size)
        model = C.build_model("default", config, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, p.vocab_size, (p.batch_size, p.block_size), generator=torch.Generator().manual_seed(0))

        def step():
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()

        step()
        t = time.process_time()
        for _ in range(steps):
            step()
        train = (time.process_time() - t) / (steps * x.numel())
        model.eval()
        with torch.no_grad():
            model(input_ids=x, labels=x)
            t = time.process_time()
            for _ in range(steps):
                model(input_ids=x, labels=x)
            evaluate = (time.process_time() - t) / (steps * x.numel())
    finally:
        torch.set_num_threads(threads)
    return dict(train_cpu_us_per_token=train * 1e6, eval_cpu_us_per_token=evaluate * 1e6, steps=steps,
                batch=[p.batch_size, p.block_size], vocab_size=p.vocab_size)


def load_costs(out: str, p, sizes=None) -> dict:
    """``<out>/cost.json`` (size name -> :func:`measure_cost`), measuring the sizes (default ``p.sizes``) it
    lacks."""
    path = os.path.join(out, "cost.json")
    costs = json.load(open(path)) if os.path.exists(path) else {}
    missing = [s for s in (p.sizes if sizes is None else sizes) if size_name(s) not in costs.get("sizes", {})]
    if missing:
        costs.setdefault("sizes", {}).update({size_name(s): measure_cost(s, p) for s in missing})
        costs["machine"] = C.machine_info()
        costs["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        C.write_json(path, costs)
    return costs


def run_cpu_estimate(spec: LM.TrainSpec, cost: dict, eval_tokens: int) -> float:
    """Estimated CPU seconds of one run: training tokens at the training cost; the eval curve, the final internal
    evaluation and the ``eval_tokens`` of the eval files at the forward cost."""
    block = spec.block_size
    curve = (spec.steps // spec.eval_every + 2) * spec.eval_blocks * block
    forward = curve + spec.extra["final_eval_blocks"] * block + eval_tokens
    return 1e-6 * (spec.steps * spec.batch_size * block * cost["train_cpu_us_per_token"]
                   + forward * cost["eval_cpu_us_per_token"])


def estimate_lines(runs: list, todo: list, costs: dict, eval_tokens: int, out: str) -> list[str]:
    """What the start of a sweep prints: measured cost per size, CPU estimate per run kind and of the plan."""
    lines = ["[scale] CPU time per token (user + system, one thread, forward + backward + AdamW / forward; "
             "measured once on random tokens, cost.json):"]
    for name, c in costs["sizes"].items():
        lines.append(f"[scale]   {name}: train {c['train_cpu_us_per_token']:.1f} µs, eval "
                     f"{c['eval_cpu_us_per_token']:.1f} µs")
    est = {id(r): run_cpu_estimate(r, costs["sizes"][r.extra["size"]], eval_tokens) for r in runs}
    kinds: dict[str, list] = {}
    for r in runs:
        kinds.setdefault(r.setting, []).append(est[id(r)])
    for setting, xs in kinds.items():
        lines.append(f"[scale]   {setting}: {len(xs)} runs × {xs[0]:.1f} core-s")
    total, left = sum(est.values()), sum(est[id(r)] for r in todo)
    lines.append(f"[scale] plan: {len(runs)} runs, {total / 3600:.2f} core-h ({total / 7200:.2f} h on 2 idle cores, "
                 f"two --threads 1 workers); left: {len(todo)} runs, {left / 3600:.2f} core-h "
                 f"({left / 7200:.2f} h on 2 cores). Trainer overhead not included.")
    done = [(r, json.load(open(record_paths(out, r)[0]))) for r in runs if r not in todo]
    done = [(r, rec) for r, rec in done if "cpu_seconds" in rec]
    if done:
        ratio = sum(rec["cpu_seconds"] for _, rec in done) / sum(est[id(r)] for r, _ in done)
        lines.append(f"[scale] the {len(done)} finished runs took {ratio:.2f} × their estimate in CPU time")
    return lines
