"""Part d: the speed-lever matrix of GPT-2 472M / 1.72B training (each arm: `training.train_arm`).

Stages, in this order, so the headline rows come first and a slow compile or an out-of-memory costs one row:

1. **levers** (472M, SDPA, default init, micro-batch 16 = README's command; `LEVER_ARMS`): today's configuration
   (``run_clm.py``'s defaults: eager, ``adamw_torch``, the model's own loss, vocabulary 50,257, IEEE fp32 matmuls),
   then each lever alone on top of it — padded vocabulary (×64), chunked LM-head cross-entropy, fused AdamW, TF32,
   regional compile, whole-model compile (the eager levers first: cheap; a compile arm may be slow) — then
   **all levers** together with the faster of the two compiles (`ALL_LEVERS`; no compile where neither was
   measured). The **best configuration** is the fastest arm of this stage (tokens/s; a ``best`` row);
2. **best** (`BEST_ARMS`): in the best configuration at the matrix's micro-batch (8 at 1.72B; 16 at 472M, the
   comparison the issue's "≥ 0.95× that configuration" asks for): 1.72B first (a headline row: the issue's MFU target
   at 1.72B), then each attention variant (affine_scaled, attention_sink, preconditioned, spectral λ = 10) and the
   conditioned init. An arm that runs out of memory (``torch.cuda.OutOfMemoryError``: its row, its memory freed) is
   run once more at half its micro-batch (1.72B's 81.6 GiB at micro-batch 8 on the H200 record is above an H100's
   memory). A variant whose compile the library refuses on the running torch, or whose compiled gradients differ
   from eager's, runs without the compile (its row's ``compile_dropped`` says why); in stage 1 such a compile arm is
   skipped;
3. **micro-batch** (last: it only raises the matrix's tokens/s, which stages 1 and 2 compare at one micro-batch): the
   best configuration at 472M with the micro-batch doubled (32, 64, ... up to `MAX_BATCH`) until an arm fails — out
   of memory: that arm's row — or does not fit in the time left; a ``micro_batch`` row names the largest that fit.

Before the first compiled arm of each attention, `training.compiled_gradients_match` compiles a 2-layer fp32 GPT-2
of that attention with the part's backend and compares every gradient with eager's (a ``compile_check`` row).

Planning: an arm runs when the time it is estimated to need (`training.estimate_seconds`, from its reference: the
first measured 472M SDPA default-init arm with the same levers, else with the same compile mode; `reference_for`)
is left in the part's cap; an arm that does not fit is skipped with both numbers and the next one is tried. An arm
with no reference yet (the first of its compile mode) runs without an estimate. Every arm also runs under its own
time limit (`ARM_CAP_S` or the time left, whichever is less; ``common.time_limit``), so a compile slower than any
plan costs that arm's row, not the rest of the part. Full mode: 5 warm-up + 20 measured steps at sequence 1024;
smoke mode: 2 + 2 at sequence 16 on the tiny stand-in shapes.
"""

from __future__ import annotations

import dataclasses
import time

from .common import free_memory, row_on_error, time_limit, torch_setup, warm_up
from .training import Arm, Levers, backend, compiled_gradients_match, estimate_seconds, fp32_state, train_arm

LEVER_ARMS = (  # stage 1, in order: (label, levers) at 472M, SDPA, default init, the matrix micro-batch
    ("472M today", Levers()),
    ("472M + padded vocab 64", Levers(pad_vocab=64)),
    ("472M + chunked CE", Levers(chunked_ce=True)),
    ("472M + fused AdamW", Levers(fused_adamw=True)),
    ("472M + TF32", Levers(tf32=True)),
    ("472M + regional compile", Levers(compile="regional")),
    ("472M + whole-model compile", Levers(compile="whole")),
)
ALL_LEVERS = "472M all levers"  # every lever above, with the faster compile
BEST_ARMS = (  # stage 2, in order: (label, size, attention, init) in the best configuration
    ("1.72B best", "1.72b", "sdpa", "default"),
    ("472M affine_scaled, best", "472m", "affine_scaled", "default"),
    ("472M attention_sink, best", "472m", "attention_sink", "default"),
    ("472M preconditioned, best", "472m", "preconditioned", "default"),
    ("472M spectral, best", "472m", "spectral", "default"),
    ("472M conditioned init, best", "472m", "sdpa", "conditioned"),
)
BATCH = {"472m": 16, "1.72b": 8}  # the micro-batches of README's 472M / 1.72B commands
SMOKE_BATCH = 2
MAX_BATCH = {False: 128, True: 8}  # stage 3's last doubling (full, smoke)
ARM_CAP_S = {False: 150.0, True: 300.0}  # one arm's time limit (full, smoke): a safety net, above any planned arm
STEPS = {False: (5, 20), True: (2, 2)}  # (warm-up, measured) steps per arm (full, smoke)
clock = time.time  # the planner's clock (a test plants one)


