"""Files a kill cannot break: the one home of lit-rag's atomic writes.

A file is written to a staging name beside it, ``.NAME.tmp-HOST-PID`` (same filesystem, so the
rename is atomic), flushed and fsynced, renamed onto ``NAME`` and its folder fsynced: at any
moment ``NAME`` is the old file or the new one, never part of one. A writer killed mid-write
leaves its staging file; :func:`remove_stale_temps` removes those whose writer is gone.
Checkpoints (:mod:`lit_rag.checkpoints.storage`), ``lit-rag data`` and ``lit-rag evaluate``
write through here; an index folder is built in a staging folder, flushed with
:func:`fsync_tree` and swapped into place under a lock (:mod:`lit_rag.retrieval.storage`).
Plugins reach these through :mod:`lit_rag.api` (:func:`atomic_write`, :func:`remove_stale_temps`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: marks a staging file: ``.NAME.tmp-HOST-PID`` beside ``NAME``
TEMP_MARK = ".tmp-"
_TEMP_NAME = re.compile(r"^\..+\.tmp-(?P<host>.+)-(?P<pid>\d+)$")
#: a staging file of another host untouched this long belongs to a dead writer (a live one is
#: renamed milliseconds after its last write and fsync)
FOREIGN_STALE_S = 3600.0
_HOST = socket.gethostname()
#: staging files this process is writing now (a restarted container reuses PIDs)
_IN_FLIGHT: set[Path] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(temp)`` a staging file beside ``path``, then rename it onto ``path``; returns
    ``path``. ``write`` creates the file at the path it is given (open it with ``"x"`` to never
    write through a link left under that name). An exception removes the staging file and is
    raised as it is (the caller turns a full disk into its own one line).

    Example::

        atomic_write(out / "manifest.json", lambda temp: temp.write_text(text))
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(folder)
    temp = claim_temp(path)
    try:
        write(temp)
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, path)
        fsync_folder(folder)
    except BaseException:  # an exception, not a kill: leave nothing behind
        with contextlib.suppress(OSError):  # e.g. the file system went read-only
            temp.unlink(missing_ok=True)
        raise
    finally:
        release_temp(temp)
    return path


def temp_path(path: Path) -> Path:
    """This process's staging name for ``path``."""
    return path.with_name(f".{path.name}{TEMP_MARK}{_HOST}-{os.getpid()}")


def claim_temp(path: Path) -> Path:
    """This process's staging name for ``path``, registered as being written and free: a file
    under it is a leftover of this PID's earlier life (a restarted container reuses PIDs).
    :func:`release_temp` it when done."""
    temp = temp_path(path)
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(temp)
    try:
        temp.unlink(missing_ok=True)  # a read-only file system refuses even a missing name
    except OSError:
        release_temp(temp)
        raise
    return temp


def release_temp(temp: Path) -> None:
    """``temp`` is no longer being written by this process."""
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.discard(temp)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the staging files in ``folder`` whose writer is gone; returns them.

    A writer is gone when it ran on this host and its process no longer exists (or it is this
    process, which is not writing that file now: a restarted container reuses its PIDs), or
    when it ran on another host and the file has not changed for ``FOREIGN_STALE_S``.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None:
            continue
        path, pid = Path(entry.path), int(match["pid"])
        if match["host"] == _HOST:
            with _IN_FLIGHT_LOCK:
                stale = path not in _IN_FLIGHT if pid == os.getpid() else not _alive(pid)
        else:
            try:
                stale = time.time() - entry.stat(follow_symlinks=False).st_mtime > FOREIGN_STALE_S
            except OSError:
                continue
        if stale:
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass  # another process removed or renamed it first
    return removed


def fsync_folder(folder: Path) -> None:
    """Persist a rename (its folder entry); some filesystems refuse fsync on a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` to disk (before it is renamed into place)."""
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_folder(Path(folder))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
