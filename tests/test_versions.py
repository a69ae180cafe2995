"""The declared floors: ``import hf_condinit`` under a too-old torch / transformers / accelerate stops with one line
naming what was found, what is needed and the pip command (the version faked), and the floors it checks are the
ones pyproject.toml declares."""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_condinit.versions import CHECKED, check_installed, declared_floors, too_old

REPO = Path(__file__).resolve().parents[1]


def pyproject_floors() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text()
    deps = text[text.index("dependencies = ["):text.index("]", text.index("dependencies = ["))]
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r'"([A-Za-z0-9_.\-]+)>=([\d.]+)"', deps)}


def test_installed_floors_are_pyproject_floors():
    floors = declared_floors()
    if not floors:
        pytest.skip("hf_condinit is not installed (a source tree on sys.path): no metadata to read")
    declared = pyproject_floors()
    assert floors == {name: declared[name] for name in CHECKED}, "reinstall: pip install -e ."


def test_every_floor_with_the_extras_is_pyproject_s():
    """The version matrix's pins (``packages=None, extras=True``): every ``>=`` bound of pyproject.toml, the
    dependencies first, then the extras' (a package in several extras once, first bound kept)."""
    floors = declared_floors(packages=None, extras=True)
    if not floors:
        pytest.skip("hf_condinit is not installed (a source tree on sys.path): no metadata to read")
    try:
        import tomllib
    except ImportError:  # Python 3.10: the dev extra's tomli
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = {}
    for req in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^]]*\])?[^;]*?>=([\d.]+)", req)
        if m:
            expected.setdefault(m.group(1), m.group(3))
    assert list(floors.items()) == list(expected.items()), "reinstall: pip install -e ."
    assert {"lm-eval", "pytest"} <= set(floors) and declared_floors(packages=None).keys() < floors.keys()


@pytest.mark.parametrize("found, floor, old", [
    ("2.4.1", "2.5", True), ("2.5.0", "2.5", False), ("2.5.0+cu124", "2.5", False),
    ("2.5.0a0+e000cf0ad9.nv24.10", "2.5", False), ("1.2.1", "1.3", True), ("5.16.9", "5.17", True),
    (None, "1.3", True), ("not-a-version", "1.3", False),
])
def test_too_old_compares_release_numbers(found, floor, old):
    assert too_old(found, floor) is old


def test_check_installed_one_line_for_every_package_below_its_floor():
    fake = {"torch": "2.4.1", "transformers": "5.25.0"}

    def version(name):
        if name not in fake:
            raise importlib.metadata.PackageNotFoundError(name)
        return fake[name]

    floors = {"torch": "2.5", "transformers": "5.17", "accelerate": "1.3"}
    with pytest.raises(ImportError) as err:
        check_installed(floors, version)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == ("hf_condinit needs torch>=2.5, accelerate>=1.3 (found torch 2.4.1, accelerate not installed): "
                   "pip install -U 'torch>=2.5' 'accelerate>=1.3'")
    check_installed(floors, lambda name: {"torch": "2.5.1+cpu", "transformers": "5.17.0", "accelerate": "1.3.0"}[name])


@pytest.mark.parametrize("package, fake", [("torch", "2.4.1"), ("accelerate", "1.1.0")])
def test_import_with_a_too_old_version_prints_the_one_line(package, fake):
    """A real ``import hf_condinit`` in a fresh interpreter whose ``importlib.metadata.version`` reports an old
    version: the import stops before transformers or torch are imported."""
    if not declared_floors():
        pytest.skip("hf_condinit is not installed (a source tree on sys.path): no metadata to read")
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.version\n"
        f"m.version = lambda name: {fake!r} if name == {package!r} else real(name)\n"
        "try:\n"
        "    import hf_condinit\n"
        "except ImportError as e:\n"
        "    print(e); print('torch imported:', 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=REPO)
    lines = out.stdout.splitlines()
    floor = declared_floors()[package]
    assert lines[0] == (f"hf_condinit needs {package}>={floor} (found {package} {fake}): "
                        f"pip install -U '{package}>={floor}'"), out.stdout + out.stderr
    assert lines[1] == "torch imported: False False"
