"""Recording and orchestration of the GPU check: rows appended as they are measured, one forked process per part.

Everything goes to four files in the output folder (the device tool that runs it brings back at most 8):
``status.json`` (settings, per-part state), ``rows.jsonl`` (one JSON row per line, each with its ``part``),
``gpu_check.json`` and ``gpu_check.md`` (rewritten from the two after every row, so a killed run keeps what it
measured). Each is written through a ``.tmp`` file and renamed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback

from . import PARTS, TITLES

ROWS = "rows.jsonl"
STATUS = "status.json"


class Recorder:
    """``record(**row)``: appends the row (with ``part``) to ``OUT/rows.jsonl``, then rewrites the report.

    The row is on disk before the report is rendered: a rendering error is printed to stderr and the part goes on
    measuring (``gpu_check.json`` / ``.md`` catch up at the next row or at the end of the part).
    """

    def __init__(self, out: str, part: str):
        self.out, self.part = out, part

    def __call__(self, **row) -> dict:
        row = {"part": self.part, **row}
        with open(os.path.join(self.out, ROWS), "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        try:
            write_report(self.out)
        except Exception as e:  # noqa: BLE001 - the measurement matters more than its rendering
            print(f"gpu_check: report not rewritten after a row of part {self.part}: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
        return row


def read_rows(out: str) -> list[dict]:
    """Every complete row of ``OUT/rows.jsonl`` (a line cut by a kill mid-write is skipped)."""
    path = os.path.join(out, ROWS)
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def read_status(out: str) -> dict:
    path = os.path.join(out, STATUS)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _write_atomic(out: str, name: str, text: str) -> None:
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, name))


def write_settings(out: str, settings: dict) -> None:
    _write_atomic(out, STATUS, json.dumps({"settings": settings}, indent=1))


def set_part_status(out: str, part: str, **fields) -> None:
    status = read_status(out)
    status.setdefault("parts", {}).setdefault(part, {}).update(fields)
    _write_atomic(out, STATUS, json.dumps(status, indent=1))


def collect(out: str) -> dict:
    """Everything measured so far: settings, and per part its state and rows."""
    status = read_status(out)
    rows = read_rows(out)
    result = {"settings": status.get("settings", {}), "parts": {}}
    for part in status.get("settings", {}).get("parts", PARTS):
        result["parts"][part] = {
            "title": TITLES[part],
            **status.get("parts", {}).get(part, {"state": "pending"}),
            "rows": [r for r in rows if r.get("part") == part],
        }
    return result


def write_report(out: str) -> dict:
    from .report import markdown

    result = collect(out)
    _write_atomic(out, "gpu_check.json", json.dumps(result, indent=1, default=str))
    _write_atomic(out, "gpu_check.md", markdown(result))
    return result


def _flush_and_exit(code: int) -> None:
    """``os._exit`` skips interpreter shutdown: flush what the Trainer and the logging handlers buffered first."""
    try:
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not keep the child alive
                pass
        os._exit(code)


def _child(fn, ctx: dict, out: str, part: str) -> None:
    record = Recorder(out, part)
    try:
        fn(ctx, record)
    except BaseException as e:  # noqa: BLE001 - the error is the result
        traceback.print_exc()
        record(kind="part_error", error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:])
        _flush_and_exit(1)
    _flush_and_exit(0)


def unused_seconds(out: str, caps: dict[str, float]) -> float:
    """Seconds of their caps that the parts already run (``status.json``) left unused, never below 0."""
    done = read_status(out).get("parts", {})
    return max(0.0, sum(caps[p] - v["seconds"] for p, v in done.items() if "seconds" in v and p in caps))


def orchestrate(out: str, parts: list[tuple[str, object]], caps: dict[str, float], ctx: dict) -> dict:
    """Run each ``(name, fn)`` as ``fn(ctx, record)`` in a forked process, killed after ``caps[name]`` seconds plus
    what the parts before it left unused (`unused_seconds`; recorded as its ``cap_s``, which part d plans with), so
    no time is lost to a part that finished early and the run never exceeds the sum of the caps.

    The parent never touches the accelerator (a CUDA context does not survive ``fork``); each child initialises its
    own. Returns the collected result.
    """
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    for name, fn in parts:
        cap = caps[name] + unused_seconds(out, caps)
        set_part_status(out, name, state="running", cap_s=cap)
        _report_quietly(out)
        t0 = time.perf_counter()
        sys.stdout.flush()
        sys.stderr.flush()  # a fork duplicates unflushed buffers
        proc = fork.Process(target=_child, args=(fn, ctx, out, name), daemon=True)
        proc.start()
        proc.join(cap)
        if proc.is_alive():
            proc.kill()
            proc.join()
            state = "timeout"
        else:
            state = "done" if proc.exitcode == 0 else f"error (exit {proc.exitcode})"
        seconds = time.perf_counter() - t0
        set_part_status(out, name, state=state, seconds=round(seconds, 1))
        _report_quietly(out)
        print(f"gpu_check: part {name} {state} in {seconds:.1f}s (cap {cap:.0f}s)", file=sys.stderr, flush=True)
    return collect(out)


def _report_quietly(out: str) -> None:
    try:
        write_report(out)
    except Exception as e:  # noqa: BLE001 - the next part still runs; rows.jsonl has everything
        print(f"gpu_check: report not rewritten: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
