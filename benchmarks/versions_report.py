"""The version matrix: run the library tests file by file in one environment, and the report.

Two subcommands; nox (``noxfile.py``) calls both, each matrix row in a fresh uv environment of its own:

    python benchmarks/versions_report.py run --row torch-2.13 --command "..."   # inside the row's environment
    python benchmarks/versions_report.py report                                 # records -> docs/versions.md

``run`` runs the library tests (the subset of .ci/run's second pass, tests/scripts/test_fsdp.py included) with one
pytest process per test file, so that a crash (abort, segfault) in one file cannot hide the others, and writes the row's
record, ``benchmarks/results/versions/<row>.json``: row id, command, installed versions (importlib.metadata in the
row's environment), git commit, date, per-file status and counts, totals, wall time. ``report`` turns every record
there into ``docs/versions.md`` ("Supported versions") with the floors declared in pyproject.toml.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "results" / "versions"
PAGE = ROOT / "docs" / "versions.md"
PACKAGES = ["torch", "transformers", "accelerate", "datasets", "deepspeed", "tokenizers", "evaluate"]
# the .ci/run second-pass subset: every library test, without the end-to-end script runs
EXCLUDED_GLOBS = ["tests/**/test_run_*", "tests/**/test_compare_*"]
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "-m", "not slow"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
STATUSES = ["passed", "failed", "crashed", "timeout"]
COUNTS = ["passed", "failed", "errors", "skipped"]
SUMMARY_WORDS = {"passed": "passed", "failed": "failed", "error": "errors", "errors": "errors", "skipped": "skipped"}


def test_files(root=ROOT):
    """The library test files, sorted: tests/**/test_*.py less the script runs (EXCLUDED_GLOBS)."""
    excluded = {p for g in EXCLUDED_GLOBS for p in glob.glob(g + ".py", root_dir=root, recursive=True)}
    return sorted(p for p in glob.glob("tests/**/test_*.py", root_dir=root, recursive=True) if p not in excluded)


def classify(returncode, timed_out):
    """A pytest process's status: passed (exit 0, or 5: nothing selected), failed (1), timeout, else crashed.

    Negative return codes are deaths by a signal (abort, segfault); any other exit code (2 interrupted, 3 internal
    error, 4 usage error, or an interpreter that died on its own) is a crash too.
    """
    if timed_out:
        return "timeout"
    return {0: "passed", 5: "passed", 1: "failed"}.get(returncode, "crashed")


def parse_junit(path):
    """passed / failed / errors / skipped from a pytest --junitxml file, or None when it is missing or broken."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = dict.fromkeys(COUNTS, 0)
    for suite in suites:
        tests = int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        counts["passed"] += tests - sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    return counts


def parse_summary(output):
    """The counts from pytest's last summary line (``3 passed, 1 failed in 2.1s``); zeros where there is none."""
    counts = dict.fromkeys(COUNTS, 0)
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)", ln)]
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)\b", lines[-1] if lines else ""):
        counts[SUMMARY_WORDS[word]] += int(n)
    return counts


def describe_returncode(returncode):
    """``SIGABRT`` for a death by signal 6, else the exit code as text."""
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def run_file(path, timeout, env, junit):
    """One pytest process on one test file: status, counts, return code, wall seconds; the output's tail unless it
    passed."""
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={junit}", path]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - start
    counts = parse_junit(junit) if os.path.exists(junit) else None
    return {
        "file": path,
        "status": classify(proc.returncode, timed_out),
        "returncode": proc.returncode,
        "exit": "timeout" if timed_out else describe_returncode(proc.returncode),
        **(counts or parse_summary(output)),
        "seconds": round(seconds, 1),
        **({} if proc.returncode in (0, 5) else {"tail": output[-3000:]}),
    }


def installed_versions():
    """Python and the stack's packages as installed in this environment (importlib.metadata), None for a package that
    is not installed; torch's as ``torch.__version__`` says it, build tag included (``2.11.0+cu130``: its package
    metadata omits the tag of PyPI's CUDA builds)."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if versions["torch"] is not None:
        import torch

        versions["torch"] = torch.__version__
    return versions


def git_commit():
    """HEAD of the tested tree, with ``+dirty`` when the working tree has uncommitted changes to tracked files."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD")
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def totals(files):
    """Counts summed over the files and the number of files per status."""
    total = {k: sum(f.get(k, 0) for f in files) for k in COUNTS}
    total["files"] = {s: sum(f["status"] == s for f in files) for s in STATUSES}
    return total


