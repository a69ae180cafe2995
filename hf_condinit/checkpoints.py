"""Checkpoints that survive the cluster: written atomically, checked before a resume, rotated only once complete.

A ``checkpoint-<step>`` folder in ``--output_dir`` is only ever *complete*:

- :class:`~.trainer.CondInitTrainer` lets the Trainer (plain, DeepSpeed ZeRO 1-3, FSDP2) write the checkpoint into
  ``<output_dir>/.checkpoint-staging/checkpoint-<step>``; once every rank has written its files, the saving process
  fsyncs them, writes :data:`MANIFEST_NAME` (every file's size and content digest, :data:`DIGEST`) last, and renames
  the folder to
  ``<output_dir>/checkpoint-<step>`` (:func:`publish`). A kill at any moment leaves either the previous checkpoints
  alone or the new one complete; a rerun clears the staging folder (never a checkpoint) before its next save.
- :func:`check_checkpoint` says what is wrong with a checkpoint (a file shorter than the manifest says, a truncated
  ``trainer_state.json`` / safetensors / zip archive, no weights; with ``verify_content``, a file whose content no
  longer matches the manifest's digest), or ``None``; :func:`newest_complete_checkpoint` is the resume's choice
  (content verified), skipping a damaged one with one warning naming the folder and the reason (never deleting it).
- :func:`rotate` applies ``--save_total_limit`` over the complete checkpoints only, after the new one is published.
- :func:`disk_full_error`: a save that failed for lack of space says so (errno, free space, the intact checkpoint).
- :func:`write_atomically`: a file written whole or not at all (temporary file, fsync, rename), for the manifest and
  the run's final result files.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import re
import shutil
import struct
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import xxhash

logger = logging.getLogger(__name__)

MANIFEST_NAME = "checkpoint_manifest.json"
STAGING_DIR = ".checkpoint-staging"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# what every checkpoint the Trainer writes holds, in one of these forms (plain / sharded / DeepSpeed / FSDP)
WEIGHT_PATTERNS = (r"model\.safetensors", r"model\.safetensors\.index\.json", r"pytorch_model\.bin",
                   r"pytorch_model_fsdp.*", r"global_step\d+", r"adapter_model\.safetensors")
ZIP_SUFFIXES = (".pt", ".pth", ".bin")
# the manifest's key for each file's content digest: XXH3-128 (about 10 GiB/s from the page cache on one core)
DIGEST = "xxh3_128"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (e.g. the disk is full); the previous one is intact.
    :func:`~.commands.run_main` prints it as one line and exits 1."""


def checkpoint_step(path: str) -> int | None:
    """The step of a ``checkpoint-<step>`` folder name, else ``None``."""
    match = CHECKPOINT_RE.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def checkpoints_newest_first(output_dir: str) -> list[str]:
    """Every ``checkpoint-<step>`` folder of ``output_dir``, highest step first (complete or not)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(checkpoint_step(name), os.path.join(output_dir, name)) for name in os.listdir(output_dir)]
    found = [(step, path) for step, path in found if step is not None and os.path.isdir(path)]
    return [path for _, path in sorted(found, reverse=True)]


def _files(folder: str) -> dict[str, int]:
    """``{relative path: size}`` of every file under ``folder``."""
    sizes = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    return sizes


def _safetensors_problem(path: str, size: int) -> str | None:
    """What is wrong with a ``.safetensors`` file's header and length, or ``None``."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "has no safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return "is truncated (its header runs past the end of the file)"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "has an unreadable safetensors header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"is truncated ({size} bytes; its header needs {8 + n + end})"
    return None


