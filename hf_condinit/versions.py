"""The declared floors of the stack, checked when ``import hf_condinit`` runs, before torch or transformers load.

The floors are read from this package's own installed metadata (``Requires-Dist``, i.e. pyproject.toml's
dependencies as installed), so there is one home for them. Only the packages whose too-old versions fail deep inside
another library are checked here (`CHECKED`): transformers 5.17 with torch < 2.5 dies at import with
``NameError: name 'nn' is not defined``; transformers' Trainer with accelerate < 1.3 fails after the model is built.
docs/versions.md lists what each floor was tested on.

A version is compared by its release numbers only: a local or pre-release build of a release at the floor passes
(``2.5.0+cu124``, NVIDIA's ``2.5.0a0+e000cf0.nv24.10``), since clusters run such builds of a release.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

__all__ = ["__version__", "CHECKED", "RESUME_MIN_TORCH", "declared_floors", "too_old", "check_installed", "torch_below"]

__version__ = "0.1.0"  # this package's own version (pyproject.toml says the same)

CHECKED = ("torch", "transformers", "accelerate")

# Capabilities newer than the floors: a feature that needs one is refused in one line below it.
RESUME_MIN_TORCH = "2.6"  # Trainer resume: transformers refuses torch.load of optimizer / RNG state below it
# (check_torch_load_is_safe: torch.load(weights_only=True) can run code before 2.6.0, CVE-2025-32434)


def declared_floors(distribution: str = "hf_condinit", packages=CHECKED, extras: bool = False) -> dict[str, str]:
    """``{package: lowest version}`` from ``distribution``'s declared requirements (its installed metadata, i.e.
    pyproject.toml's dependencies, then its extras' with ``extras=True``), in their order, for the ``packages``
    named (every package with a ``>=`` bound when ``None``); empty when the distribution is not installed (a source
    tree on ``sys.path``). The one reader of the floors: the import check and the version matrix (noxfile.py,
    ``benchmarks/versions_report.py``) both use it."""
    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    floors = {}
    for line in requires:
        req = Requirement(line)
        if not extras and req.marker is not None and "extra" in str(req.marker):
            continue
        lows = [s.version for s in req.specifier if s.operator == ">="]
        if lows and (packages is None or req.name.lower() in packages):
            floors.setdefault(req.name, max(lows, key=Version))
    return floors


def too_old(found: str | None, floor: str) -> bool:
    """Whether an installed version (None: not installed) is below ``floor``, by release numbers only."""
    if found is None:
        return True
    try:
        return Version(found).release < Version(floor).release
    except InvalidVersion:  # an unparsable version string: nothing to compare, let the import go on
        return False


def check_installed(floors: dict[str, str] | None = None, version=importlib.metadata.version) -> None:
    """Raise ImportError with one line naming every checked package below its floor: what was found, what is needed
    and the pip command. ``version(name)`` returns an installed version (`importlib.metadata.version`)."""
    floors = declared_floors() if floors is None else floors
    found, bad = {}, []
    for name, floor in floors.items():
        try:
            found[name] = version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
        if too_old(found[name], floor):
            bad.append(name)
    if bad:
        have = ", ".join(f"{n} {found[n] or 'not installed'}" for n in bad)
        need = " ".join(f"'{n}>={floors[n]}'" for n in bad)
        raise ImportError(f"hf_condinit needs {', '.join(f'{n}>={floors[n]}' for n in bad)} (found {have}): "
                          f"pip install -U {need}")


def torch_below(floor: str) -> bool:
    """Whether the running torch is older than ``floor`` (release numbers only, as `too_old`)."""
    import torch

    return too_old(torch.__version__, floor)