def run_row(row, command, timeout, extra_env, extra_files, out_dir=RECORDS):
    """Run every library test file (and the extra files under extra_env), write the row's record, return it."""
    record = base_record(row, command)  # the commit before the tests: the tree may change while they run
    env = {**os.environ, **OFFLINE}
    start = time.monotonic()
    runs = [(path, env, {}) for path in test_files()]
    runs += [(path, {**env, **extra_env}, extra_env) for path in extra_files]
    files = []
    for path, file_env, shown_env in runs:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_file(path, timeout, file_env, os.path.join(tmp, "junit.xml"))
        if shown_env:
            result["env"] = shown_env
        files.append(result)
        print(f"[{row}] {path}{' ' + str(shown_env) if shown_env else ''}: {result['status']} "
              f"({result['exit']}, {result['passed']} passed, {result['failed']} failed, {result['errors']} errors, "
              f"{result['skipped']} skipped, {result['seconds']} s)", flush=True)
    record.update(status="ran", files=files, totals=totals(files), seconds=round(time.monotonic() - start, 1))
    write_record(record, out_dir)
    return record


def base_record(row, command):
    """The fields every record has: row, command, versions, commit, date."""
    return {
        "row": row,
        "command": command,
        "versions": installed_versions(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_record(record, out_dir=RECORDS):
    """``<out_dir>/<row>.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{record['row']}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def load_records(directory=RECORDS):
    """Every ``*.json`` record in the directory."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in Path(directory).glob("*.json")]


def row_key(record):
    """Natural order of row ids (torch-2.5 before torch-2.13)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", record["row"])]


def files_cell(record, status):
    """The files of a status, ``n`` or ``n: a, b`` with the file names where the status is not passed."""
    names = [Path(f["file"]).stem.removeprefix("test_") + (" (env)" if f.get("env") else "")
             for f in record.get("files", []) if f["status"] == status]
    if status == "passed" or not names:
        return str(len(names))
    return f"**{len(names)}**: " + ", ".join(names)


def short_commit(commit):
    """12 hex digits, keeping a ``+dirty`` mark (the tree had uncommitted changes when the row ran)."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def table_row(record):
    """One markdown table row of a record; a row that did not get to the tests shows its status instead."""
    v = record.get("versions", {})
    cells = [f"`{record['row']}`", v.get("python") or "–", v.get("torch") or "–", v.get("transformers") or "–",
             v.get("accelerate") or "–"]
    if record.get("status") != "ran":
        cells += [f"**{record.get('status', '?')}**", "–", "–", "–", "–"]
    else:
        t = record["totals"]
        cells += [files_cell(record, s) for s in STATUSES]
        cells.append(f"{t['passed']} / {t['failed']} / {t['errors']} / {t['skipped']}")
    seconds = record.get("seconds")
    cells += [f"{seconds / 60:.1f} min" if seconds is not None else "–", f"`{short_commit(record.get('commit', '?'))}`",
              record.get("date", "?")[:10]]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| row | Python | torch | transformers | accelerate | files passed | failed | crashed | timeout | "
          "tests passed / failed / errors / skipped | wall | commit | date |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def notes(records):
    """A line per record that did not get to the tests (install failure) or carries a note."""
    lines = []
    for r in records:
        if r.get("note"):
            lines.append(f"- `{r['row']}`: {r['note']}")
        if r.get("status") != "ran":
            lines.append(f"- `{r['row']}` ({r.get('status')}): `{r.get('command', '')}`\n\n  ```\n  "
                         + "\n  ".join((r.get("error") or "").strip().splitlines()[-8:]) + "\n  ```")
    return lines


def planned_rows(noxfile=ROOT / "noxfile.py"):
    """The row ids of noxfile.py's ``ROWS`` (read with ast: nox need not be installed)."""
    import ast

    tree = ast.parse(Path(noxfile).read_text(encoding="utf-8"))
    return list(next(ast.literal_eval(node.value) for node in tree.body
                     if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ROWS"))


def render(records, floors, planned=()):
    """The "Supported versions" page: the records' table (in row_key order), notes, the ``planned`` rows (ids)
    without a record, floors, how to rerun."""
    records = sorted(records, key=row_key)
    missing = [row for row in planned if row not in {r["row"] for r in records}]
    floor_list = ", ".join(f"{name} {version}" for name, version in floors.items())
    parts = [
        "# Supported versions",
        "",
        "Generated by `benchmarks/versions_report.py` from the records in `benchmarks/results/versions/` "
        "(do not edit by hand).",
        "",
        f"Declared floors (pyproject.toml, `>=`): {floor_list}.",
        "",
        "Each row is a fresh uv environment (`uv pip install -e \".[dev]\"` plus the row's pins; `floors`: every "
        "declared lower bound pinned, `--resolution lowest-direct` for the rest, on the lowest declared "
        "Python) in which the library tests (.ci/run's second pass: `-m \"not slow\"`, without "
        "`tests/test_run_*` and `tests/test_compare_*`) run one pytest process per file, so that a crashed file "
        "(killed by a signal, or a pytest exit code other than 0 / 1 / 5) shows as crashed and the other files "
        "still run. A file is counted in one status column; the non-passed ones are named.",
        "",
        HEADER,
        *(table_row(r) for r in records),
        "",
        *notes(records),
        *([f"- Rows of noxfile.py without a record yet: {', '.join(f'`{r}`' for r in missing)}."] if missing else []),
        "",
        "Run a row: `nox -s \"matrix(row='torch-2.13')\"` (the rows: `nox -l`); every row: `nox -s matrix`. "
        "Regenerate this page from the records: `nox -s versions_report` "
        "(or `python benchmarks/versions_report.py report`).",
        "",
    ]
    return "\n".join(parts)


def all_floors():
    """Every declared lower bound (dependencies, then extras) from hf_condinit's installed metadata
    (`hf_condinit.versions.declared_floors`, the floors' one reader); an error when hf_condinit is not installed."""
    from hf_condinit.versions import declared_floors

    floors = declared_floors(packages=None, extras=True)
    if not floors:
        raise SystemExit("hf_condinit is not installed in this environment (pip install -e .): no declared floors")
    return floors


def record_failure(row, command, status, error):
    """The record of a row that did not get to the tests (e.g. the environment could not be installed)."""
    record = {"row": row, "command": command, "versions": {}, "commit": git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "status": status, "error": error[-4000:]}
    write_record(record)
    return record


def main(argv=None):
    """``run`` (one row, in its environment), ``report`` (records -> docs/versions.md), ``floors`` (the floors
    row's pins) or ``failed`` (the record of a row whose environment could not be installed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the library tests file by file here and write the row's record")
    run.add_argument("--row", required=True)
    run.add_argument("--command", required=True, help="how the environment was made (kept in the record)")
    run.add_argument("--timeout", type=float, default=1200, help="seconds per test file")
    run.add_argument("--extra-file", action="append", default=[], help="run this file once more under --extra-env")
    run.add_argument("--extra-env", action="append", default=[], help="NAME=VALUE for the extra files")
    run.add_argument("--note", default="", help="a line kept in the record and shown on the page")
    sub.add_parser("report", help="write docs/versions.md from the records")
    sub.add_parser("floors", help="print the pins of every declared floor (name==version), one a line")
    failed = sub.add_parser("failed", help="write the record of a row that did not get to the tests")
    failed.add_argument("--row", required=True)
    failed.add_argument("--command", required=True)
    failed.add_argument("--status", required=True)
    failed.add_argument("--error-file", required=True, help="a file holding the error output")
    args = parser.parse_args(argv)
    if args.cmd == "floors":
        print("\n".join(f"{name}=={floor}" for name, floor in all_floors().items()))
        return 0
    if args.cmd == "failed":
        record_failure(args.row, args.command, args.status, Path(args.error_file).read_text(encoding="utf-8"))
        return 0
    if args.cmd == "report":
        PAGE.write_text(render(load_records(), all_floors(), planned_rows()), encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    record = run_row(args.row, args.command, args.timeout, dict(e.split("=", 1) for e in args.extra_env),
                     args.extra_file)
    if args.note:
        record["note"] = args.note
        write_record(record)
    print(f"[{args.row}] totals: {json.dumps(record['totals'])}, {record['seconds']} s")
    return 0 if all(f["status"] == "passed" for f in record["files"]) else 1


if __name__ == "__main__":
    sys.exit(main())
