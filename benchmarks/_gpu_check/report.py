"""The Markdown report of the GPU check (``gpu_check.md``), rendered from the collected rows.

A part whose rendering fails says so in its section (its rows stay in ``gpu_check.json``); the other parts render.
"""

from __future__ import annotations

from .judge import BF16_FACTOR, BF16_FLOOR, REL_TOL_FP32, ZERO_SCALE


def _fmt(x, spec=".3g", none="–"):
    if x is None:
        return none
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _error_rows(rows, kinds) -> list[str]:
    """One line per failed implementation / arm / build of a part (rows with an ``error``)."""
    L = []
    for r in rows:
        if "error" in r and r.get("kind") in kinds:
            what = " ".join(str(r[k]) for k in ("impl", "seq", "arm", "size", "method") if k in r)
            L.append(f"\n**{r['kind']} {what} failed**: `{r['error'][:300]}`")
    return L


def markdown(result: dict) -> str:
    s = result.get("settings", {})
    smoke = s.get("smoke", False)
    L = []
    if smoke:
        L.append("# GPU check — SMOKE RUN (CPU, tiny stand-in shapes): these numbers are not GPU results\n")
        L.append("Rows named 472M / 1.72B use the tiny shapes in their *shape* column, not the real models.\n")
    else:
        L.append(f"# GPU check on {s.get('device_name') or s.get('device', '?')}\n")
    L.append(f"Command: `{s.get('command', '?')}`  \nStarted {s.get('started_utc', '?')}; every number below was "
             "measured by this run" + (" in smoke mode (CPU)." if smoke else ".") + "\n")
    for part, p in result.get("parts", {}).items():
        state = p.get("state", "pending")
        L.append(f"## {p['title']} — {state}" + (f" ({p['seconds']} s of a {p['cap_s']:.0f} s cap)" if "seconds" in p
                                                   else ""))
        L.append("")
        rows = p.get("rows", [])
        try:
            L.extend(RENDER[part](rows))
        except Exception as e:  # noqa: BLE001 - one part's rendering must not hide the others
            L.append(f"*Rendering this part failed ({type(e).__name__}: {e}); its rows are in gpu_check.json.*")
        for r in rows:
            if r.get("kind") == "part_error":
                L.append(f"\n**the part stopped**: `{r['error'][:300]}`")
        if state == "timeout":
            L.append("\n*Killed at its time cap: the rows above are what it measured before.*")
        L.append("")
    return "\n".join(L) + "\n"


def _render_a(rows):
    L = []
    env = next((r for r in rows if r.get("kind") == "env" and "error" not in r), None)
    if env:
        L.append("| item | value |\n|---|---|")
        for key in ("device", "device_name", "capability", "memory_gib", "cpu_count", "python", "torch", "cuda",
                    "cudnn", "transformers", "accelerate", "deepspeed", "flash_attn_package", "kernels_package",
                    "peak_bf16_tflops", "peak_source"):
            if key in env:
                L.append(f"| {key} | {_fmt(env[key], '.4g', 'none')} |")
    backends = [r for r in rows if r.get("kind") == "sdpa_backend"]
    if backends:
        L.append("\nSDPA backends (causal, 4 heads, " + str(backends[0]["dtype"]) + "):\n")
        L.append("| backend | head dim | runs | why not |\n|---|---|---|---|")
        for r in backends:
            L.append(f"| {r['backend']} | {r['head_dim']} | {'yes' if r['runs'] else 'no'} | {r['why'] or ''} |")
    mm = next((r for r in rows if r.get("kind") == "matmul" and "error" not in r), None)
    if mm:
        L.append(f"\nMeasured {mm['n']}×{mm['n']} matmul ({mm['dtype']}): {mm['tflops']:.3g} TFLOP/s"
                 + (f" = {100 * mm['fraction_of_peak']:.0f} % of the table's peak" if mm.get("fraction_of_peak")
                    else "")
                 + f" (median of {mm['reps']} repetitions, {mm['clock']}, after {mm['warmups']} warm-ups)")
    return L + _error_rows(rows, ("env", "matmul"))