def file_digest(path: str) -> str:
    """The :data:`DIGEST` of the file at ``path``, as hex (read through a memory map: no copy of the page cache)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return xxhash.xxh3_128(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            return xxhash.xxh3_128(mapped).hexdigest()


def _file_problem(path: str, size: int) -> str | None:
    """What is wrong with one file of a checkpoint (by its kind), or ``None``."""
    name = os.path.basename(path)
    if name.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except ValueError:
            return "is not valid JSON (truncated?)"
    elif name.endswith(".safetensors"):
        return _safetensors_problem(path, size)
    elif name.endswith(ZIP_SUFFIXES) and size > 0:
        try:
            with zipfile.ZipFile(path):
                pass
        except zipfile.BadZipFile:
            return "is not a complete torch archive (truncated?)"
    return None


def check_checkpoint(path: str, verify_content: bool = False) -> str | None:
    """Why the checkpoint folder ``path`` cannot be resumed from, or ``None`` when it is complete and readable.

    With :data:`MANIFEST_NAME` (every checkpoint this plugin wrote): each listed file exists with its size, and with
    ``verify_content`` its content has the manifest's digest (a manifest of an older version has none: sizes only).
    Without a manifest (a checkpoint of an older version or of the stock Trainer): ``trainer_state.json`` and the
    weights exist. Either way every ``.json`` parses, every ``.safetensors`` header and length agree, and every
    ``.pt``/``.pth``/``.bin`` torch archive has its end record (a truncated zip has none). Without ``verify_content``
    it reads headers only (cheap for a 1.7B checkpoint, checked at every save); ``verify_content`` reads every file
    once (what a resume reads anyway)."""
    if not os.path.isdir(path):
        return "is not a directory"
    present = _files(path)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if os.path.exists(manifest_path):
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
            expected, digests = manifest["files"], manifest.get(DIGEST, {})
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{MANIFEST_NAME} is unreadable"
        for rel, size in expected.items():
            if rel not in present:
                return f"{rel} is missing"
            if present[rel] != size:
                return f"{rel} is truncated ({present[rel]} of {size} bytes)"
        if verify_content:
            for rel, digest in digests.items():
                if rel in present and file_digest(os.path.join(path, rel)) != digest:
                    return f"{rel} does not match its {DIGEST} digest in {MANIFEST_NAME} (changed after the save)"
    else:
        if "trainer_state.json" not in present:
            return "has no trainer_state.json (its save did not finish)"
        tops = {rel.split(os.sep)[0] for rel in present}
        if not any(re.fullmatch(p, top) for p in WEIGHT_PATTERNS for top in tops):
            return "has no model weights (its save did not finish)"
    for rel, size in present.items():
        problem = _file_problem(os.path.join(path, rel), size)
        if problem:
            return f"{rel} {problem}"
    return None


def newest_complete_checkpoint(output_dir: str, log: logging.Logger | None = None, verify_content: bool = True,
                               below: int | None = None) -> str | None:
    """The highest-step checkpoint of ``output_dir`` (below step ``below`` when given) that :func:`check_checkpoint`
    passes (its content verified unless ``verify_content`` is false), or ``None``. Each newer one that fails is
    skipped with one warning naming the folder and the reason; nothing is deleted."""
    for path in checkpoints_newest_first(output_dir):
        if below is not None and checkpoint_step(path) >= below:
            continue
        problem = check_checkpoint(path, verify_content)
        if problem is None:
            return path
        (log or logger).warning(f"skipping {path}: {problem}; resuming from an earlier checkpoint (the folder is kept)")
    return None


def checkpoint_size(path: str) -> int:
    """Bytes in the checkpoint folder ``path`` (its manifest's total when it has one)."""
    try:
        with open(os.path.join(path, MANIFEST_NAME), encoding="utf-8") as f:
            return sum(json.load(f)["files"].values()) + os.path.getsize(os.path.join(path, MANIFEST_NAME))
    except (OSError, ValueError, KeyError):
        return sum(_files(path).values())


def fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all: a temporary file beside it, fsynced, renamed over
    ``path``, and the folder fsynced. A kill at any moment leaves the old file (or none) or the new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)