def part_d(ctx: dict, record) -> None:
    torch = torch_setup(ctx)
    smoke = ctx["smoke"]
    warmup, measured = STEPS[smoke]
    seq = 16 if smoke else 1024
    record(kind="settings", warmup_steps=warmup, measured_steps=measured, seq=seq,
           precision="bf16 autocast, fp32 master weights", gradient_checkpointing=False,
           runner="transformers.Trainer, one process (no ZeRO)", compile_backend=backend(smoke),
           today="eager, adamw_torch, the model's own loss, unpadded vocabulary, IEEE fp32 matmuls (run_clm.py's "
                 "defaults)", arm_cap_s=ARM_CAP_S[smoke],
           timing="hf_condinit.callbacks.ThroughputCallback (step time device-synchronised; warm-up window dropped)")
    runner = Runner(torch, ctx, record, seq, warmup, measured)
    warm_up(torch, runner.device)
    batch = SMOKE_BATCH if smoke else BATCH["472m"]
    for label, levers in LEVER_ARMS:
        runner.run(Arm(label, "472m", "sdpa", "default", levers, batch, "levers"))
    everything = Levers(pad_vocab=64, chunked_ce=True, compile=fastest_compile(runner.measured), fused_adamw=True,
                        tf32=True)
    runner.run(Arm(ALL_LEVERS, "472m", "sdpa", "default", everything, batch, "levers"))
    best = best_row(runner.measured)
    levers = Levers(**best["levers"]) if best else Levers()
    today = next((r for r in runner.measured if r["arm"] == LEVER_ARMS[0][0]), None)
    record(kind="best", arm=best["arm"] if best else None, levers=dataclasses.asdict(levers),
           levers_text=levers.describe(), tokens_per_s=best["tokens_per_s"] if best else None,
           vs_today=best["tokens_per_s"] / today["tokens_per_s"] if best and today else None)
    for label, size, attention, init in BEST_ARMS:
        arm = Arm(label, size, attention, init, levers, SMOKE_BATCH if smoke else BATCH[size], "best")
        if runner.run(arm) is None and arm.batch > 1 and out_of_memory(runner.last):
            half = arm.batch // 2
            runner.run(dataclasses.replace(arm, label=f"{label}, batch {half}", batch=half))
    search_micro_batch(runner, levers, batch, MAX_BATCH[smoke], record)


class Runner:
    """Runs part d's arms one by one: the compile check, the plan, the time limit, one row per arm.

    ``measured``: the rows of the arms measured so far (each with ``tokens_per_s``), in order; ``last``: the last
    row recorded (a failed or skipped arm's, where `run` returns None)."""

    def __init__(self, torch, ctx, record, seq, warmup, measured):
        self.torch, self.smoke, self.seq = torch, ctx["smoke"], seq
        self.device = torch.device(ctx["device"])
        self.warmup, self.steps = warmup, measured
        self.deadline = ctx["started"] + ctx["cap"]
        self.peak = ctx.get("peak_flops")
        self.initial_fp32 = fp32_state(torch)
        self._record, self.measured, self.last, self.checks = record, [], None, {}

    def record(self, **row) -> dict:
        self.last = self._record(**row)
        return self.last

    def run(self, arm: Arm) -> dict | None:
        """Time ``arm`` if it may and fits; returns its measured row, or None (skipped or failed: ``last``)."""
        reason = self._compile_refusal(arm) if arm.levers.compile else None
        dropped = reason if arm.stage != "levers" else None  # a best-configuration arm runs without the compile
        if dropped:
            arm = dataclasses.replace(arm, levers=dataclasses.replace(arm.levers, compile=None))
        fields = dict(kind="train", arm=arm.label, stage=arm.stage, levers=dataclasses.asdict(arm.levers),
                      batch=arm.batch, **({"compile_dropped": dropped} if dropped else {}))
        if reason and not dropped:  # the compile lever itself: nothing to time without it
            self.record(**fields, skipped=reason)
            return None
        estimate = None
        reference = reference_for(arm, self.measured)
        if reference is not None:
            with row_on_error(self.record, self.device, kind="train_estimate", arm=arm.label):
                estimate = estimate_seconds(self.torch, reference, arm, self.seq, self.smoke,
                                            self.warmup + self.steps)
        left = self.deadline - clock()
        if left <= 1 or (estimate is not None and left < estimate["seconds"]):
            how = f", ~{estimate['seconds']:.0f}s estimated: {estimate['how']}" if estimate else ""
            self.record(**fields, estimate=estimate,
                        skipped=f"not enough time left in the part's cap ({left:.0f}s left{how})")
            return None
        limit = min(ARM_CAP_S[self.smoke], left)
        row = None
        with row_on_error(self.record, self.device, **fields, estimate=estimate, limit_s=limit):
            with time_limit(limit, arm.label):
                measured = train_arm(self.torch, arm, self.seq, self.warmup, self.steps, self.device, self.smoke,
                                     self.peak, self.initial_fp32)
            row = self.record(**measured, **({"compile_dropped": dropped} if dropped else {}), estimate=estimate,
                              limit_s=limit)
            self.measured.append(row)
        self.torch._dynamo.reset()  # compiled code of this arm may hold its model
        free_memory(self.device)
        return row

    def _compile_refusal(self, arm: Arm) -> str | None:
        """Why ``arm``'s compile cannot be timed here (torch too old, refused by the library, gradients that differ
        from eager's in the compile check, or the check failing), or None; the check runs once per attention."""
        from hf_condinit.attention.compile_guard import COMPILE_MIN_TORCH

        torch = self.torch
        if torch.__version__ < COMPILE_MIN_TORCH:  # transformers' own forward does not trace there
            return f"torch.compile needs torch >= {'.'.join(map(str, COMPILE_MIN_TORCH))} (this is torch " \
                   f"{torch.__version__})"
        if arm.attention not in self.checks:
            self.checks[arm.attention] = None
            with row_on_error(self.record, self.device, kind="compile_check", attention=arm.attention):
                self.checks[arm.attention] = self.record(
                    kind="compile_check", attention=arm.attention,
                    **compiled_gradients_match(torch, arm.attention, self.device, backend(self.smoke)))
        check = self.checks[arm.attention]
        if check and check.get("match"):
            return None
        if check and check.get("refused"):
            return f"compile refused on this torch: {check['refused']}"
        return "compiled gradients differ from eager's (or the check failed): see its compile_check row"


