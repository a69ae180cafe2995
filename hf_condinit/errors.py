"""User errors: :class:`UsageError`, :func:`user_errors` and :func:`check_writable_folder`; every command of the
package (the example scripts, ``hf-condinit-study``, ``hf-condinit-compare``) raises them, and
:func:`hf_condinit.commands.run_main` turns them into one line and exit code 2.

A user error (bad flag, missing or bad file, impossible combination) prints one line ``<script>: error: ...`` on
stderr and exits 2, as argparse does; a real bug keeps its traceback. A misspelt name (a flag, a model type, an
attention implementation) gets the closest known one in that line (:func:`hf_condinit.names.did_you_mean`)."""

from __future__ import annotations

import contextlib
import os
import shutil


class UsageError(ValueError):
    """A user error: a bad flag value, a missing or unreadable file, an impossible combination.

    :func:`hf_condinit.commands.run_main` prints it as one line and exits 2 (argparse's convention); any other
    exception is a bug and keeps its traceback. A ``ValueError`` subclass, so ``pytest.raises(ValueError)`` and
    callers catching ``ValueError`` keep working."""


@contextlib.contextmanager
def user_errors(output_dir: str | None = None):
    """Treat the ``ValueError`` / ``OSError`` raised inside the block as user errors (:class:`UsageError`).

    Wrap the checks a script makes before any model work (flags, files, data loading). With ``output_dir``: when the
    block raises a user error and the directory did not exist on entry, it is removed, so a failed start leaves
    nothing behind (e.g. a tokenizer saved before the data turned out too short)."""
    existed = output_dir is None or os.path.exists(output_dir)
    try:
        yield
    except Exception as err:
        if not isinstance(err, (UsageError, ValueError, OSError)):
            raise
        if not existed and os.path.isdir(output_dir):
            shutil.rmtree(output_dir, ignore_errors=True)
        if isinstance(err, UsageError):
            raise
        raise UsageError(str(err)) from err


def check_writable_folder(path: str, flag: str) -> None:
    """Raise a :class:`UsageError` (one line) when the run could not write into folder ``path``: ``path`` is a file
    (or a dangling link), a file stands where one of its parent folders should be, or the folder (or, when it does
    not exist yet, its deepest existing parent, where it will be created) is not writable. Creates nothing."""
    full = os.path.abspath(path)
    if os.path.lexists(full) and not os.path.isdir(full):
        raise UsageError(f"{flag} {path} is a file, not a folder; pass a folder (it is created when missing).")
    existing = full
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{flag} {path}: {existing} is a file, so the folder cannot be created there.")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == full else f"cannot be created: {existing} is not writable"
        raise UsageError(f"{flag} {path} {where}; pass a folder you can write to.")
