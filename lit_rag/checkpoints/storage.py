"""Checkpoint files that a kill cannot break, and one-line errors for the ones that are broken.

Lightning's ``TorchCheckpointIO`` saves through an fsspec transaction: ``torch.save`` into
memory, then a staging file from ``tempfile.mkstemp()`` (in ``TMPDIR``), then ``shutil.move``
onto the destination. With ``TMPDIR`` on another filesystem (a tmpfs, as on many clusters) the
move is a copy: a kill during it leaves a truncated ``last.ckpt`` (0 bytes when the kill comes
right after the destination is opened) that no resume can read, and a kill before it leaves
the staging file in ``TMPDIR`` for good.

:class:`AtomicCheckpointIO` writes the checkpoint into a hidden file in the destination's own
folder (``.last.ckpt.tmp-HOST-PID``), flushes and fsyncs it, renames it onto the destination
(``os.replace``: atomic within one filesystem) and fsyncs the folder. At any moment the
destination is the previous complete checkpoint or the new complete one; nothing goes to
``TMPDIR``. A staging file left by a killed writer is removed by the next save into that
folder. A save that finds the disk full (``ENOSPC``, ``EDQUOT``) removes its staging file
and raises one :class:`~lit_rag.errors.DiskFullError` line: the file, the space its tensors
need, the space free, and the newest earlier checkpoint in the folder, which is intact. A
folder that refuses the write (a read-only file system, no permission) is one
:class:`~lit_rag.errors.NotWritableError` line the same way. Loading
turns a missing, empty, truncated or foreign file into one :class:`~lit_rag.errors.InputError`
line naming the file and what is wrong.

:func:`use_atomic_checkpoints` installs it on a Trainer (the ``lit-rag`` command does so).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _load as _torch_load
from lightning.fabric.utilities.types import _PATH

from lit_rag.errors import DiskFullError, InputError, NotWritableError, chain
from lit_rag.files import (
    atomic_write,
    claim_temp,
    fsync_folder,
    release_temp,
    remove_stale_temps,
)

#: ``errno`` of a write that found no room: the filesystem is full, or the user's quota is spent
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: what a full disk's error line ends with: where a run's checkpoints go, as the user sets it
#: where a run's checkpoints go, as the user sets it
WHERE_CHECKPOINTS_GO = (
    "(ModelCheckpoint's dirpath; by default the logger's save_dir, else trainer.default_root_dir)"
)
DISK_FULL_ADVICE = f"free space there or point checkpoints elsewhere {WHERE_CHECKPOINTS_GO}"
#: ``errno`` of a write the folder refused: a read-only file system, or no permission
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic on local disks and whose loads fail in one line.

    Remote paths (``s3://``, ``gs://``...) keep Lightning's save, which uploads in one
    request or transaction. Loading keeps Lightning's ``weights_only`` and ``map_location``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` through a staging file in the same folder.

        Raises:
            TypeError: ``storage_options`` was given (as Lightning's ``TorchCheckpointIO``).
        """
        local = _local_path(path)
        if local is None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"`storage_options` is not supported by {type(self).__name__}")
        atomic_save(checkpoint, local)

    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Lightning's ``torch.load`` of ``path``, with a readable error for a file that is not a
        checkpoint.

        Raises:
            InputError: ``path`` is missing, a folder, empty, truncated or not a torch checkpoint.
        """
        local = _local_path(path)
        if local is None:
            return super().load_checkpoint(path, map_location, weights_only)
        check_checkpoint_file(local)
        try:
            return _torch_load(str(local), map_location=map_location, weights_only=weights_only)
        except Exception as exc:  # EOFError, RuntimeError, OSError, UnpicklingError, KeyError...
            raise load_error(local, exc) from exc


def atomic_save(checkpoint: Any, path: Path) -> None:
    """``torch.save(checkpoint, path)`` so that ``path`` is never partly written.

    The bytes go to ``.NAME.tmp-HOST-PID`` in ``path``'s folder, are flushed and fsynced, and
    the file is renamed onto ``path``; the folder is fsynced so the rename survives a crash.
    """
    path = Path(path)
    try:
        _save_through_temp(checkpoint, path)
    except BaseException as exc:
        if is_disk_full(exc):
            raise disk_full_error(path, checkpoint) from exc
        if is_not_writable(exc):
            raise not_writable_error(path, exc) from exc
        raise


def _save_through_temp(checkpoint: Any, path: Path) -> None:
    """:func:`atomic_save`'s steps (:func:`lit_rag.files.atomic_write`)."""

    def save(temp: Path) -> None:
        with open(temp, "xb") as f:  # x: never through a link left under this name
            torch.save(checkpoint, f)

    atomic_write(path, save)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a full disk: torch's zip writer raises a ``RuntimeError``
    ("unexpected pos") while handling the ``OSError(ENOSPC)`` of its write, so the whole chain
    is searched."""
    return any(isinstance(e, OSError) and e.errno in DISK_FULL for e in chain(exc))


def is_not_writable(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a folder this process may not write: a read-only file system
    (``EROFS``) or no permission (``EACCES``, ``EPERM``)."""
    return not_writable(exc) is not None


