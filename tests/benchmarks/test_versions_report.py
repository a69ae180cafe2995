"""benchmarks/versions_report.py: records -> "Supported versions" table rows, crashes shown as crashes;
noxfile.py's rows. Fast: synthetic records, no environment is made."""

import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import versions_report as vr  # noqa: E402


def file_result(name, status, passed=0, failed=0, errors=0, skipped=0, **extra):
    """One per-file result as ``run_file`` writes it."""
    return {"file": f"tests/test_{name}.py", "status": status, "passed": passed, "failed": failed, "errors": errors,
            "skipped": skipped, "seconds": 1.0, **extra}


def record(row, torch, files, seconds):
    """A synthetic record of a row that ran."""
    return {"row": row, "command": "uv pip install -e .[dev]", "status": "ran", "commit": "0123456789abcdef0",
            "date": "2026-01-02T03:04:05+00:00", "seconds": seconds, "files": files, "totals": vr.totals(files),
            "versions": {"python": "3.11.7", "torch": torch, "transformers": "5.17.0", "accelerate": "1.15.0"}}


def cells(line):
    """The cells of a markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_two_records_become_their_table_rows_and_a_crash_is_not_hidden():
    clean = record("torch-2.13", "2.13.0+cpu", [file_result("a", "passed", 5, skipped=1),
                                                 file_result("b", "passed", 3)], 120)
    crashed = record("torch-2.5", "2.5.1", [file_result("a", "passed", 5), file_result("fsdp", "crashed", 2),
                                            file_result("b", "failed", 2, failed=1),
                                            file_result("compile", "passed", 1, env={"X": "1"})], 600)
    page = vr.render([clean, crashed], {"torch": "2.5", "transformers": "5.17"})
    rows = {cells(ln)[0]: cells(ln) for ln in page.splitlines() if ln.startswith("| `")}
    assert list(rows) == ["`torch-2.5`", "`torch-2.13`"]
    assert rows["`torch-2.13`"] == ["`torch-2.13`", "3.11.7", "2.13.0+cpu", "5.17.0", "1.15.0", "2", "0", "0", "0",
                                    "8 / 0 / 0 / 1", "2.0 min", "`0123456789ab`", "2026-01-02"]
    r = rows["`torch-2.5`"]
    assert r[5:10] == ["2", "**1**: b", "**1**: fsdp", "0", "10 / 1 / 0 / 0"]
    assert r[10] == "10.0 min"
    assert "Declared floors (pyproject.toml, `>=`): torch 2.5, transformers 5.17." in page


def test_install_failure_and_return_codes():
    failed = {"row": "torch-2.15", "command": "uv pip install torch==2.15.0", "status": "install failed",
              "error": "x\nNo solution found", "versions": {}, "commit": "abc", "date": "2026-01-02"}
    page = vr.render([failed], {})
    assert "| `torch-2.15` | – | – | – | – | **install failed** |" in page
    assert "No solution found" in page
    assert [vr.classify(rc, False) for rc in (0, 5, 1, -6, -11, 2, 3, 4, 134)] == \
        ["passed", "passed", "failed"] + ["crashed"] * 6
    assert vr.classify(None, True) == "timeout"
    assert vr.describe_returncode(-6) == "SIGABRT"
    assert vr.parse_summary("x\n1 failed, 4 passed, 2 skipped, 1 error in 3.2s\n") == \
        {"passed": 4, "failed": 1, "errors": 1, "skipped": 2}


def test_noxfile_rows_include_the_floors_and_the_python_versions():
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    rows = next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ROWS")
    assert rows["floors"].get("floors") is True
    pythons = {spec["python"] for spec in rows.values()}
    assert {"3.10", "3.11", "3.13"} <= pythons
    assert {"torch-2.5", "torch-2.13", "py3.10", "py3.13", "newest"} <= set(rows)


def test_library_test_files_leave_out_only_the_script_runs():
    files = vr.test_files()
    assert "tests/scripts/test_fsdp.py" in files and "tests/attention/test_compile.py" in files
    assert not any(os.path.basename(f).startswith(("test_run_", "test_compare_")) for f in files)


def test_rows_without_a_record_are_listed():
    assert vr.planned_rows()[0] == "floors" and "py3.13" in vr.planned_rows()
    page = vr.render([], {"torch": "2.5"}, ["floors", "py3.13"])
    assert "- Rows of noxfile.py without a record yet: `floors`, `py3.13`." in page
