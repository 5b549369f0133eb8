"""How ``lit-rag data`` writes: each file through :func:`lit_rag.files.atomic_write` (a cut run
leaves the old file or none), its SHA-256 recorded, a full disk said in one line."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from lit_rag.errors import DiskFullError
from lit_rag.files import atomic_write, sha256_file


def atomic(path: Path, write: Callable[[Path], object]) -> str:
    """``write(temp)`` a staging file beside ``path``, then rename it onto ``path``; the SHA-256
    of what was written.

    Raises:
        DiskFullError: The filesystem is full (the staging file is removed).
    """
    try:
        atomic_write(path, write)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"data: disk full while writing {path}; free space or pass --out"
            ) from exc
        raise
    return sha256_file(path)
