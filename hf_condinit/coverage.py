"""Which model types of the installed transformers take each init and each attention variant, measured.

``python -m hf_condinit.coverage [--types a b ...] [--out docs/coverage.md [--readme README.md]]``: for every model
type (or the ones given), builds a miniature of its default config (`hf_condinit.layouts.miniature`: 2 layers,
64 wide; class tried in the order masked LM, causal LM, base model), finds its layout (registered, or detected),
proves it on the miniature (`hf_condinit.layouts.proof`), then

- for each init (``conditioned``, ``mimetic``): builds the model with ``condinit=`` through ``from_config``,
  checks the written weights (`check_conditioned`: per-head QᵀQ = KᵀK = I and V = the block identity, zero q/k/v
  biases; `check_mimetic`: per group W_Q W_Kᵀ = the best rank-d approximation of the redrawn target, and Σ_h W_V W_O
  = the best rank-(H_kv·d) approximation of the VO target), and runs a forward and a backward pass (finite loss and
  gradients, a gradient on W_Q);
- for each variant (``affine_scaled``, ``attention_sink``, ``preconditioned``, ``spectral``): refused with the reason
  when the family cannot take it (`AttentionLayout.refuse_variant`), else built with it, a forward/backward pass,
  and, for causal LMs, a check that no output depends on a later token.

It prints one row per type and the counts on stdout and writes nothing else unless asked: ``--out FILE`` writes the
markdown table (init ok / which variants ok / why not; types that do not build from a shrunk default config, or
whose main input is neither token ids nor pixels, are listed apart), ``--readme FILE`` (with ``--out``) regenerates
the counts between README's coverage markers, ``--records FILE`` keeps the measured rows. An existing ``--out`` file
is overwritten only when this tool wrote it (its header carries the generated-by mark) or with ``--force``; every
refusal is one line and exit code 2, before any measurement.

This module holds the checks and the runs (`check_conditioned`, `check_mimetic`, `cover`, `run`) and the command
line (`main`); the rows, their counts and how they are written (the table, README's block, the refusals of ``--out``
/ ``--readme``) are `hf_condinit.coverage_report`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch
import transformers
from torch import nn

from .coverage_report import (
    INITS,
    VARIANTS,
    Row,
    check_outputs,
    counts,
    short_reason,
    to_markdown,
    update_readme,
)

SEED = 0
SEED_STRIDE = 1_000_003  # block generator seed = seed * SEED_STRIDE + ordinal (hf_condinit.api)

__all__ = ["check_conditioned", "check_mimetic", "cover", "run", "main"]


def auto_class(config):
    """The first Auto class (masked LM, causal LM, base model) that maps ``config``, or None."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    for auto in (AutoModelForMaskedLM, AutoModelForCausalLM, AutoModel):
        if type(config) in auto._model_mapping:
            return auto
    return None


# ---------------------------------------------------------------------------------------------- weight checks
def _blocks(model):
    """(ordinal, geometry, projections) per attention block. The ordinal is the block's index inside the innermost
    `PreTrainedModel` holding it, the one whose init pass wrote it (T5's encoder and decoder stacks, a multimodal
    model's language model are initialised as their own models)."""
    from transformers import PreTrainedModel

    from .layouts import get_layout

    layout = get_layout(model)
    owners = [name for name, m in model.named_modules() if isinstance(m, PreTrainedModel)]
    seen: dict[str, int] = {}
    for name, block in layout.attention_modules(model):
        owner = max((o for o in owners if not o or name.startswith(o + ".")), key=len)
        ordinal = seen[owner] = seen.get(owner, -1) + 1
        g = layout.geometry(block, model.config)
        yield ordinal, g, layout.projections(block, g)


def check_conditioned(model: nn.Module, qk_gain: float = 1.0, v_gain: float = 1.0, tol: float = 1e-4) -> int:
    """Assert conditioned init on the real weights; return the number of blocks checked.

    Per query (key) head: W (D, d) semi-orthogonal, WᵀW = qk_gain²·I_d when d ≤ D, else W Wᵀ = qk_gain²·I_D (a head
    wider than the model, e.g. a miniature's sliding-window heads); per KV head j: W_V^j = v_gain·E_j with E_j the
    (D, d) identity block at rows [j·d, (j+1)·d) mod D; q/k/v biases zero."""
    from .init.functional import semi_orthogonality_error

    n = 0
    for _, g, projs in _blocks(model):
        n += 1
        for role in ("q", "k"):
            for h, w in enumerate(projs[role].heads(projs[role].weight.detach().double())):
                err = semi_orthogonality_error(w, qk_gain)
                assert err <= tol, f"{role} head {h}: |WᵀW − I| = {err:.2e}"
        d = g.head_dim
        for j, w in enumerate(projs["v"].heads(projs["v"].weight.detach().double())):
            expected = torch.zeros_like(w)
            expected[(j * d + torch.arange(d)) % g.hidden, torch.arange(d)] = v_gain
            assert torch.equal(w, expected), f"V head {j} is not the identity block"
        for role in ("q", "k", "v"):
            if projs[role].bias is not None:
                for b in projs[role].bias_heads(projs[role].bias.detach()):
                    assert torch.count_nonzero(b) == 0, f"{role} bias not zero"
    return n