def write_manifest(folder: str, step: int) -> None:
    """fsync every file of ``folder`` and take its :data:`DIGEST`, then write :data:`MANIFEST_NAME` (``{"step",
    "saved_at", "files": {path: bytes}, DIGEST: {path: hex}}``) through :func:`write_atomically`: the manifest exists
    only once everything it lists is on disk."""
    files = _files(folder)
    files.pop(MANIFEST_NAME, None)
    paths = [os.path.join(folder, rel) for rel in files]
    with ThreadPoolExecutor(1) as pool:  # the digests read the page cache while the disk takes the fsyncs
        synced = pool.map(fsync_path, paths)
        digests = {rel: file_digest(path) for rel, path in zip(files, paths)}
        list(synced)  # every file on disk (an fsync's error raised here)
    manifest = {"step": step, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files, DIGEST: digests}
    write_atomically(os.path.join(folder, MANIFEST_NAME), json.dumps(manifest, indent=1))
    for root, dirs, _ in os.walk(folder):
        for d in dirs:
            fsync_path(os.path.join(root, d), directory=True)
    fsync_path(folder, directory=True)


def publish(staged: str, final: str, log: logging.Logger | None = None) -> None:
    """Rename the complete checkpoint ``staged`` to ``final`` (same filesystem: atomic). A folder already at
    ``final`` (an incomplete one of an earlier, killed run) is first renamed to ``damaged-checkpoint-<step>-<time>``,
    with one warning (as is one whose content no longer matches its digests); a complete one there is an error (a
    checkpoint is never overwritten)."""
    if os.path.exists(final):
        problem = check_checkpoint(final, verify_content=True)
        if problem is None:
            raise CheckpointSaveError(f"{final} already holds a complete checkpoint; it is not overwritten")
        aside = os.path.join(os.path.dirname(final), f"damaged-{os.path.basename(final)}-{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(final, aside)
        (log or logger).warning(f"{final} {problem}: moved to {aside} to save the new one in its place")
    os.rename(staged, final)
    fsync_path(os.path.dirname(final), directory=True)


def rotate(output_dir: str, save_total_limit: int | None, keep: str | None = None) -> list[str]:
    """``--save_total_limit``: delete the oldest *complete* checkpoints beyond the limit, never the newest nor
    ``keep`` (the best model's), never an incomplete or damaged one. Returns the deleted folders."""
    if not save_total_limit or save_total_limit <= 0:
        return []
    complete = [p for p in checkpoints_newest_first(output_dir) if check_checkpoint(p) is None]
    protected = {complete[0]} if complete else set()
    if keep:
        protected.add(os.path.join(output_dir, os.path.basename(os.path.normpath(keep))))
    deleted = []
    for path in reversed(complete):
        if len(complete) - len(deleted) <= max(save_total_limit, len(protected)):
            break
        if path not in protected:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


def is_disk_full(err: BaseException, output_dir: str, needed: int | None = None) -> bool:
    """Whether a failed save ran out of space: ``ENOSPC`` / ``EDQUOT`` anywhere in the exception chain (torch's
    writer reports it only as "unexpected pos"), or less free space left than ``needed`` bytes (1 MiB when unknown)."""
    seen = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        free = shutil.disk_usage(output_dir).free
    except OSError:
        return False
    return free < (needed or 1 << 20)


def disk_full_error(output_dir: str, step: int, needed: int | None, previous: str | None) -> CheckpointSaveError:
    """The one-line error for a checkpoint that does not fit: the folder, the errno, the free space, what it needs
    and the checkpoint that is intact."""
    free = shutil.disk_usage(output_dir).free
    need = f", the checkpoint needs about {needed / 2**20:.1f} MiB" if needed else ""
    kept = (f"{previous} is intact; free space and rerun the same command to resume from it" if previous
            else "no earlier checkpoint exists; free space and rerun the same command")
    return CheckpointSaveError(
        f"saving checkpoint-{step} in {output_dir} failed: [Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)} "
        f"({free / 2**20:.1f} MiB free{need}); {kept}"
    )
