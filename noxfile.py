"""The version matrix: the library tests on each row of torch / transformers / accelerate / Python.

    nox -l                                   # the rows
    nox -s "matrix(row='torch-2.13')"        # one row: a fresh uv environment, the tests file by file, its record
    nox -s versions_report                   # docs/versions.md from the records in benchmarks/results/versions/

Each row is a fresh environment (``uv pip install -e ".[dev]"`` plus the row's pins) in which
``benchmarks/versions_report.py run`` runs the library tests one pytest process per file and writes the row's record,
``benchmarks/results/versions/<row>.json``. A row whose environment cannot be installed gets a record too (status
``install failed`` with uv's error), so the page shows it. Set ``MATRIX_FILE_TIMEOUT`` (seconds per test file,
default 1200) to change the per-file limit; the environments go to ``$TMPDIR/hf_condinit-nox`` (``NOX_ENVDIR``).
"""

import glob
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["versions_report"]
# the environments live outside the working tree, as .ci/run's do (NOX_ENVDIR to change)
nox.options.envdir = os.environ.get("NOX_ENVDIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "hf_condinit-nox"))

# The stack that every row pins unless it says otherwise: the lent GPU machine's transformers / accelerate, CI's torch.
BASE = {"torch": "2.13.0", "transformers": "5.17.0", "accelerate": "1.15.0"}
# row id -> Python and pins over BASE (None: unpinned, the newest uv resolves); "floors": every lower bound of
# pyproject.toml pinned (uv --resolution lowest-direct for the rest), on the lowest Python it declares; "extra": test files run once
# more under extra environment variables; "note": shown on the page.
ROWS = {
    "floors": {"python": "floors", "floors": True},
    "torch-2.5": {"python": "3.11", "pins": {"torch": "2.5.1"}},
    "torch-2.6": {"python": "3.11", "pins": {"torch": "2.6.0"}},
    "torch-2.8": {"python": "3.11", "pins": {"torch": "2.8.0"}},
    "torch-2.9": {"python": "3.11", "pins": {"torch": "2.9.1"}},
    "torch-2.10": {"python": "3.11", "pins": {"torch": "2.10.0"}},
    "torch-2.11": {"python": "3.11", "pins": {"torch": "2.11.0"},
                   "extra": {"files": ["tests/attention/test_compile.py"],
                             "env": {"HF_CONDINIT_COMPILE_BACKEND": "inductor"}}},
    "torch-2.13": {"python": "3.11", "pins": {},
                   "note": "the base row (Python 3.11, torch 2.13.0, transformers 5.17.0, accelerate 1.15.0): also "
                           "the transformers 5.17.0, accelerate 1.15.0 and Python 3.11 rows"},
    "torch-2.14": {"python": "3.11", "pins": {"torch": "2.14.1"},
                   "note": "torch 2.14.1: the newest torch pip installs on the CPU machine (its pip config caps "
                           "torch<=2.14.1, /etc/xdg/pip/constraints.txt; pip reports ResolutionImpossible for "
                           "torch==2.15.0); uv does not read pip's config"},
    "torch-2.15": {"python": "3.11", "pins": {"torch": "2.15.0"},
                   "note": "torch 2.15.0: pip cannot install it beside this stack on the CPU machine (capped at "
                           "2.14.1, see torch-2.14); uv resolves it"},
    "transformers-newest": {"python": "3.11", "pins": {"transformers": None}},
    "accelerate-newest": {"python": "3.11", "pins": {"accelerate": None}},
    "py3.10": {"python": "3.10", "pins": {}},
    "py3.13": {"python": "3.13", "pins": {}},
    "newest": {"python": "3.13", "pins": {"torch": None, "transformers": None, "accelerate": None}},
}
PYPROJECT = Path(__file__).parent / "pyproject.toml"


def lowest_python():
    """The X.Y of pyproject.toml's ``requires-python = ">=X.Y"``."""
    spec = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["requires-python"]
    return re.search(r">=\s*(\d+\.\d+)", spec).group(1)


def interpreter(version):
    """A pyenv interpreter of that X.Y when there is one (uv's discovery trips over pyenv's shims), else X.Y."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"))
    return found[-1] if found else version


def row_python(row):
    """The interpreter a row runs on (the floors row: the lowest declared Python)."""
    version = ROWS[row]["python"]
    return interpreter(lowest_python() if version == "floors" else version)


def install_args(row):
    """uv pip install's arguments for a row."""
    spec = ROWS[row]
    if spec.get("floors"):  # lowest-direct alone may pick a higher version of one to resolve (datasets 5.2 once)
        pins = subprocess.run([sys.executable, "benchmarks/versions_report.py", "floors"], check=True,
                              capture_output=True, text=True).stdout.split()
        return ["--resolution", "lowest-direct", "-e", ".[dev]", *pins]
    pins = {**BASE, **spec["pins"]}
    return ["-e", ".[dev]", *(name if version is None else f"{name}=={version}" for name, version in pins.items())]


def install(session, row):
    """``uv pip install`` into the session's fresh environment; (command line, return code, output)."""
    cmd = ["uv", "pip", "install", *install_args(row)]
    env = {**os.environ, "VIRTUAL_ENV": session.virtualenv.location}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    session.log(proc.stderr[-3000:])
    return " ".join(cmd), proc.returncode, proc.stdout + proc.stderr


def report_args(row):
    """``versions_report.py run``'s options for a row's extra runs and note."""
    spec = ROWS[row]
    extra = spec.get("extra", {})
    args = [a for f in extra.get("files", []) for a in ("--extra-file", f)]
    args += [a for k, v in extra.get("env", {}).items() for a in ("--extra-env", f"{k}={v}")]
    return args + (["--note", spec["note"]] if spec.get("note") else [])


@nox.session(reuse_venv="never")
@nox.parametrize("python,row", [(row_python(r), r) for r in ROWS], ids=[f"row='{r}'" for r in ROWS])
def matrix(session, row):
    """One row of the version matrix: fresh environment, library tests file by file, the row's record."""
    command, returncode, output = install(session, row)
    if returncode:
        error_file = Path(session.create_tmp()) / "install_error.txt"
        error_file.write_text(output, encoding="utf-8")
        session.run(sys.executable, "benchmarks/versions_report.py", "failed", "--row", row, "--command", command,
                    "--status", "install failed", "--error-file", str(error_file))
        session.error(f"{row}: the environment could not be installed (record written)")
    timeout = os.environ.get("MATRIX_FILE_TIMEOUT", "1200")
    session.run("python", "benchmarks/versions_report.py", "run", "--row", row, "--command", command,
                "--timeout", timeout, *report_args(row))


@nox.session(python=False)
def versions_report(session):
    """docs/versions.md from the records (no environment)."""
    session.run(sys.executable, "benchmarks/versions_report.py", "report")
