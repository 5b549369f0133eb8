"""How ``lit-rag data`` writes: each file to a temporary name, then renamed (a cut run leaves the
old file or none), its SHA-256 recorded; temporary files of killed runs removed."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from lit_rag.errors import DiskFullError


def sha256(path: Path, count_lines: bool = False) -> tuple[str, int]:
    """The file's SHA-256, and its line count with ``count_lines`` (else 0); read in 1 MiB
    blocks, so a corpus of gigabytes is never in memory at once."""
    digest, lines = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            if count_lines:
                lines += chunk.count(b"\n")
    return digest.hexdigest(), lines


def remove_stale_temps(out: Path) -> None:
    """Remove the temporary files of runs killed mid-write (their process is gone)."""
    for stale in out.glob(".*.tmp-*"):
        pid = stale.name.rpartition("-")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except OSError:  # alive under another user: not ours to remove
            pass


def atomic(path: Path, write: Callable[[Path], object]) -> str:
    """``write(temp)`` a temporary file beside ``path``, then rename it onto ``path`` (a cut run
    leaves the old file or none, never half of one); the SHA-256 of what was written.

    Raises:
        DiskFullError: The filesystem is full (the temporary file is removed).
    """
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(temp)
        with temp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"data: disk full while writing {path}; free space or pass --out"
            ) from exc
        raise
    return sha256(path)[0]
