"""A fit killed (SIGKILL) while it writes a checkpoint leaves a resumable ``last.ckpt``.

Each case runs a real tiny fit (``test_resume.build``: GRPO, mu 2, so global steps 2 and 4 end
batches 1 and 2) in a subprocess with ``TMPDIR`` on a tmpfs (``/dev/shm``) and the checkpoints
on disk (``tmp_path``): the issue's setting, where Lightning's default save stages the file in
``TMPDIR`` and *copies* it across filesystems. The subprocess kills itself at a fixed point of
one checkpoint save, so the moment is exact:

- ``bytes:N``: after N bytes of the checkpoint have reached a file in the checkpoint folder
  (the probe wraps ``open`` for that folder; Python's copy fallback is forced so that Lightning's
  cross-filesystem copy writes through it too);
- ``rename``: the staging file is complete, the process dies before it is renamed (moved) onto
  the destination;
- ``link``: ``save_last="link"``, the process dies where ``last.ckpt``'s symlink is made.

Then ``last.ckpt`` must be absent (the kill hit the first save) or the previous complete
checkpoint (step 2, loadable with ``torch.load(weights_only=True)``), ``TMPDIR`` must hold no
staging file, and a resume from ``last.ckpt`` (or a fresh fit, when there is none) must complete
and clean the dead writer's staging file out of the checkpoint folder. ~10 s a case.

    python tests/checkpoints/test_checkpoint_kill.py CKPT_DIR KILL_POINT SAVE_INDEX SAVE_LAST
"""

from __future__ import annotations

import builtins
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]  # its own folder and tests/ (the kit)

from kit import Recorder
from test_resume import build

# (kill point, which trainer.save_checkpoint call it hits, save_last)
PROBES = {
    "second_save_0_bytes": ("bytes:0", 2, "true"),  # the destination opened, nothing written
    "second_save_1KiB": ("bytes:1024", 2, "true"),
    "second_save_200KiB": ("bytes:204800", 2, "true"),  # about half of this ~440 KiB checkpoint
    "second_save_before_rename": ("rename", 2, "true"),
    "first_save_200KiB": ("bytes:204800", 1, "true"),  # no previous checkpoint: last.ckpt absent
    "link_save_last": ("link", 2, "link"),
}


