"""Writing an index folder safely: build beside it, swap it into place when complete, under a lock.

``lit-rag index build --out DIR`` (and :func:`save_index`) go through :func:`atomic_index_dir`:

1. An exclusive, non-blocking ``fcntl.flock`` on ``.DIR.lock`` beside ``DIR``: a second build
   into ``DIR`` fails at once with one line naming the pid that holds the lock (we fail rather
   than wait: a build can take hours, and a queued one would silently redo it). The kernel drops
   the lock when its process dies, so a killed build never blocks the next. The lock file stays
   (deleting it would race with a build that has just opened it). :func:`build_missing_index`
   (a recipe's ``corpus:`` option) waits for the lock instead: DDP ranks starting together
   build a missing index once.
2. Under the lock: a previous index that an interrupted swap set aside is put back, and the
   temporary folders of killed builds are removed.
3. The build saves into a fresh ``.DIR.tmp-PID`` beside ``DIR`` (same file system, so the
   renames below are atomic); every file is fsynced.
4. The swap: one atomic exchange of the two folders (Linux ``renameat2(RENAME_EXCHANGE)``)
   where the file system supports it, else the old index is renamed aside (``.DIR.old-PID``), the
   new one renamed in, and the old one removed. A build killed at any point leaves ``DIR`` as the
   previous complete index, or the new complete one; only in the fallback's window between its
   two renames is ``DIR`` absent, with the previous index at ``.DIR.old-PID``, which the next
   build puts back (and loading such a folder says so).

The whole ``DIR`` is replaced, so ``DIR`` must be a lit-rag index, an empty folder, or absent.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from lit_rag.errors import InputError
from lit_rag.files import fsync_folder, fsync_tree
from lit_rag.retrieval.manifest import MANIFEST_NAME


class Retriever(Protocol):
    """What this module asks of a retriever (:class:`~lit_rag.retrieval.base.Retriever` has it;
    the base calls this module, so this module names no class of the base's)."""

    kind: str
    show_progress: bool

    def parts(self) -> list[Retriever]: ...
    def build(self, passages: list) -> None: ...
    def save(self, directory: str | Path) -> None: ...


log = logging.getLogger(__name__)


class IndexBusyError(InputError):
    """Another process is building an index into the same folder."""


def save_index(retriever: Retriever, out: str | Path) -> Path:
    """``retriever.save`` into ``out`` atomically (see the module docstring); returns ``out``."""
    with atomic_index_dir(out) as folder:
        retriever.save(folder)
    return Path(out)


@contextmanager
def atomic_index_dir(out: str | Path) -> Iterator[Path]:
    """Yield an empty folder to save an index into; on success it replaces ``out``.

    Args:
        out: The index folder to (re)build: absent, empty, or a lit-rag index.

    Raises:
        IndexBusyError: Another build holds the lock on ``out``.
        InputError: ``out`` is a file, or a non-empty folder that is not a lit-rag index.
    """
    out = Path(os.path.abspath(out))
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out):
        _recover(out)
        _check_out(out)  # again: _recover may have put an index back
        with _staging(out) as tmp:
            yield tmp


def build_missing_index(out: str | Path, corpus: str, retriever: Retriever) -> bool:
    """Build ``retriever`` over ``corpus`` and save it as ``out``, unless ``out`` is an index.

    What a recipe's ``corpus:`` option does on first use, so a recipe over the bundled synthetic
    world runs on a fresh machine without a separate ``lit-rag index build``. Progress bars show
    while it builds. Processes that start together (DDP ranks) wait for the one that builds,
    then find the index and do not build it again.

    Args:
        out: The index folder the recipe names.
        corpus: What :func:`~lit_rag.retrieval.corpus.read_corpus` reads: a corpus file or
            ``synthetic[:SEED]``.
        retriever: The retriever to build (its settings are the recipe's); it holds the built
            index afterwards when this returns True.

    Returns:
        True when it built the index, False when ``out`` already held one.
    """
    from lit_rag.retrieval.corpus import read_corpus

    out = Path(os.path.abspath(out))
    if (out / MANIFEST_NAME).is_file():
        return False
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out, wait=True):
        _recover(out)
        if (out / MANIFEST_NAME).is_file():  # built by the process we waited for
            return False
        _check_out(out)
        print(
            f"lit-rag: index {out} not found; building it from corpus {corpus!r} "
            f"({retriever.kind or type(retriever).__name__}), once",
            file=sys.stderr,
            flush=True,
        )
        passages = read_corpus(corpus)
        parts = retriever.parts()
        for part in parts:
            part.show_progress = True
        try:
            with _staging(out) as tmp:
                retriever.build(passages)
                retriever.save(tmp)
        finally:
            for part in parts:
                part.show_progress = False
    return True


@contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A fresh ``.NAME.tmp-PID`` beside ``out``; swapped into place when the block succeeds.

    The caller holds the build lock.
    """
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        _swap_into_place(tmp, out)
    finally:
        if tmp.exists():  # the build failed (or the exchange left the old index here)
            shutil.rmtree(tmp, ignore_errors=True)


def _check_out(out: Path) -> None:
    if not out.name:
        raise InputError(f"index folder {out}: give a folder with a name, not a root")
    if out.exists() and not out.is_dir():
        raise InputError(f"index folder {out} exists and is a file; give a new folder")
    if out.is_dir() and not (out / MANIFEST_NAME).is_file() and any(out.iterdir()):
        raise InputError(
            f"index folder {out} exists and is not a lit-rag index (no {MANIFEST_NAME}); a build "
            "replaces the whole folder, so give a new or empty folder"
        )


@contextmanager
def _build_lock(out: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``out`` exclusively; when another build has it, fail at once
    (or, with ``wait``, wait for it to finish)."""
    lock = out.parent / f".{out.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            raise IndexBusyError(
                f"index build into {out} is already running (pid {holder}); wait for it to "
                f"finish (lock file {lock})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _recover(out: Path) -> None:
    """Put back an index an interrupted swap set aside; remove what killed builds left."""
    aside = sorted(out.parent.glob(f".{out.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside and not out.exists():
        os.rename(aside[-1], out)
        log.warning("put back the previous index %s (an earlier build was interrupted)", out)
    for stale in [*out.parent.glob(f".{out.name}.tmp-*"), *out.parent.glob(f".{out.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Make ``tmp`` be ``out``; the previous ``out`` (if any) is removed afterwards."""
    if not out.exists():
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        shutil.rmtree(tmp)  # tmp now holds the previous index
    else:
        aside = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, aside)
        os.rename(tmp, out)  # a kill between the two renames: _recover puts `aside` back
        shutil.rmtree(aside)
    fsync_folder(out.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2`` with ``RENAME_EXCHANGE``).

    Returns False where that is not available (another OS, an old glibc, a file system without
    it), so the caller falls back to two renames.
    """
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))
