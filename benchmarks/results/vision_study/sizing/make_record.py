"""Builds record.json of the ViT study's sizing from the raw files beside it (run from the repository root):

    python benchmarks/results/vision_study/sizing/make_record.py

- ``cpu_cost_times.txt``: ``/usr/bin/time`` of the study's cell command cut short (4 and 24 training steps, and 4
  steps + an evaluation of 2,000 test_dev images), 1 torch thread; each run's command is on its ``==`` line.
- ``sizing_monitor.txt``: every 60 s of the sizing run (record.md): unix time, clock, its CPU seconds, load, step.
- ``sizing_trainer_state.json``: ``trainer_state.json`` of the sizing run's last checkpoint (its log history).

The study's cost is CPU seconds (load-independent, unlike wall time on this shared machine): per cell, 1,570 steps,
20 evaluations of 5,000 images and one start; per study, 24-27 cells (3 arms) or 32-36 (with v_gain=0.25).
"""

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, EVALS, EVAL_IMAGES, BATCH = 1570, 20, 5000, 128


def cpu_runs() -> dict:
    runs, text = {}, open(os.path.join(HERE, "cpu_cost_times.txt")).read()
    for name, user, sys_, wall in re.findall(r"^(\w+) user_s=([\d.]+) sys_s=([\d.]+) wall_s=([\d.]+)", text, re.M):
        runs[name] = dict(cpu_s=float(user) + float(sys_), wall_s=float(wall))
    return runs


def main():
    runs = cpu_runs()
    step_cpu = (runs["train24"]["cpu_s"] - runs["train4"]["cpu_s"]) / 20
    eval_image_cpu = (runs["train4_eval2000"]["cpu_s"] - runs["train4"]["cpu_s"]) / 2000
    start_cpu = runs["train4"]["cpu_s"] - 4 * step_cpu
    cell_cpu = STEPS * step_cpu + EVALS * EVAL_IMAGES * eval_image_cpu + start_cpu
    study = {f"{n}_cells": dict(cpu_hours=n * cell_cpu / 3600, wall_hours_2_idle_cores=n * cell_cpu / 3600 / 2)
             for n in (24, 27, 32, 36)}

    samples = []
    for line in open(os.path.join(HERE, "sizing_monitor.txt")):
        m = re.match(r"(\d+) \S+ cpu_s=(\d+) load=([\d.]+) step=(\d*)", line)
        if m:
            samples.append(dict(t=int(m[1]), cpu_s=int(m[2]), load=float(m[3]), step=int(m[4] or 0)))
    first, last = samples[0], samples[-1]
    wall = last["t"] - first["t"]
    stepped = next(s for s in samples if s["step"] > 0)  # the CPU before it is the run's start
    state = json.load(open(os.path.join(HERE, "sizing_trainer_state.json")))
    curve = [dict(step=e["step"], epoch=round(e["epoch"], 3), top1=e["eval_accuracy"])
             for e in state["log_history"] if "eval_accuracy" in e]
    record = dict(
        cpu_cost=dict(runs=runs, cpu_s_per_step_of_128=step_cpu, train_images_per_cpu_s=BATCH / step_cpu,
                      cpu_s_per_eval_image=eval_image_cpu, start_cpu_s=start_cpu, torch_threads=1),
        cell=dict(steps=STEPS, evals=EVALS, eval_images=EVAL_IMAGES, cpu_s=cell_cpu, cpu_minutes=cell_cpu / 60),
        study=study,
        sizing_run=dict(global_step=state["global_step"], monitor_wall_s=wall,
                        steps_per_hour=(last["step"] - first["step"]) / wall * 3600,
                        images_per_s=(last["step"] - first["step"]) * BATCH / wall,
                        cpu_s_used=last["cpu_s"], torch_threads=2,
                        cpu_s_per_step=(last["cpu_s"] - stepped["cpu_s"]) / (last["step"] - stepped["step"]),
                        mean_load=sum(s["load"] for s in samples) / len(samples),
                        test_dev_top1_curve=curve),
    )
    with open(os.path.join(HERE, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