def _render_b(rows):
    cases = [r for r in rows if r.get("kind") == "case"]
    if not cases:
        return []
    n_ok = sum(bool(r.get("passed")) for r in cases)
    L = [f"{n_ok} / {len(cases)} cases pass. Each tensor (the output, every gradient; or the logits of each "
         "comparable decoding step) is judged on its own scale: rel err = max |got − fp32 reference| / max |fp32 "
         f"reference| of that tensor. fp32 passes at ≤ {REL_TOL_FP32:g}; bf16 at ≤ max({BF16_FACTOR:g} × the bf16 "
         f"reference's own rel err on that tensor, {BF16_FLOOR:g}) (the naive reference run in bf16 on the same "
         "weights). Any NaN / inf in any tensor fails the case. A gradient below "
         f"{ZERO_SCALE:g} × the case's largest tensor is zero by construction and judged on that largest scale. "
         "The row shows the worst tensor (nearest to its limit, or furthest past it). Init: the device build equals "
         "the CPU build exactly.\n",
         "| case | dtype | worst tensor | rel err | bf16 ref's rel err | limit | output rel err | pass | detail |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in cases:
        detail = []
        if r.get("error"):
            detail.append(r["error"][:200])
        if r.get("non_finite"):
            detail.append("non-finite: " + ", ".join(r["non_finite"][:4]))
        if "same_tokens" in r:
            detail.append(f"{r['steps_compared']} steps compared, same tokens: {r['same_tokens']}")
        if r.get("qTq_minus_I") is not None:
            detail.append(f"max abs(QᵀQ − I) {r['qTq_minus_I']:.2g}")
        if "max_abs_err" in r and "worst_tensor" not in r:
            detail.append(f"max abs err {_fmt(r['max_abs_err'], '.2g')}")
        if "builds" in r:
            detail.append(f"{r['builds']} builds, {r['n_off_device']} tensors off the device {r['off_device'] or ''}")
        if r.get("zero_by_construction"):
            detail.append(f"{len(r['zero_by_construction'])} zero by construction")
        ref = _fmt(r.get("ref_rel_err"), ".2g") if r["dtype"] != "fp32" else "–"
        L.append(f"| {r['case']} | {r['dtype']} | {r.get('worst_tensor') or '–'} | {_fmt(r.get('rel_err'), '.2g')} | "
                 f"{ref} | {_fmt(r.get('limit'), '.2g')} | {_fmt(r.get('out_rel_err'), '.2g')} | "
                 f"{'yes' if r.get('passed') else '**NO**'} | {'; '.join(detail)} |")
    return L


_ALLOWED = {"flash": {"flash"}, "efficient": {"efficient"}, "cudnn": {"cudnn"},
            "fused (no math)": {"flash", "efficient", "cudnn"}}


def _restricted_cell(row: dict, label: str) -> str:
    """Part c's kernel table cell: whether ``row``'s implementation runs with SDPA restricted to ``label``, and what
    ran there when it is outside the restriction (a kernel called directly, not through SDPA's dispatch)."""
    if not row["runs_on"].get(label):
        return f"no ({row['why_not'].get(label, '')[:60]})"
    allowed = _ALLOWED[label] | {"none (no SDPA call)"}
    outside = [f for f in row.get("ran_under", {}).get(label, []) if f not in allowed]
    return f"yes, ran {', '.join(outside)}" if outside else "yes"


def _render_c(rows):
    st = next((r for r in rows if r.get("kind") == "settings"), None)
    L = []
    if st:
        L.append(f"{st['layers']} GPT-2 layers, {st['hidden']} wide, {st['heads']} heads, {st['dtype']}, "
                 f"{st['tokens']} tokens per step, forward + backward, median of {st['reps']} steps after "
                 f"{st['warmup']} warm-up; each implementation measured on its own; memory: {st['memory']}.\n")
    kernels = [r for r in rows if r.get("kind") == "kernels" and "error" not in r]
    if kernels:
        labels = list(kernels[0]["runs_on"])
        L.append(f"SDPA kernel families (one forward + backward at sequence {kernels[0]['seq']}; *ran* = the "
                 "operators the profiler saw by default; then whether it runs when SDPA is restricted to each, and "
                 "what ran there when that is not what SDPA was restricted to):\n")
        L.append("| impl | ran | " + " | ".join(labels) + " |\n|---|---|" + "---|" * len(labels))
        for r in kernels:
            L.append(f"| {r['impl']} | {', '.join(r['ran'])} | "
                     + " | ".join(_restricted_cell(r, k) for k in labels) + " |")
        L.append("")
        for r in kernels:
            for path in r.get("sink_kernel", []):
                L.append(f"{r['impl']}: {path['calls']} attention calls took `{path['kernel']}` ({path['why']}); the "
                         f"profiler saw {', '.join(f'`{op}`' for op in r['sdpa_ops']) or 'no SDPA kernel'}.\n")
    speed = [r for r in rows if r.get("kind") == "speed" and "error" not in r]
    if speed:
        L.append("| seq | impl | batch | tokens/s | × sdpa | peak MiB | memory × sdpa |")
        L.append("|---|---|---|---|---|---|---|")
        for r in speed:
            L.append(f"| {r['seq']} | {r['impl']} | {r['batch']} | {r['tokens_per_s']:.0f} | "
                     f"{_fmt(r['throughput_vs_sdpa'], '.2f')} | {r['peak_mem_bytes'] / 2**20:.1f} | "
                     f"{_fmt(r['memory_vs_sdpa'], '.2f')} |")
    return L + _error_rows(rows, ("kernels", "speed"))


def _render_d(rows):
    st = next((r for r in rows if r.get("kind") == "settings"), None)
    L = []
    if st:
        L.append(f"{st['runner']}, {st['precision']}, gradient checkpointing {st['gradient_checkpointing']}, sequence "
                 f"{st['seq']}, {st['warmup_steps']} warm-up + {st['measured_steps']} measured steps per arm (each "
                 f"under a {st['arm_cap_s']:.0f} s limit); {st['timing']}. Today = {st['today']}; compiled arms: "
                 f"Trainer torch_compile, backend {st['compile_backend']}. MFU = (6·N + 12·L·D·T) FLOPs per token "
                 "(hf_condinit.perf) over the table's peak; × today = tokens/s over the 472M today arm (472M rows).\n")
    for r in (r for r in rows if r.get("kind") == "compile_check"):
        if "error" in r:
            L.append(f"Compiled gradients of {r['attention']}: **check failed**: `{r['error'][:200]}`\n")
        elif r.get("refused"):
            L.append(f"Compiled {r['attention']}: refused on this torch, its arms run without compile: "
                     f"`{r['refused']}`\n")
        else:
            verdict = "match eager's" if r["match"] else "**differ from eager's** (its arms run without compile)"
            zeroed = f"; zero where eager's are not: {', '.join(r['zero_compiled_grads'])}" if r[
                "zero_compiled_grads"] else ""
            L.append(f"Compiled gradients of {r['attention']} ({r['backend']}) {verdict}: worst {r['worst']}, relative "
                     f"error {r['worst_rel_err']:.1e}{zeroed}.\n")
    train = [r for r in rows if r.get("kind") == "train"]
    today = next((r["tokens_per_s"] for r in train if r.get("stage") == "levers" and r.get("tokens_per_s")
                  and not any(r["levers"].values())), None)
    if train:
        L.append("| arm | levers | shape | batch | tokens/s | × today | MFU | peak GiB | s/step | graphs / breaks | "
                 "build s | loss first → last |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in train:
            levers = r.get("levers_text") or ", ".join(k for k, v in r.get("levers", {}).items() if v) or "today"
            if "skipped" in r or "error" in r:
                what = f"skipped: {r['skipped']}" if "skipped" in r else f"**failed**: `{r['error'][:200]}`"
                L.append(f"| {r['arm']} | {levers} | {what} |  |  |  |  |  |  |  |  |  |")
                continue
            if r.get("compile_dropped"):
                levers += " (no compile: see its compile_check)"
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "– (peak unknown)"
            ratio = r["tokens_per_s"] / today if today and r.get("size") == "472m" else None
            graphs = f"{r['graphs']} / {r['graph_breaks']}" if r.get("graphs") is not None else "–"
            L.append(f"| {r['arm']} | {levers} | {r['shape']} | {r['batch']} | {_fmt(r['tokens_per_s'], '.0f')} | "
                     f"{_fmt(ratio, '.2f')} | {mfu} | {_fmt(r['peak_memory_gib'], '.1f', '– (CPU)')} | "
                     f"{_fmt(r['seconds_per_step'], '.3f')} | {graphs} | {r['build_s']:.1f} | "
                     f"{_fmt(r['first_loss'], '.3f')} → {_fmt(r['last_loss'], '.3f')} |")
        ran = [r for r in train if "tokens_per_s" in r]
        if ran:
            L.append("\nWhat each arm ran with (read from the trained model, optimizer and Trainer):\n")
            L.append("| arm | vocabulary rows (real) | loss forward | optimizer | compiled | fp32 matmul |")
            L.append("|---|---|---|---|---|---|")
            for r in ran:
                L.append(f"| {r['arm']} | {r['vocab_rows']} ({r['real_vocab']}) | `{r['loss_forward']}` | "
                         f"{r['optimizer']} | {r['compiled']} | {r['fp32_matmul']} |")
            for r in ran:
                if r.get("graph_breaks"):
                    L.append(f"\n{r['arm']}: {r['graph_breaks']} graph breaks: "
                             + "; ".join(f"`{why[:150]}`" for why in r.get("graph_break_reasons") or []))
    best = next((r for r in rows if r.get("kind") == "best"), None)
    if best and best.get("arm"):
        L.append(f"\nBest configuration: {best['arm']} ({best['levers_text']}), {best['tokens_per_s']:.0f} tokens/s"
                 + (f", {best['vs_today']:.2f}× today" if best.get("vs_today") else "") + ".")
    search = next((r for r in rows if r.get("kind") == "micro_batch"), None)
    if search:
        L.append(f"\nLargest micro-batch measured in the best configuration: {search['largest_fitting']} (tried "
                 f"{', '.join(map(str, search['tried'])) or 'none'}; stopped: {search['stopped'][:200]}"
                 + ("; out of memory" if search["out_of_memory"] else "") + ").")
    for r in train:
        if r.get("estimate") and "skipped" not in r:
            L.append(f"\n{r['arm']}: run after an estimate of {r['estimate']['seconds']:.0f} s "
                     f"({r['estimate']['how']}); it took {_fmt(r.get('arm_wall_s'), '.0f')} s.")
    return L + _error_rows(rows, ("train_estimate",))


def _render_e(rows):
    L = []
    warm = [r for r in rows if r.get("kind") == "warmup" and "error" not in r]
    if warm:
        L.append("Throwaway warm-up builds (472M; mimetic: one 472M-shaped layer; not timed below): "
                 + ", ".join(f"{r['method']} {r['seconds']:.2f} s" for r in warm) + ".\n")
    builds = [r for r in rows if r.get("kind") == "build" and "error" not in r]
    if builds:
        L.append("| config | shape | init | params | build s | × default | peak allocated GiB | block 0 check | "
                 "note |\n|---|---|---|---|---|---|---|---|---|")
        for r in builds:
            note, check = r.get("note", ""), r.get("check")
            if check and "qk_excess" in check:
                verdict = f"Eckart–Young excess QK {check['qk_excess']:.1e}, VO {check['vo_excess']:.1e}"
            elif check:
                verdict = f"vs CPU {check['max_abs_vs_cpu']:.1e}, ‖WᵀW − I‖ {check['semi_orthogonality']:.1e}"
            verdict = (verdict + (" ok" if check["passed"] else " **FAILED**")) if check else "–"
            if r.get("extrapolated_s") is not None:
                note += f"; {r['extrapolated_s']:.1f} s extrapolated to {r['layers_full']} layers"
            L.append(f"| {r['size']} | {r['shape']} | {r['method']} | {r['n_params'] / 1e6:.1f} M | "
                     f"{r['seconds']:.2f} | {_fmt(r['vs_default'], '.2f')} | "
                     f"{_fmt(r['peak_allocated_gib'], '.2f', '– (CPU)')} | {verdict} | {note} |")
    for r in (r for r in rows if r.get("kind") == "draw" and "error" not in r):
        L.append(f"\nCPU draws alone, {r['size']} ({r['note']}): conditioned {r['conditioned_s']:.2f} s, "
                 f"mimetic {r['mimetic_s']:.2f} s.")
    return L + _error_rows(rows, ("warmup", "build", "draw"))


RENDER = {"a": _render_a, "b": _render_b, "c": _render_c, "d": _render_d, "e": _render_e}
