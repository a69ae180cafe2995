"""Locks held with ``flock``, the one home of both kinds the package takes (docs/study.md, docs/pretraining.md).

**A claim on a path** (:func:`try_claim`, :func:`claimed`, :func:`is_claimed`, :func:`release_claim`): how the
study's workers (:mod:`hf_condinit.study.cells`) and the benchmark harness share cells. An exclusive ``flock`` on
the file ``path`` (created when missing), held through an open file descriptor: the kernel drops it when every
process holding that descriptor is gone (a worker killed outright, a node that rebooted), so the claim of a dead
worker is simply taken again. The lock decides, never the file's content: a file nobody locks is free, whatever it
says. The claimant writes its host, PID and start time into the file, for people to read. :func:`release_claim`
removes the file while still holding it; :func:`try_claim` checks after locking that ``path`` still names the file
it locked (else it starts again on the new one), so a removed file never lets two workers hold one path. ``flock``
works on local disks and on NFS (Linux emulates it with a byte-range lock there).

**One run per ``--output_dir``** (:func:`lock_output_dir`, :func:`refuse_if_busy`, :func:`dead_holder`,
:func:`unlock_output_dir`): an exclusive lock file, :data:`LOCK_NAME`, taken before a script's run writes
anything. It holds the holder's host, PID, start time and command; a lock left by a dead run is taken over with one
warning naming that run. Where the filesystem refuses ``flock`` (some Lustre and FUSE mounts), the file's content
decides: a live PID on this host holds it, anything else is stale. Only rank 0 of a distributed run (``RANK`` unset
or ``0``) takes it; the other ranks trust it. A process may claim the same folder again (an in-process rerun): the
claim is re-entrant. The lock is held until the process exits. Its record is cleared when the script returns
normally (:func:`unlock_all` from :func:`hf_condinit.commands.run_main`) and kept otherwise, so that a rerun knows a
run of this plugin died or failed in the folder (:func:`dead_holder`); the file itself stays (removing a locked file
lets two runs lock two different files).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time

from .errors import UsageError

logger = logging.getLogger(__name__)

LOCK_NAME = ".hf_condinit.lock"
_held: dict[str, int] = {}  # realpath of an output_dir -> the fd holding its lock (this process)


def try_claim(path: str) -> int | None:
    """An open file descriptor holding the claim on ``path`` (its folder is created), or None when a live process
    holds it. Give it back with :func:`release_claim` (or let the process end)."""
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


def release_claim(fd: int, path: str) -> None:
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
            release_claim(fd, path)


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


def _key(output_dir: str) -> str:
    return os.path.realpath(output_dir)


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return json.loads(os.read(fd, 1 << 16).decode("utf-8") or "{}")
    except ValueError:
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "another run"
    return (f"the run of PID {holder.get('pid')} on {holder.get('host')} started {holder.get('started')} "
            f"({holder.get('command', '?')})")


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _try_lock(fd: int) -> bool | None:
    """``True``: locked; ``False``: another process holds it; ``None``: this filesystem has no ``flock``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return None


def _busy_holder(fd: int) -> dict | None:
    """The holder's record when a live run holds the lock open on ``fd``, else ``None`` (the lock is then held by
    this process when ``flock`` works)."""
    locked = _try_lock(fd)
    holder = _read(fd)
    if locked is False:
        return holder or {"pid": "?"}
    if locked is None and holder.get("host") == socket.gethostname() and _pid_alive(holder.get("pid")) \
            and holder.get("pid") != os.getpid():
        return holder
    return None


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") in ("", "0")


def refuse_if_busy(output_dir: str) -> None:
    """:class:`UsageError` when another live run holds ``output_dir``'s lock; creates nothing."""
    path = os.path.join(output_dir, LOCK_NAME)
    key = _key(output_dir)
    if not _is_rank_zero() or not os.path.exists(path) or (key in _held and _still_held(key, path)):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        holder = _busy_holder(fd)
    finally:
        os.close(fd)  # closing drops a probe's flock
    if holder is not None:
        raise UsageError(f"--output_dir {output_dir} is in use by {_describe(holder)}; wait for it to end, or pass "
                         f"another --output_dir (if that run is gone, delete {path}).")


def dead_holder(output_dir: str) -> dict | None:
    """The record of a run that held ``output_dir``'s lock and did not end normally (killed, failed, preempted: a
    normal end clears the record), or ``None``. Call it after :func:`refuse_if_busy`."""
    path = os.path.join(output_dir, LOCK_NAME)
    if _key(output_dir) in _held or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        try:
            return json.loads(f.read().decode("utf-8") or "null")
        except ValueError:
            return None


def _still_held(key: str, path: str) -> bool:
    """Whether this process's lock for ``key`` is on the file now at ``path`` (a failed start may have removed it)."""
    try:
        return os.path.samestat(os.fstat(_held[key]), os.stat(path))
    except OSError:
        return False


def lock_output_dir(output_dir: str) -> None:
    """Take ``output_dir``'s lock for this run (rank 0 only), creating the folder if needed; a live holder is a
    :class:`UsageError` naming it, a dead one is taken over with one warning. Call it first thing inside the script's
    ``with user_errors(output_dir):`` block (the start of the run's writing), so a failed start removes a folder that
    the claim created."""
    key = _key(output_dir)
    path = os.path.join(output_dir, LOCK_NAME)
    if not _is_rank_zero() or (key in _held and _still_held(key, path)):
        return
    unlock_output_dir(output_dir)  # a lock on a file that a failed start removed
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    holder = _busy_holder(fd)
    if holder is not None:
        os.close(fd)
        raise UsageError(f"--output_dir {output_dir} is in use by {_describe(holder)}; wait for it to end, or pass "
                         f"another --output_dir.")
    stale = _read(fd)
    if stale.get("pid") not in (None, os.getpid()):
        logger.warning(f"{output_dir}: taking over the lock of {_describe(stale)}, which is no longer running")
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:500]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
    os.fsync(fd)
    _held[key] = fd


def unlock_output_dir(output_dir: str, clear: bool = False) -> None:
    """Drop this process's lock on ``output_dir`` (a no-op when it holds none); ``clear``: erase its record too (the
    run ended normally)."""
    fd = _held.pop(_key(output_dir), None)
    if fd is None:
        return
    if clear:
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
    os.close(fd)


def unlock_all(clear: bool = False) -> None:
    """:func:`unlock_output_dir` every lock this process holds (at exit: the records are kept unless ``clear``)."""
    for key in list(_held):
        unlock_output_dir(key, clear)


atexit.register(unlock_all)