def _rank_truncation(a: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(a.double())
    return (u[:, :r] * s[:r]) @ vh[:r]


def check_mimetic(model: nn.Module, seed: int = SEED, tol: float = 1e-4) -> int:
    """Assert mimetic init on the real weights against targets redrawn from the block's own generator; return the
    number of blocks checked. Per KV group: W_Q^h W_K^gᵀ (h the group's first head) equals the best rank-d
    approximation of h's target; Σ_h W_V^{g(h)} W_O^h equals the best rank-(H_kv·d) approximation of the VO target
    (relative Frobenius error ≤ tol)."""
    from .config import CondInitConfig
    from .init.functional import mimetic_target

    cfg = CondInitConfig(method="mimetic", seed=seed)
    n = 0
    for ordinal, g, projs in _blocks(model):
        n += 1
        gen = torch.Generator().manual_seed(seed * SEED_STRIDE + ordinal)
        qk = [mimetic_target(g.hidden, cfg.mimetic_alpha1, cfg.mimetic_beta1, 1, cfg.mimetic_dist, gen)
              for _ in range(g.n_heads)]
        vo = mimetic_target(g.hidden, cfg.mimetic_alpha2, cfg.mimetic_beta2, cfg.mimetic_vo_sign, cfg.mimetic_dist,
                            gen)
        group = g.n_heads // g.n_kv_heads
        q = projs["q"].heads(projs["q"].weight.detach().double())
        k = projs["k"].heads(projs["k"].weight.detach().double())
        for h in range(0, g.n_heads, group):
            want = _rank_truncation(qk[h], g.head_dim)
            err = (q[h] @ k[h // group].T - want).norm() / want.norm()
            assert err <= tol, f"QK product of head {h}: relative error {err:.2e}"
        v = projs["v"].heads(projs["v"].weight.detach().double())
        o = projs["o"].heads(projs["o"].weight.detach().double())
        product = sum(v[h // group] @ o[h] for h in range(g.n_heads))
        want = _rank_truncation(vo, g.n_kv_heads * g.head_dim)
        err = (product - want).norm() / want.norm()
        assert err <= tol, f"VO product: relative error {err:.2e}"
    return n


# ---------------------------------------------------------------------------------------------- runs
def _first_tensor(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if hasattr(output, "values") else output
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise RuntimeError("the model returned no floating-point tensor")


def _float_outputs(output) -> list[torch.Tensor]:
    """Every floating-point tensor of a model output, nested outputs (a dual encoder's per-tower outputs) included."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    values = output.values() if hasattr(output, "values") else output if isinstance(output, (tuple, list)) else []
    return [t for v in values for t in _float_outputs(v)]


def _forward_backward(model: nn.Module, inputs: dict) -> None:
    """A forward and backward pass on Σ mean(t²) over every floating output (not only the first: GroupViT's first
    output is computed from one pooled position that, with random ids, attends only to itself, so no gradient
    would reach W_Q whatever the init); finite loss and gradients, and a gradient on the first block's W_Q."""
    model.train()
    loss = sum(t.float().pow(2).mean() for t in _float_outputs(model(**inputs)))
    if not torch.isfinite(loss):
        raise AssertionError(f"non-finite loss {loss.item()}")
    loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        raise AssertionError(f"non-finite gradients in {bad[:3]}")
    _, _, projs = next(_blocks(model))
    if projs["q"].weight.grad is None or not projs["q"].weight.grad.abs().sum() > 0:
        raise AssertionError("no gradient reaches W_Q")
    model.eval()


def _no_future_leak(model: nn.Module, inputs: dict) -> None:
    """Causal LMs: changing the last token must leave every earlier position's output unchanged."""
    ids = inputs["input_ids"]
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.config.get_text_config().vocab_size
    with torch.no_grad():
        a = _first_tensor(model(**{**inputs, "input_ids": ids}))[:, :-1]
        b = _first_tensor(model(**{**inputs, "input_ids": changed}))[:, :-1]
    if not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
        raise AssertionError("an output depends on a later token")


def _build(auto, config, **kwargs):
    torch.manual_seed(SEED)
    return auto.from_config(config, dtype=torch.float32, **kwargs).eval()


def cover(model_type: str) -> Row:
    """Measure one model type (see the module docstring)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .layouts import LAYOUTS, LayoutError
    from .layouts import detect
    from .layouts.miniature import build_miniature, miniature_inputs, shrink_config
    from .layouts.proof import prove_layout

    row = Row(model_type)
    start = time.perf_counter()
    try:
        try:
            config = AutoConfig.for_model(model_type)
            auto = auto_class(config)
            if auto is None:
                row.reason = "no model class"
                return row
            model_class = auto._model_mapping[type(config)]
            if getattr(model_class, "main_input_name", "input_ids") not in ("input_ids", "pixel_values"):
                row.model_class = model_class.__name__
                row.reason = f"no input recipe for main input {model_class.main_input_name!r}"
                return row
            row.model_class = model_class.__name__
            small = shrink_config(config)
            mini = build_miniature(model_class, config)
            inputs = miniature_inputs(mini)
        except Exception as err:
            row.reason = f"does not build from a shrunk default config ({type(err).__name__}: {short_reason(err, 160)})"
            return row
        if inputs is None:
            row.reason = f"no input recipe for main input {mini.main_input_name!r}"
            return row
        row.kinds = attention_kinds(config)
        reason = detect.refusal_reason(config)
        if reason:
            row.status, row.reason = "refused", reason
            return row
        try:
            if model_type in LAYOUTS:
                layout, row.source = LAYOUTS[model_type], "table"
                proof = prove_layout(mini, layout, inputs)
            else:
                key = (model_type, transformers.__version__)
                layout, proof = detect.detect_layout(mini, inputs,
                                                     accept=lambda lay: detect.trial_accept(key, config, lay))
                row.source = "detected"
                detect.remember_layout(key, layout)
        except LayoutError as err:
            row.status, row.reason = "refused", short_reason(err, 400)
            return row
        row.layout, row.via = layout.name, proof.via
        row.kinds = attention_kinds(config, layout)
        del mini
        for method in INITS:
            try:
                model = _build(auto, small, condinit={"method": method, "seed": SEED})
                (check_conditioned if method == "conditioned" else check_mimetic)(model)
                _forward_backward(model, inputs)
                row.inits[method] = "ok"
            except Exception as err:
                row.inits[method] = f"failed: {type(err).__name__}: {short_reason(err)}"
        ok = all(v == "ok" for v in row.inits.values())
        row.status = "supported" if ok else "failed"
        if not ok:
            row.reason = "; ".join(f"{m}: {v}" for m, v in row.inits.items() if v != "ok")
        causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_class.__name__.endswith("CausalLM")
        for variant in VARIANTS:
            refusal = None if variant == "spectral" else layout.refuse_variant(small, variant)
            if refusal:
                row.variants[variant] = f"refused: {refusal}"
                continue
            try:
                if variant == "spectral":
                    model = _build(auto, small, condinit={"method": "conditioned", "seed": SEED,
                                                                 "spectral_lambda": 1.0})
                else:
                    model = _build(auto, small, condinit={"method": "conditioned", "seed": SEED},
                                   attn_implementation=variant)
                _forward_backward(model, inputs)
                if causal and not getattr(small, "is_encoder_decoder", False):
                    _no_future_leak(model, inputs)
                row.variants[variant] = "ok"
            except Exception as err:
                row.variants[variant] = f"failed: {type(err).__name__}: {short_reason(err)}"
    except Exception as err:  # a bug of this tool or of the model: reported, the run goes on
        row.status, row.reason = "failed", f"{type(err).__name__}: {short_reason(err)} ({short_reason(traceback.format_exc(-1))})"
    finally:
        row.seconds = time.perf_counter() - start
    return row


def attention_kinds(config, layout=None) -> list[str]:
    """The kinds of ``config``'s token mixers (`hf_condinit.coverage_report.KINDS`), ``layout`` its proved layout
    (None: not proved). "MLA": a ``kv_lora_rank`` / ``q_lora_rank``; "non-attention": a type without softmax
    attention (`detect.NO_SOFTMAX`); "hybrid": layer kinds (``layer_types``, ``layers_block_type``, attention
    placed by index or period) that include a non-softmax mixer, or Mamba / linear-attention sizes (``mamba_*``,
    ``linear_num_*``, ``ssm_*``) beside the attention; "gated": a gated-query layout; "dense": a proved layout and
    none of these."""
    from .layouts import detect
    from .layouts.miniature import layer_kinds
    from .layouts.separate import GatedQuerySeparateLayout

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(getattr(c, "kv_lora_rank", None) or getattr(c, "q_lora_rank", None) for c in (config, text)):
        return ["MLA"]
    if config.model_type in detect.NO_SOFTMAX:
        return ["non-attention"]
    d = text.to_dict()
    n_layers = next((v for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(v := d.get(k), int)), 0)
    placement = ("layer_types", "layers_block_type", "attn_layer_indices", "attn_layer_period", "attn_layer_offset")
    layers = layer_kinds({k: getattr(text, k, None) for k in placement},  # as the model reads them (Dory's dict
                         getattr(text, "num_hidden_layers", n_layers)) or []  # pairs each layer with "mlp")
    kinds = []
    if any(k in detect.NON_SOFTMAX_LAYERS or k == "other" for k in layers) or any(
            k.startswith(("mamba_", "linear_num_", "ssm_")) and isinstance(v, int) for k, v in d.items()):
        kinds.append("hybrid")
    if isinstance(layout, GatedQuerySeparateLayout):
        kinds.append("gated")
    if layout is not None and not kinds:
        kinds.append("dense")
    return kinds


def all_model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(CONFIG_MAPPING_NAMES)


def run(model_types: list[str], progress: bool = True, timeout: int = 120, records: str | None = None) -> list[Row]:
    """`cover` each type; with ``records`` (a JSON-lines file), rows already there are reused and each new row is
    appended as soon as it is measured, so an interrupted run resumes where it stopped."""
    import dataclasses
    import json

    done: dict[str, Row] = {}
    if records and os.path.exists(records):
        with open(records, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = Row(**json.loads(line))
                    done[row.model_type] = row
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    todo = [t for t in model_types if t not in done]
    iterator = tqdm(todo, desc="coverage", disable=not progress) if tqdm else todo
    for model_type in iterator:
        row = _cover_with_timeout(model_type, timeout)
        done[model_type] = row
        if records:
            with open(records, "a", encoding="utf-8") as f:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")
    return [done[t] for t in model_types]


class _Timeout(BaseException):
    pass


def _cover_with_timeout(model_type: str, timeout: int) -> Row:
    """`cover` stopped after ``timeout`` seconds of CPU time (so a loaded machine does not stop it early; main
    thread on POSIX; no limit elsewhere)."""
    import signal

    if timeout <= 0 or not hasattr(signal, "SIGPROF"):
        return cover(model_type)

    def stop(signum, frame):
        raise _Timeout(f"took more than {timeout} s of CPU time")

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, timeout)
    try:
        return cover(model_type)
    except _Timeout as err:
        return Row(model_type, status="not built", reason=f"coverage run stopped: {err}", seconds=timeout)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def main(argv: list[str] | None = None) -> int:
    from .names import did_you_mean

    parser = argparse.ArgumentParser(prog="python -m hf_condinit.coverage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="*", help="model types to measure (default: every installed one)")
    parser.add_argument("--out", default=None,
                        help="markdown table to write, e.g. docs/coverage.md (default: none, rows on stdout only)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an --out file that this tool did not write")
    parser.add_argument("--readme", default=None,
                        help="README whose coverage block (between the coverage markers) to regenerate; needs --out")
    parser.add_argument("--timeout", type=int, default=120, help="CPU seconds per model type (0: no limit)")
    parser.add_argument("--records", default=None,
                        help="JSON-lines file of measured rows: reused and appended to (resumable runs)")
    args = parser.parse_args(argv)
    import hf_condinit  # noqa: F401  (installs the hooks)

    known = all_model_types()
    types = args.types or known
    unknown = [t for t in dict.fromkeys(types) if t not in known]
    try:
        if unknown:
            raise ValueError(f"unknown model type {unknown[0]!r}{did_you_mean(unknown[0], known)}"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                             + "; see transformers' CONFIG_MAPPING")
        check_outputs(args.out, args.readme, args.force)
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()
    rows = run(types, timeout=args.timeout, records=args.records)
    seconds = sum(r.seconds for r in rows)  # measured time per type, summed (rows reused from --records included)
    command = "python -m hf_condinit.coverage " + " ".join(argv if argv is not None else sys.argv[1:])
    for r in rows:
        print(f"{r.model_type:28s} {r.status:10s} {','.join(v for v in VARIANTS if r.variants.get(v) == 'ok'):50s} "
              f"{short_reason(r.reason, 120)}")
    c = counts(rows)
    print(f"{c} in {seconds:.0f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(to_markdown(rows, seconds, command.strip()))
        print(f"table written to {args.out}")
    if args.readme:
        update_readme(args.readme, rows, args.out)
        print(f"coverage block of {args.readme} regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
