"""A fast stand-in for run_clm.py in the study tests: takes the flags a study sets, sleeps ``--sleep`` seconds
(SIGTERM meanwhile: exit 75 with nothing written, as a preempted run), then writes the files of a finished run.

Its final eval_loss is known: ``3 + (log10(lr) - log10(best)) ** 2 + 0.01 * seed + offset`` with ``best`` 3e-3 and
``offset`` 0 for default init, ``best`` 1e-2 and ``offset`` -0.05 for the others (+0.001 × seed more for
conditioned, so its seeds differ from default's by a spread). ``$FAKE_RUN_LOG``: every start is appended there.
Like the example scripts it has ``parse(argv)`` (what the study checks before saving a plan), ``--do_train`` /
``--do_eval`` (neither: both), takes ``$FAKE_RUN_SLEEP`` as the default of ``--sleep`` (so a study's command, and so
its report, stays the same) and writes ``OMP_NUM_THREADS`` into ``train_results.json`` (``threads``)."""

import argparse
import json
import math
import os
import signal
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(prog="fake_run")
    for flag in ("--init", "--attention", "--output_dir", "--v_gain"):
        p.add_argument(flag)
    p.add_argument("--seed", type=int)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--sleep", type=float, default=float(os.environ.get("FAKE_RUN_SLEEP", 0)))
    p.add_argument("--exit", type=int, default=0, help="exit with this code at once (a failing command)")
    p.add_argument("--kill_seed", type=int, help="the run of this seed kills itself (SIGKILL) at once")
    p.add_argument("--do_train", action="store_true")
    p.add_argument("--do_eval", action="store_true")
    a = p.parse_args(argv)
    if not (a.do_train or a.do_eval):
        a.do_train = a.do_eval = True
    return a


def main():
    a = parse()
    if os.environ.get("FAKE_RUN_LOG"):
        with open(os.environ["FAKE_RUN_LOG"], "a") as f:
            f.write(f"{os.path.basename(os.path.dirname(a.output_dir))}/{os.path.basename(a.output_dir)}\n")
    if a.exit:
        print(f"fake_run: error: exiting {a.exit} as asked")
        sys.exit(a.exit)
    if a.kill_seed == a.seed:
        os.kill(os.getpid(), signal.SIGKILL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
    time.sleep(a.sleep)
    best, offset = (3e-3, 0.0) if a.init == "default" else (1e-2, -0.05)
    final = 3 + (math.log10(a.learning_rate) - math.log10(best)) ** 2 + 0.01 * a.seed + offset
    final += 0.001 * a.seed if a.init == "conditioned" else 0.0
    os.makedirs(a.output_dir, exist_ok=True)
    curve = [(s, final + 1.0 / s) for s in (2, 4, 6, 8)]
    history = [{"step": s, "eval_loss": v} for s, v in curve]
    with open(os.path.join(a.output_dir, "trainer_state.json"), "w") as f:
        json.dump({"global_step": 8, "log_history": history}, f)
    with open(os.path.join(a.output_dir, "eval_results.json"), "w") as f:
        json.dump({"eval_loss": curve[-1][1], "perplexity": math.exp(curve[-1][1])}, f)
    if not a.do_train:  # evaluation only: no training results, as the real scripts
        return
    with open(os.path.join(a.output_dir, "train_results.json"), "w") as f:
        json.dump({"train_loss": final, "train_machine": "fake", "threads": os.environ.get("OMP_NUM_THREADS")}, f)


if __name__ == "__main__":
    main()