def not_writable(exc: BaseException) -> OSError | None:
    """The ``OSError`` in ``exc``'s chain that refused a write (:data:`NOT_WRITABLE`), or None."""
    return next((e for e in chain(exc) if isinstance(e, OSError) and e.errno in NOT_WRITABLE), None)


def not_writable_error(path: Path, exc: BaseException) -> NotWritableError:
    """The one-line error for a save to ``path`` that its folder refused. Example:
    ``cannot write checkpoint runs/checkpoints/epoch=0-step=4.ckpt: runs/checkpoints is on a
    read-only file system (EROFS); the earlier checkpoint runs/checkpoints/epoch=0-step=2.ckpt
    is intact; make the folder writable or point checkpoints elsewhere (...)``."""
    refused = not_writable(exc)
    code = refused.errno if refused is not None else errno.EACCES
    why = (
        "is on a read-only file system"
        if code == errno.EROFS
        else "is not writable by this user (no permission)"
    )
    earlier = newest_checkpoint(path.parent) if path.parent.is_dir() else None
    intact = (
        f"the earlier checkpoint {earlier} is intact"
        if earlier is not None
        else f"no earlier checkpoint in {path.parent}"
    )
    return NotWritableError(
        f"cannot write checkpoint {path}: {path.parent} {why} ({errno.errorcode[code]}); "
        f"{intact}; make the folder writable or point checkpoints elsewhere {WHERE_CHECKPOINTS_GO}"
    )


def disk_full_error(path: Path, checkpoint: Any) -> DiskFullError:
    """The one-line error for a save of ``checkpoint`` to ``path`` that found the disk full.

    What it needs is the bytes of the checkpoint's tensor storages (:func:`tensor_bytes`), a
    lower bound on the file: ``torch.save`` adds the pickled structure and a zip entry per
    storage (the tiny recipe's checkpoint: 415,636 bytes of tensors, a 448,426-byte file). What
    is free is read after the staging file was removed. Example: ``disk full while writing
    checkpoint runs/checkpoints/epoch=0-step=4.ckpt: it needs at least 1,572,864 bytes (1.5 MiB)
    for its tensors, 65,536 bytes free on that filesystem; the earlier checkpoint
    runs/checkpoints/epoch=0-step=2.ckpt is intact;`` and :data:`DISK_FULL_ADVICE`.
    """
    try:
        free = _size(shutil.disk_usage(path.parent).free)
    except OSError:
        free = "an unknown amount"
    earlier = newest_checkpoint(path.parent)
    intact = (
        f"the earlier checkpoint {earlier} is intact"
        if earlier is not None
        else f"no earlier checkpoint in {path.parent}"
    )
    return DiskFullError(
        f"disk full while writing checkpoint {path}: it needs at least "
        f"{_size(tensor_bytes(checkpoint))} for its tensors, {free} free on that filesystem; "
        f"{intact}; {DISK_FULL_ADVICE}"
    )


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensor storages in ``obj`` (nested dicts, lists and tuples), each storage
    counted once: what ``torch.save`` writes for tensor data (a view saves its whole storage)."""
    total, storages, containers = 0, set(), set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            try:
                storage = item.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one
                continue
            key = (storage.data_ptr(), storage.nbytes())
            if key not in storages:
                storages.add(key)
                total += storage.nbytes()
        elif isinstance(item, (dict, list, tuple)) and id(item) not in containers:
            containers.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return total


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest ``*.ckpt`` file in ``folder`` (by modification time) that is a whole torch
    checkpoint (a zip archive with its directory at its end), or None."""
    dated = []
    for candidate in folder.glob("*.ckpt"):
        try:
            dated.append((candidate.stat().st_mtime, candidate))
        except OSError:  # a dangling link
            continue
    for _, candidate in sorted(dated, reverse=True):
        if zipfile.is_zipfile(candidate):  # False for a folder (a sharded checkpoint)
            return candidate
    return None


def _size(count: int) -> str:
    """``1,572,864 bytes (1.5 MiB)``; below a MiB, bytes alone."""
    return f"{count:,} bytes" + (f" ({count / 2**20:,.1f} MiB)" if count >= 2**20 else "")


