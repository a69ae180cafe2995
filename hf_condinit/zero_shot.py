"""Zero-shot evaluation of a saved causal LM on BLiMP (or any minimal-pair / multiple-choice folder of the same form).

    python -m hf_condinit.zero_shot RUN_DIR --blimp_dir ../shared/data/blimp

``RUN_DIR``: a ``run_clm.py`` output folder (model and tokenizer saved there) or any folder / hub id that
``AutoModelForCausalLM`` and ``AutoTokenizer`` load; hf_condinit is imported first, so folders saved with its
attention variants load with them. Prints a progress bar (stderr), a summary (overall and per field, each with its
Wilson 95 % interval and where it stands against chance), and as its **last line of stdout one JSON object** with the
keys of :func:`evaluate_blimp`. ``--save`` also merges these keys into
``RUN_DIR/eval_results.json`` (and ``all_results.json`` when it exists), where ``hf_condinit.compare`` reads them.

Scoring (:mod:`hf_condinit.evaluation.minimal_pairs`): a pair is right when the good sentence has the higher total
log-probability; each sentence is scored after one EOS token (``--prefix eos``, the default, the same for every
arm; ``bos`` / ``none`` on request, with ``none`` not scoring the first token). The default makes the same decision
as lm-evaluation-harness on the task YAMLs shipped in ``hf_condinit/lm_eval_tasks/blimp_local`` (README).

User errors (missing or malformed ``--blimp_dir``, a folder that is not a saved model, a bad flag) print one line
and exit 2 before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from .evaluation.minimal_pairs import (
    PREFIXES,
    MinimalPairSet,
    load_minimal_pairs,
    prefix_token_id,
    score_items,
    summarize,
)

__all__ = ["evaluate_blimp", "evaluate_minimal_pairs", "record_blimp", "save_results", "main"]

logger = logging.getLogger(__name__)

PROG = "python -m hf_condinit.zero_shot"
RESULT_FILES = ("eval_results.json", "all_results.json")


def evaluate_minimal_pairs(model, tokenizer, pairs, *, name: str = "blimp", batch_size: int = 64, prefix: str = "eos",
                           device=None, show_progress: bool = False, group_key: str | None = "field") -> dict:
    """Accuracy of ``model`` on a minimal-pair / multiple-choice set.

    Args:
        model: a causal LM (``logits`` of shape (batch, length, vocab)); evaluated where its parameters are unless
            ``device`` is given (the model is not moved).
        tokenizer: its tokenizer.
        pairs (`str` or `MinimalPairSet`): a folder of ``*.jsonl`` (:func:`~hf_condinit.evaluation.minimal_pairs.
            load_minimal_pairs`, grouped by ``group_key``) or an already loaded set.
        name: prefix of the result keys.
        batch_size: sentences per forward pass. prefix: ``"eos"``, ``"bos"`` or ``"none"`` (module docstring of
            :mod:`hf_condinit.evaluation.minimal_pairs`). show_progress: a tqdm bar over the batches.

    Returns ``{"<name>_accuracy": float in [0, 1], "<name>_field_accuracy": {group: acc},
    "<name>_paradigm_accuracy": {paradigm: acc}, "<name>_n_pairs": int, "<name>_prefix": str}`` and the binomial
    intervals of :func:`~hf_condinit.evaluation.minimal_pairs.summarize` (``<name>_ci95``, ``<name>_at_chance``,
    ``<name>_field_stats``, ``<name>_paradigm_stats``, ...: Wilson 95 %, chance 0.5 for pairs)."""
    if not isinstance(pairs, MinimalPairSet):
        pairs = load_minimal_pairs(pairs, group_key=group_key)
    _, correct = score_items(model, tokenizer, pairs.items, batch_size=batch_size, prefix=prefix, device=device,
                             show_progress=show_progress)
    return summarize(pairs.items, correct, name, prefix)


def evaluate_blimp(model, tokenizer, blimp_dir, *, batch_size: int = 64, prefix: str = "eos", device=None,
                   show_progress: bool = False) -> dict:
    """BLiMP accuracy of ``model``: :func:`evaluate_minimal_pairs` with ``name="blimp"`` and BLiMP's ``field``
    grouping (morphology, syntax, semantics, syntax_semantics). ``blimp_dir``: a folder of BLiMP ``*.jsonl``
    files (one per paradigm, e.g. ``../shared/data/blimp``) or a loaded :class:`MinimalPairSet`.

    Returns ``{"blimp_accuracy", "blimp_field_accuracy", "blimp_paradigm_accuracy", "blimp_n_pairs",
    "blimp_prefix"}``."""
    return evaluate_minimal_pairs(model, tokenizer, blimp_dir, name="blimp", batch_size=batch_size, prefix=prefix,
                                  device=device, show_progress=show_progress)


def record_blimp(trainer, tokenizer, pairs, *, prefix: str = "eos", batch_size: int = 64) -> dict:
    """BLiMP at the end of a script's run (``run_clm.py --blimp_dir``): :func:`evaluate_blimp` of ``trainer.model``,
    merged into ``<output_dir>/eval_results.json`` (and ``all_results.json``) by the world process zero, and the
    overall and per-field accuracies logged through the Trainer (``blimp_accuracy``, ``blimp_accuracy/<field>``:
    ``report_to`` and the model card, whose BLiMP section also lists the paradigms).

    Every process scores every pair (same batches in the same order), so a ZeRO-3-sharded model runs its forwards
    in lockstep; only the world process zero writes. Returns the results of :func:`evaluate_blimp`."""
    model = trainer.model
    results = evaluate_blimp(model, tokenizer, pairs, batch_size=batch_size, prefix=prefix,
                             show_progress=trainer.is_world_process_zero() and not trainer.args.disable_tqdm)
    if trainer.is_world_process_zero():
        save_results(trainer.args.output_dir, results)
    logged = {"blimp_accuracy": results["blimp_accuracy"]}
    logged.update({f"blimp_accuracy/{g}": acc for g, acc in results["blimp_field_accuracy"].items()})
    trainer.log(logged)
    return results


def save_results(run_dir: str, results: dict) -> list[str]:
    """Merge ``results`` into ``run_dir``'s ``eval_results.json`` (created when missing) and ``all_results.json``
    (only when it exists), keeping every other key; a replaced key is logged. Returns the paths written."""
    written = []
    for name in RESULT_FILES:
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path) and name != RESULT_FILES[0]:
            continue
        data = {}
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        replaced = sorted(k for k in results if k in data)
        if replaced:
            logger.warning(f"{path}: replacing {', '.join(replaced)}")
        data.update(results)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=4, sort_keys=True)
        written.append(path)
    return written


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Zero-shot BLiMP accuracy of a saved causal LM.")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="run_clm.py output folder (or any saved causal LM: folder or hub id)")
    p.add_argument("--blimp_dir", required=True, help="folder of BLiMP *.jsonl files, e.g. ../shared/data/blimp")
    p.add_argument("--prefix", choices=PREFIXES, default="eos",
                   help="token prepended to every sentence (default eos; none: the first token is not scored)")
    p.add_argument("--batch_size", type=int, default=64, help="sentences per forward pass (default 64)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's, one per core; on a machine shared with other "
                        "jobs 1 can be much faster, see README)")
    p.add_argument("--torch_dtype", choices=("float32", "bfloat16", "float16", "auto"), default="float32",
                   help="dtype of the loaded weights (default float32)")
    p.add_argument("--trust_remote_code", action="store_true", help="allow model code saved next to the weights")
    p.add_argument("--save", action="store_true",
                   help="also merge the results into RUN_DIR/eval_results.json (and all_results.json if present)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    return p


def _check_args(args) -> MinimalPairSet:
    """Every user error, before any model work (raises ``ValueError``): returns the loaded pairs."""
    if args.batch_size < 1:
        raise ValueError(f"--batch_size {args.batch_size}: must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: must be at least 1")
    pairs = load_minimal_pairs(args.blimp_dir)
    if args.save and not os.path.isdir(args.run_dir):
        raise ValueError(f"--save writes into RUN_DIR, but {args.run_dir} is not a local folder")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(args.run_dir, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(f"{args.run_dir} is not a saved model folder or a reachable hub id "
                         f"({str(err).splitlines()[0]})") from None
    return pairs


def _with_interval(accuracy: float, stats: dict) -> str:
    """``0.5178 (95 % CI 0.5109-0.5247, above chance)`` from a result's ``ci95`` and ``vs_chance`` (bare or
    ``blimp_``-prefixed keys)."""
    low, high = stats.get("ci95") or stats["blimp_ci95"]
    where = stats.get("vs_chance") or stats["blimp_vs_chance"]
    return f"{accuracy:.4f} (95 % CI {low:.4f}-{high:.4f}, {where} chance)"


def main(argv=None) -> dict:
    args = _parser().parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        pairs = _check_args(args)
    except (ValueError, OSError) as err:
        print(f"{PROG}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_condinit  # noqa: F401  (attention variants, hooks: a folder saved with them loads with them)

    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer = AutoTokenizer.from_pretrained(args.run_dir, trust_remote_code=args.trust_remote_code)
    try:
        prefix_token_id(tokenizer, args.prefix)
    except ValueError as err:
        print(f"{PROG}: error: --{err}", file=sys.stderr)
        sys.exit(2)
    dtype = args.torch_dtype if args.torch_dtype == "auto" else getattr(torch, args.torch_dtype)
    model = AutoModelForCausalLM.from_pretrained(args.run_dir, dtype=dtype, trust_remote_code=args.trust_remote_code)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    start = time.perf_counter()
    results = evaluate_blimp(model, tokenizer, pairs, batch_size=args.batch_size, prefix=args.prefix,
                             show_progress=not args.no_progress)
    seconds = time.perf_counter() - start
    print(f"BLiMP ({results['blimp_n_pairs']:,} pairs, prefix {args.prefix}, {seconds:.1f} s on {device}, "
          f"torch threads {torch.get_num_threads()}): accuracy {_with_interval(results['blimp_accuracy'], results)}")
    for group, stats in results["blimp_field_stats"].items():
        print(f"  {group}: {_with_interval(stats['accuracy'], stats)}")
    n_paradigms = len(results["blimp_paradigm_stats"])
    off = [p for p, stats in results["blimp_paradigm_stats"].items() if not stats["at_chance"]]
    print(f"  paradigms whose interval excludes chance (not corrected for {n_paradigms} tests): {len(off)} of "
          f"{n_paradigms}")
    if args.save:
        for path in save_results(args.run_dir, results):
            print(f"wrote {path}")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
