"""hf_condinit.zero_shot against lm-evaluation-harness on every shared BLiMP pair, and the time each takes.

Scores a saved causal LM on all paradigms of ``--blimp_dir`` twice: with :func:`hf_condinit.zero_shot.evaluate_blimp`'s
scorer (:func:`hf_condinit.evaluation.minimal_pairs.score_items`) and with lm-evaluation-harness 0.4 on the shipped
``blimp_local`` task YAMLs (``HFLM`` around the same in-memory model, ``log_samples``), then compares pair by pair:
the two log-likelihoods of every pair (max absolute difference) and the decision (good > bad). lm-eval's ``argmax``
counts an exact tie as right and ours as wrong: ties are counted separately. Writes a JSON record and prints it.

    python benchmarks/blimp_agreement.py RUN_DIR --blimp_dir ../shared/data/blimp \\
        --out benchmarks/results/blimp_agreement.json

Needs ``pip install -e ".[lm_eval]"``. Times are wall clock on this machine; the load average before and after is
recorded (a shared machine slows both scorers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_condinit  # noqa: F401
from hf_condinit.evaluation.minimal_pairs import load_minimal_pairs, score_items, summarize
from hf_condinit.lm_eval_tasks import TASKS_DIR


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--blimp_dir", required=True)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--pairs_per_paradigm", type=int, default=None,
                   help="only the first N pairs of every paradigm (default: all)")
    p.add_argument("--out", help="JSON record to write")
    args = p.parse_args(argv)

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    load_before = os.getloadavg()
    tokenizer = AutoTokenizer.from_pretrained(args.run_dir)
    model = AutoModelForCausalLM.from_pretrained(args.run_dir).eval()
    blimp_dir = args.blimp_dir
    if args.pairs_per_paradigm:  # a folder with the first N lines of every file
        blimp_dir = tempfile.mkdtemp(prefix="blimp_head_")
        for name in sorted(os.listdir(args.blimp_dir)):
            if name.endswith(".jsonl"):
                with open(os.path.join(args.blimp_dir, name), encoding="utf-8") as f:
                    head = [line for _, line in zip(range(args.pairs_per_paradigm), f)]
                with open(os.path.join(blimp_dir, name), "w", encoding="utf-8") as f:
                    f.writelines(head)
    pairs = load_minimal_pairs(blimp_dir)

    start = time.perf_counter()
    scores, correct = score_items(model, tokenizer, pairs.items, batch_size=args.batch_size, show_progress=True)
    ours_seconds = time.perf_counter() - start
    ours = summarize(pairs.items, correct, "blimp", "eos")

    start = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size, device=str(model.device)),
        tasks=[f"blimp_local_{p}" for p in pairs.paradigms],
        task_manager=TaskManager(include_path=TASKS_DIR, metadata={"blimp_dir": blimp_dir}),
        log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
    )
    lm_eval_seconds = time.perf_counter() - start

    by_pair = {(it.paradigm, it.choices): (sc, ok) for it, sc, ok in zip(pairs.items, scores, correct)}
    n = same = ties = 0
    max_diff = 0.0
    worst_paradigm_acc_diff = 0.0
    for paradigm in pairs.paradigms:
        samples = results["samples"][f"blimp_local_{paradigm}"]
        for s in samples:
            doc = s["doc"]
            lls = [r[0] for r in s["filtered_resps"]]
            our_scores, our_ok = by_pair[(paradigm, (doc["sentence_good"], doc["sentence_bad"]))]
            max_diff = max(max_diff, *(abs(a - b) for a, b in zip(lls, our_scores)))
            n += 1
            if lls[0] == lls[1]:
                ties += 1
            else:
                same += bool(s["acc"]) == our_ok
        acc = results["results"][f"blimp_local_{paradigm}"]["acc,none"]
        worst_paradigm_acc_diff = max(worst_paradigm_acc_diff, abs(acc - ours["blimp_paradigm_accuracy"][paradigm]))
    record = {
        "run_dir": args.run_dir, "blimp_dir": args.blimp_dir,
        "pairs_per_paradigm": args.pairs_per_paradigm, "paradigms": len(pairs.paradigms), "pairs": n,
        "same_decision": same, "exact_ties_in_lm_eval": ties, "max_abs_loglik_diff": max_diff,
        "max_paradigm_accuracy_diff": worst_paradigm_acc_diff, "ours_accuracy": ours["blimp_accuracy"],
        "ours_seconds": round(ours_seconds, 1), "lm_eval_seconds": round(lm_eval_seconds, 1),
        "torch_threads": torch.get_num_threads(), "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "lm_eval_version": lm_eval.__version__,
        "command": "python " + " ".join([os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])]),
    }
    print(json.dumps(record, indent=2))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()
