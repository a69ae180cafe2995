"""Files that concurrent workers share: claims on paths and atomic JSON writes. The one home of both for the study
(:mod:`hf_condinit.study.cells`) and for the project's benchmark harness (``benchmarks/_common.py``).

A **claim** on ``path`` is an exclusive ``flock`` on the file ``path`` (created when missing), held through an open
file descriptor: the kernel drops it when every process holding that descriptor is gone (a worker killed outright,
a node that rebooted), so the claim of a dead worker is simply taken again. The lock decides, never the file's
content: a file nobody locks is free, whatever it says (a released claim's file, a file left by a dead claimant,
or a ``<record>.lock`` of the harness's earlier PID-file claims). The claimant writes its host, PID and start time
into the file, for people to read. :func:`release` removes the file while still holding it; :func:`try_claim`
checks after locking that ``path`` still names the file it locked (else it starts again on the new one), so a
removed file never lets two workers hold one path. ``flock`` works on local disks and on NFS (Linux emulates it
with a byte-range lock there).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time

__all__ = ["claimed", "is_claimed", "release", "try_claim", "write_json"]


def try_claim(path: str) -> int | None:
    """An open file descriptor holding the claim on ``path`` (its folder is created), or None when a live process
    holds it. Give it back with :func:`release` (or let the process end)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # released (and removed) by its holder between our open and our lock: lock the new file
    os.ftruncate(fd, 0)
    os.write(fd, f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n"
             .encode())
    return fd


def release(fd: int, path: str) -> None:
    """Give back the claim ``fd`` on ``path`` from :func:`try_claim`: remove the file, then close the descriptor (a
    process that was passed a copy of it, e.g. a cell's command, holds the lock until it ends too)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    os.close(fd)


@contextlib.contextmanager
def claimed(path: str):
    """``with claimed(path) as fd``: ``fd`` holds the claim on ``path`` during the block (released at its end), or is
    None when a live process holds it."""
    fd = try_claim(path)
    try:
        yield fd
    finally:
        if fd is not None:
            release(fd, path)


def is_claimed(path: str) -> bool:
    """Whether a live process holds the claim on ``path`` now; creates nothing (the probe holds the lock for an
    instant, so a worker claiming at that very moment sees it taken and tries again later)."""
    try:
        fd = os.open(path, os.O_RDWR)  # NFS grants an exclusive lock only to a descriptor open for writing
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_json(path: str, obj) -> None:
    """Write ``obj`` to ``path`` as indented JSON in one step (a temporary file beside it, then ``os.replace``):
    a reader never sees half a file, and a file that exists is complete. Numbers of other types (NumPy or torch
    scalars) are written as floats; the folder is created."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=float)
    os.replace(tmp, path)