def reference_for(arm: Arm, measured: list[dict]) -> dict | None:
    """The measured row ``arm``'s time is estimated from: the first 472M SDPA default-init arm with the same levers,
    else the first with the same compile mode (the compile dominates an arm's warm-up); None when there is none."""
    same_mode = [r for r in measured if r["size"] == "472m" and r["attention"] == "sdpa" and r["init"] == "default"
                 and r["levers"]["compile"] == arm.levers.compile]
    exact = [r for r in same_mode if r["levers"] == dataclasses.asdict(arm.levers)]
    return (exact or same_mode or [None])[0]


def fastest_compile(measured: list[dict]) -> str | None:
    """The compile mode of the faster single-compile arm of stage 1 (None when neither was measured)."""
    alone = {r["levers"]["compile"]: r["tokens_per_s"] for r in measured if r["stage"] == "levers"
             and r["levers"] == dataclasses.asdict(Levers(compile=r["levers"]["compile"])) and r["levers"]["compile"]}
    return max(alone, key=alone.get) if alone else None


def best_row(measured: list[dict]) -> dict | None:
    """The fastest (tokens/s) measured arm of stage 1, or None."""
    levers = [r for r in measured if r["stage"] == "levers" and r.get("tokens_per_s")]
    return max(levers, key=lambda r: r["tokens_per_s"]) if levers else None


def out_of_memory(row: dict | None) -> bool:
    """Whether ``row`` is an arm's that failed for want of device memory."""
    return "out of memory" in ((row or {}).get("error") or "").lower()


def search_micro_batch(runner: Runner, levers: Levers, start: int, largest: int, record) -> None:
    """Stage 3: 472M in ``levers`` at 2, 4, ... × ``start`` up to ``largest``, stopping at the first arm that fails
    (out of memory: one row) or is skipped; then one ``micro_batch`` row: the largest micro-batch measured (``start``
    when none above it was) and why the search stopped."""
    fits, tried, stopped, oom = start, [], f"the search's limit, {largest}", False
    batch = 2 * start
    while batch <= largest:
        tried.append(batch)
        if runner.run(Arm(f"472M best, batch {batch}", "472m", "sdpa", "default", levers, batch, "micro-batch")):
            fits, batch = batch, 2 * batch
            continue
        why = runner.last.get("error") or runner.last.get("skipped") or "?"
        stopped, oom = f"batch {batch}: {why[:300]}", out_of_memory(runner.last)
        break
    record(kind="micro_batch", levers=dataclasses.asdict(levers), levers_text=levers.describe(), start=start,
           tried=tried, largest_fitting=fits, stopped=stopped, out_of_memory=oom)