def fit(ckpt_dir: Path, max_steps: int, save_last: str, ckpt_path: str | None = None) -> Recorder:
    """The tiny fit of ``test_resume``, checkpointing every 2 steps, with lit-rag's checkpoint
    IO."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_rag.checkpoints.storage import use_atomic_checkpoints

    seed_everything(7)
    module, data = build(lora=False)
    recorder = Recorder()
    link = save_last == "link"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        every_n_train_steps=2,
        save_top_k=-1 if link else 0,
        save_last="link" if link else True,
    )
    trainer = Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=ckpt_dir.parent,
        callbacks=[recorder, checkpoint],
    )
    use_atomic_checkpoints(trainer)  # what the lit-rag command does after building the Trainer
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    recorder.last_path = checkpoint.last_model_path
    return recorder


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillingWriter:
    """A file opened for writing that SIGKILLs the process once ``limit`` bytes have gone in."""

    def __init__(self, file, limit: int) -> None:
        self._file, self._limit, self._written = file, limit, 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self._written + len(view) >= self._limit:
            self._file.write(view[: self._limit - self._written])
            self._file.flush()  # the bytes reach the kernel, as a real write would before a kill
            _die()
        self._written += len(view)
        return self._file.write(view)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def __getattr__(self, name):
        return getattr(self._file, name)


def _arm(ckpt_dir: Path, kill: str, save_index: int) -> None:
    """Install the probe: it fires inside the ``save_index``-th ``Trainer.save_checkpoint`` (or
    link)."""
    from lightning.pytorch import Trainer

    saves = {"n": 0}
    real_save = Trainer.save_checkpoint

    def save_checkpoint(self, *args, **kwargs):
        saves["n"] += 1
        return real_save(self, *args, **kwargs)

    Trainer.save_checkpoint = save_checkpoint

    def armed() -> bool:
        return saves["n"] == save_index

    def in_folder(path) -> bool:
        return (
            isinstance(path, (str, os.PathLike))
            and Path(path).resolve().parent == ckpt_dir.resolve()
        )

    if kill.startswith("bytes:"):
        _kill_after_bytes(int(kill.split(":")[1]), armed, in_folder)
    elif kill == "rename":
        _kill_at_rename(armed, in_folder)
    elif kill == "link":
        _kill_at_link(save_index, in_folder)


def _kill_after_bytes(limit: int, armed, in_folder) -> None:
    """Die once ``limit`` bytes of an armed save's file in the folder are written (0: at its
    open)."""
    real_open = builtins.open
    # the cross-filesystem copy writes through Python's file objects
    shutil._USE_CP_SENDFILE = False

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if armed() and in_folder(file) and any(m in mode for m in "wxa"):
            if limit == 0:
                _die()
            return _KillingWriter(handle, limit)
        return handle

    builtins.open = open_


def _kill_at_rename(armed, in_folder) -> None:
    """Die as an armed save renames its complete staging file into the folder: os.replace
    (ours) or shutil.move (fsspec's commit)."""
    real_replace, real_move = os.replace, shutil.move

    def replace(src, dst, *args, **kwargs):
        if armed() and in_folder(dst):
            _die()
        return real_replace(src, dst, *args, **kwargs)

    def move(src, dst, *args, **kwargs):
        if armed() and in_folder(dst):
            _die()
        return real_move(src, dst, *args, **kwargs)

    os.replace, shutil.move = replace, move


def _kill_at_link(link_index: int, in_folder) -> None:
    """Die at the ``link_index``-th symlink into the folder: Lightning removes last.ckpt, then
    links it; ours links a staging name, then renames."""
    real_symlink = os.symlink
    links = {"n": 0}

    def symlink(src, dst, *args, **kwargs):
        if in_folder(dst):
            links["n"] += 1
            if links["n"] == link_index:
                _die()
        return real_symlink(src, dst, *args, **kwargs)

    os.symlink = symlink


def _tmpfs_folder(fallback: Path) -> Path:
    """A TMPDIR on tmpfs (/dev/shm) where there is one, as on the issue's machine; elsewhere a
    separate folder: the checks (intact last.ckpt, nothing left in TMPDIR) hold on either."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and os.access(shm, os.W_OK) else fallback
    folder = root / f"lit-rag-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def _staging_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_killed_save_leaves_a_resumable_last_checkpoint(tmp_path, probe):
    import torch

    kill, save_index, save_last = PROBES[probe]
    ckpt_dir = tmp_path / "ckpt"
    tmpdir = _tmpfs_folder(tmp_path)
    try:
        env = {**os.environ, "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, str(HERE), str(ckpt_dir), kill, str(save_index), save_last],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]  # the probe fired
        leaked = sorted(p.name for p in tmpdir.iterdir())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    last = ckpt_dir / "last.ckpt"
    if save_index == 1:  # killed in the first save: no checkpoint yet, and none half-written
        assert not last.exists() and not last.is_symlink()
        resume = None
    else:  # the previous complete checkpoint
        assert last.exists(), sorted(p.name for p in ckpt_dir.iterdir())
        assert last.stat().st_size > 0
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2
        resume = str(last)
    assert leaked == []  # nothing staged (or left) in TMPDIR
    recorder = fit(ckpt_dir, max_steps=6, save_last=save_last, ckpt_path=resume)
    assert [s["step"] for s in recorder.steps] == ([4, 6] if resume else [2, 4, 6])
    # a resume from a linked last.ckpt writes last-v1.ckpt: the linked step-2 file's callback state
    # predates its link (Lightning's version counter), so read the path the callback reports
    assert torch.load(recorder.last_path, map_location="cpu", weights_only=True)["global_step"] == 6
    # the dead writer's staging file was removed by a later save
    assert _staging_files(ckpt_dir) == []


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    folder, kill_point, index, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _arm(folder, kill_point, index)
    fit(folder, max_steps=4, save_last=mode)
    sys.exit(3)  # not reached: the probe kills the fit first