def check_checkpoint_file(path: _PATH) -> None:
    """Fail in one line when ``path`` cannot be a checkpoint file: missing, a folder or empty.

    Raises:
        InputError: naming the path and what is wrong.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(
            f"checkpoint {path} does not exist; "
            "give the path of a .ckpt file (e.g. last.ckpt of the run)"
        )
    if path.is_dir():
        raise InputError(
            f"checkpoint {path} is a folder, not a checkpoint file (a sharded FSDP or DeepSpeed "
            "checkpoint loads only under its own strategy)"
        )
    if path.stat().st_size == 0:
        raise load_error(path, EOFError())


def load_error(path: _PATH, exc: BaseException) -> InputError:
    """The one-line error for a checkpoint file that ``torch.load`` raised ``exc`` on.

    Example: ``checkpoint runs/last.ckpt is truncated or not a torch checkpoint (1322 bytes, no
    zip directory at its end; torch.load: RuntimeError: PytorchStreamReader failed reading zip
    archive: failed finding central directory)``.
    """
    path = Path(path)
    detail = _detail(exc)
    if path.is_file() and path.stat().st_size == 0:
        return InputError(
            f"checkpoint {path} is empty (0 bytes): its save was interrupted; "
            "resume from an earlier checkpoint"
        )
    # torch.save writes a zip; its directory is at the end
    if path.is_file() and not zipfile.is_zipfile(path):
        return InputError(
            f"checkpoint {path} is truncated or not a torch checkpoint "
            f"({path.stat().st_size} bytes, "
            f"no zip directory at its end; torch.load: {detail})"
        )
    if "Unsupported global" in detail:  # a complete file holding objects, not only tensors
        return InputError(
            f"checkpoint {path} holds objects that torch.load(weights_only=True) refuses "
            f"({detail}); "
            "load it with weights_only=False only if you trust its source"
        )
    return InputError(f"checkpoint {path} cannot be read by torch.load ({detail})")


def _detail(exc: BaseException, limit: int = 160) -> str:
    """The first sentence of a load error's cause, on one line, without terminal colour codes.

    torch's weights-only errors open with a paragraph on the changed default; the cause follows
    ``WeightsUnpickler error:``.
    """
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
    _, mark, cause = text.partition("WeightsUnpickler error:")
    if mark:
        text = mark + " " + cause.split(" Check the documentation")[0].strip()
    text = text.split(". ")[0]  # the first sentence: the rest is advice on torch's own API
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def use_atomic_checkpoints(trainer) -> None:
    """Make ``trainer``'s checkpoint files atomic (what ``lit-rag fit`` does after building the
    Trainer).

    Installs :class:`AtomicCheckpointIO` as the strategy's checkpoint IO, unless the user
    configured one (a ``CheckpointIO`` plugin: kept as it is; an ``AsyncCheckpointIO`` without
    a base: ours becomes its base), and makes ``ModelCheckpoint(save_last="link")`` swap the
    ``last.ckpt`` link in atomically too (Lightning deletes it, then links: a kill in between
    leaves no ``last.ckpt``).

    DeepSpeed is left alone: it saves a folder per checkpoint through its engine, not through a
    checkpoint IO. FSDP with ``state_dict_type="full"`` (the default) saves the gathered
    checkpoint from rank 0 through the checkpoint IO, so its saves are atomic; it loads
    through its own lazy loader, so a broken file fails with torch's error there (the
    ``lit-rag`` command reads ``--ckpt_path`` first and reports it in one line). FSDP's
    ``sharded`` checkpoints are folders written by ``torch.distributed.checkpoint``, not atomic.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = trainer.strategy
    if isinstance(strategy, DeepSpeedStrategy):
        return
    current = strategy._checkpoint_io  # private: the public property creates the default on read
    if current is None:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(current, _WrappingCheckpointIO) and current.checkpoint_io is None:
        current.checkpoint_io = AtomicCheckpointIO()
    else:
        return  # the user's own checkpoint IO
    for callback in trainer.checkpoint_callbacks:
        if (
            isinstance(callback, ModelCheckpoint)
            and type(callback)._link_checkpoint is ModelCheckpoint._link_checkpoint
        ):
            # an instance attribute: called unbound, like the staticmethod
            callback._link_checkpoint = _link_atomically


def _link_atomically(trainer, filepath: str, linkpath: str) -> None:
    """``ModelCheckpoint._link_checkpoint`` (``save_last="link"``) with the new link renamed over
    the old.

    The link is made under a staging name and ``os.replace``-d onto ``linkpath``, so
    ``last.ckpt`` points at the previous checkpoint or the new one, never at nothing. Where
    symlinks are refused (Windows without the privilege) the staging file is a copy, as in
    Lightning, renamed the same way.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    # a sharded checkpoint folder: Lightning's way
    if os.path.isdir(linkpath) and not os.path.islink(linkpath):
        return ModelCheckpoint._link_checkpoint(trainer, filepath, linkpath)
    if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
        link = Path(linkpath)
        remove_stale_temps(link.parent)
        temp = claim_temp(link)
        try:
            try:
                os.symlink(os.path.relpath(filepath, link.parent), temp)
            except OSError:
                shutil.copyfile(filepath, temp)
                with open(temp, "rb") as f:
                    os.fsync(f.fileno())
            os.replace(temp, link)
            fsync_folder(link.parent)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        finally:
            release_temp(temp)
    trainer.strategy.barrier()


def _local_path(path: _PATH) -> Path | None:
    """``path`` as a local path, or None for a remote URL (``s3://...``)."""
    text = str(path)
    if "://" not in text:
        return Path(text)
    if text.startswith("file://"):
        return Path(text[len("file://") :])
    return None
