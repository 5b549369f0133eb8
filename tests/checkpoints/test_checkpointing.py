"""Atomic checkpoint saves and one-line errors for broken checkpoint files
(``lit_rag.checkpoints.storage``).

The kill tests (a real fit killed mid-save) are in ``tests/checkpoints/test_checkpoint_kill.py``;
here each kind of broken file, the staging-file cleanup and the Trainer wiring.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import one_step_fit

from lit_rag.checkpoints.storage import (
    AtomicCheckpointIO,
    _link_atomically,
    atomic_save,
    disk_full_error,
    newest_checkpoint,
    tensor_bytes,
    use_atomic_checkpoints,
)
from lit_rag.errors import DiskFullError, InputError, NotWritableError
from lit_rag.files import remove_stale_temps, temp_path

CHECKPOINT = {
    "state_dict": {"w": torch.arange(256.0)},
    "global_step": 3,
    "lit_rag": {"schedule": {"total": 6}},
}


def _saved(path: Path) -> bytes:
    torch.save(CHECKPOINT, path)
    return path.read_bytes()


def _garbled_pickle(path: Path) -> None:
    """A complete zip whose ``data.pkl`` entry is garbage: the archive reads, the pickle does
    not."""
    data = bytearray(_saved(path))
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    start = (
        info.header_offset + 30 + len(info.filename) + len(info.extra)
    )  # local header: 30 bytes + name + extra
    data[start : start + info.compress_size] = (
        b"\xff" * info.compress_size
    )  # stored, not compressed
    path.write_bytes(bytes(data))


# kind -> (how to break the file, words the one-line message must hold)
BROKEN = {
    "empty": (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    "half": (
        lambda p: p.write_bytes(_saved(p)[: len(_saved(p)) // 2]),
        "is truncated or not a torch checkpoint",
    ),
    "tail_cut": (
        lambda p: p.write_bytes(_saved(p)[:-10]),
        "is truncated or not a torch checkpoint",
    ),
    "random_bytes": (
        lambda p: p.write_bytes(os.urandom(4096)),
        "is truncated or not a torch checkpoint",
    ),
    "text": (
        lambda p: p.write_text("model: tiny\n" * 20),
        "is truncated or not a torch checkpoint",
    ),
    "garbled_pickle": (_garbled_pickle, "cannot be read by torch.load"),
    "folder": (lambda p: p.mkdir(), "is a folder, not a checkpoint file"),
    "missing": (lambda p: None, "does not exist"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.parametrize(
    "weights_only", [None, True, False], ids=["default", "weights_only", "full_unpickle"]
)
def test_broken_checkpoint_is_one_input_error_line(tmp_path, kind, weights_only):
    path = tmp_path / "last.ckpt"
    breaker, words = BROKEN[kind]
    breaker(path)
    with pytest.raises(InputError) as err:
        AtomicCheckpointIO().load_checkpoint(path, weights_only=weights_only)
    message = str(err.value)
    assert "\n" not in message and "\x1b" not in message, message  # one line, no terminal colours
    assert message.startswith(f"checkpoint {path} {words}"), message
    assert len(message) < 400, message


def test_checkpoint_with_objects_says_weights_only_refused_it(tmp_path):
    path = tmp_path / "objects.ckpt"
    torch.save(
        {"state_dict": {}, "info": zipfile.ZipInfo("x")}, path
    )  # a class weights_only refuses
    with pytest.raises(
        InputError,
        match=r"holds objects that torch.load\(weights_only=True\) refuses "
        r"\(UnpicklingError: WeightsUnpickler error: Unsupported global",
    ):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert (
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)["info"].filename == "x"
    )  # as Lightning


def test_good_checkpoint_loads_weights_only(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(CHECKPOINT, path)
    loaded = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], CHECKPOINT["state_dict"]["w"])
    assert torch.load(path, weights_only=True)["lit_rag"] == {"schedule": {"total": 6}}


def test_save_writes_beside_the_destination_not_in_tmpdir(tmp_path, monkeypatch):
    staging = tmp_path / "tmpdir"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))  # what TMPDIR sets
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src), Path(dst), Path(src).stat().st_size))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "ckpt" / "last.ckpt"  # the folder does not exist yet
    AtomicCheckpointIO().save_checkpoint(CHECKPOINT, path)
    [(src, dst, size)] = seen
    assert src.parent == path.parent and src.name.startswith(".last.ckpt.tmp-") and dst == path
    assert size == path.stat().st_size  # the complete file was renamed
    assert list(staging.iterdir()) == [] and sorted(p.name for p in path.parent.iterdir()) == [
        "last.ckpt"
    ]


def test_failed_save_keeps_the_previous_checkpoint_and_no_staging_file(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_save(CHECKPOINT, path)
    before = path.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - pickling a lambda: AttributeError or PicklingError by version
        atomic_save({"state_dict": {"w": torch.ones(3)}, "bad": lambda: None}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _full_disk(monkeypatch, how: str) -> None:
    """Make the next save fail as a full disk does, after part of the file is written.

    ``write``: the file's write raises ``OSError(ENOSPC)``; ``zip_writer``: torch's zip writer
    raises ``RuntimeError`` while handling that ``OSError`` (what torch 2.x raises on a full
    tmpfs); ``fsync_quota``: the bytes are written and ``fsync`` reports the quota spent
    (``EDQUOT``, as NFS does).
    """
    real_save = torch.save

    def save(obj, f):
        f.write(b"PK" + b"\0" * 4094)
        f.flush()
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if how == "write":
            raise full
        try:
            raise full
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos"
            ) from None

    def fsync(fd):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    if how == "fsync_quota":
        monkeypatch.setattr(torch, "save", real_save)
        monkeypatch.setattr(os, "fsync", fsync)
    else:
        monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("how", ["write", "zip_writer", "fsync_quota"])
def test_full_disk_is_one_line_with_sizes_and_the_intact_checkpoint(tmp_path, monkeypatch, how):
    older, newer = tmp_path / "epoch=0-step=2.ckpt", tmp_path / "epoch=0-step=4.ckpt"
    atomic_save(CHECKPOINT, older)
    atomic_save(CHECKPOINT, newer)
    minute_ago = time.time() - 60
    os.utime(older, (minute_ago, minute_ago))
    before = newer.read_bytes()
    free = 3 * 2**20 + 2**19  # 3,670,016 bytes = 3.5 MiB
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: SimpleNamespace(free=free))
    _full_disk(monkeypatch, how)
    path = tmp_path / "epoch=0-step=6.ckpt"
    with pytest.raises(DiskFullError) as caught:
        AtomicCheckpointIO().save_checkpoint(CHECKPOINT, path)
    # needs: the 256 float32 of "w", 256 x 4 = 1,024 bytes (below a MiB: bytes alone)
    assert str(caught.value) == (
        f"disk full while writing checkpoint {path}: it needs at least 1,024 bytes for its "
        f"tensors, 3,670,016 bytes (3.5 MiB) free on that filesystem; the earlier checkpoint "
        f"{newer} is intact; free space there or point checkpoints elsewhere (ModelCheckpoint's "
        "dirpath; by default the logger's save_dir, else trainer.default_root_dir)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [older.name, newer.name]  # no partial
    assert newer.read_bytes() == before
    assert torch.equal(torch.load(newer, weights_only=True)["state_dict"]["w"], torch.arange(256.0))


def test_fit_on_a_full_disk_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """The error passes out of Lightning's fit (``_call_and_handle_interrupt`` runs the
    ``on_exception`` hooks and re-raises) to the command's one line. A real full filesystem:
    ``tests/checkpoints/test_checkpoint_full_disk.py`` (needs root to mount one)."""
    from lit_rag.cli.commands import main

    _full_disk(monkeypatch, "zip_writer")
    with pytest.raises(SystemExit) as caught:
        main(one_step_fit(tmp_path))
    assert caught.value.code == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    new = tmp_path / "checkpoints" / "epoch=0-step=1.ckpt"
    assert line.startswith(f"lit-rag: error: disk full while writing checkpoint {new}: "), err
    assert f"; no earlier checkpoint in {new.parent}; " in line, err
    assert list(new.parent.iterdir()) == []  # no partial file, no staging file


def _refuse_writes(monkeypatch, how: str) -> None:
    """Make the next save fail as a folder that refuses writes does (root ignores ``chmod``, so
    the refusal is simulated): ``read_only``: every unlink and create raises ``EROFS``, as on a
    file system mounted read-only (even the unlink of a missing staging name); ``no_permission``:
    creating the staging file raises ``EACCES``."""
    import builtins

    def refuse(code: int):
        def call(*args, **kwargs):
            raise OSError(code, os.strerror(code), str(args[0]))

        return call

    if how == "read_only":
        monkeypatch.setattr(os, "unlink", refuse(errno.EROFS))
    else:
        real_open = builtins.open

        def open_(file, mode="r", *args, **kwargs):
            if "x" in mode:
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("read_only", "is on a read-only file system (EROFS)"),
        ("no_permission", "is not writable by this user (no permission) (EACCES)"),
    ],
)
def test_a_folder_refusing_writes_is_one_line_with_the_intact_checkpoint(
    tmp_path, monkeypatch, how, why
):
    earlier = tmp_path / "epoch=0-step=2.ckpt"
    atomic_save(CHECKPOINT, earlier)
    before = earlier.read_bytes()
    _refuse_writes(monkeypatch, how)
    path = tmp_path / "epoch=0-step=4.ckpt"
    with pytest.raises(NotWritableError) as caught:
        AtomicCheckpointIO().save_checkpoint(CHECKPOINT, path)
    assert str(caught.value) == (
        f"cannot write checkpoint {path}: {tmp_path} {why}; the earlier checkpoint {earlier} is "
        "intact; make the folder writable or point checkpoints elsewhere (ModelCheckpoint's "
        "dirpath; by default the logger's save_dir, else trainer.default_root_dir)"
    )
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]  # no staging file
    assert earlier.read_bytes() == before


def test_fit_into_a_read_only_folder_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """The in-process twin of ``tests/checkpoints/test_checkpoint_read_only.py`` (a real
    read-only mount, which needs root)."""
    from lit_rag.cli.commands import main

    _refuse_writes(monkeypatch, "read_only")
    with pytest.raises(SystemExit) as caught:
        main(one_step_fit(tmp_path))
    err = capsys.readouterr().err
    assert caught.value.code == 2, err
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    new = tmp_path / "checkpoints" / "epoch=0-step=1.ckpt"
    assert line.startswith(
        f"lit-rag: error: cannot write checkpoint {new}: {new.parent} is on a read-only file "
        f"system (EROFS); no earlier checkpoint in {new.parent}; "
    ), err


def test_full_disk_names_the_newest_whole_checkpoint_or_none(tmp_path):
    assert str(disk_full_error(tmp_path / "last.ckpt", CHECKPOINT)).split("; ")[1] == (
        f"no earlier checkpoint in {tmp_path}"
    )
    whole = tmp_path / "epoch=0-step=2.ckpt"
    atomic_save(CHECKPOINT, whole)
    hour_ago = time.time() - 3600
    os.utime(whole, (hour_ago, hour_ago))
    (tmp_path / "copied.ckpt").write_bytes(whole.read_bytes()[:-10])  # newer, its end cut off
    (tmp_path / "sharded.ckpt").mkdir()  # a folder: an FSDP sharded checkpoint
    (tmp_path / "dangling.ckpt").symlink_to(tmp_path / "gone.ckpt")
    assert newest_checkpoint(tmp_path) == whole


def test_tensor_bytes_counts_each_storage_once_and_bounds_the_file(tmp_path):
    w = torch.zeros(1000)  # 1,000 float32 = 4,000 bytes
    state = {"w": w, "view": w[:10], "opt": [{"exp_avg": torch.zeros(10, dtype=torch.float64)}]}
    assert tensor_bytes(state) == 4000 + 80  # the view saves w's storage: once; 10 float64 = 80
    torch.save(state, tmp_path / "s.ckpt")
    assert tensor_bytes(state) <= (tmp_path / "s.ckpt").stat().st_size  # "at least": a bound


def test_cli_finds_a_full_disk_under_a_later_error(monkeypatch, capsys):
    """Lightning stops a failed fit by calling its loggers' ``finalize``; a logger writing to the
    same full disk raises its own ``OSError`` over the checkpoint's error: still one line."""
    from lit_rag.cli import commands as cli

    def fit_over_a_full_disk(args):
        try:
            raise DiskFullError("disk full while writing checkpoint x.ckpt")
        except DiskFullError:
            # raised while handling it, as the logger's own error is: chained implicitly
            # (__context__), which is what the CLI must look under
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # noqa: B904

    monkeypatch.setattr(cli, "build_cli", fit_over_a_full_disk)
    with pytest.raises(SystemExit) as caught:
        cli.main(["fit", "--config", "recipe.yaml"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == "lit-rag: error: disk full while writing checkpoint x.ckpt\n"

    def crash(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # not a checkpoint: a traceback

    monkeypatch.setattr(cli, "build_cli", crash)
    with pytest.raises(OSError):
        cli.main(["fit", "--config", "recipe.yaml"])


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_stale_staging_files_of_dead_writers_are_removed(tmp_path):
    host = temp_path(tmp_path / "x").name.split(".tmp-")[1].rsplit("-", 1)[0]
    dead = tmp_path / f".last.ckpt.tmp-{host}-{_dead_pid()}"
    live = tmp_path / f".last.ckpt.tmp-{host}-{os.getppid()}"  # our parent process: alive
    mine = temp_path(tmp_path / "epoch=0-step=2.ckpt")  # this PID, not being written: a leftover
    foreign_old = tmp_path / ".last.ckpt.tmp-otherhost-12"
    foreign_new = tmp_path / ".last.ckpt.tmp-otherhost-13"
    keep = tmp_path / "epoch=0-step=2.ckpt"
    for p in (dead, live, mine, foreign_old, foreign_new, keep):
        p.write_bytes(b"x")
    hour_ago = time.time() - 3700
    os.utime(foreign_old, (hour_ago, hour_ago))
    atomic_save(CHECKPOINT, tmp_path / "last.ckpt")  # the next save cleans the folder
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([live.name, foreign_new.name, keep.name, "last.ckpt"])
    assert remove_stale_temps(tmp_path) == []


def _trainer(**kwargs):
    from lightning.pytorch import Trainer

    return Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_use_atomic_checkpoints_installs_on_the_default_io_only(tmp_path):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    trainer = _trainer(callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last="link")])
    use_atomic_checkpoints(trainer)
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    assert trainer.checkpoint_callback._link_checkpoint is _link_atomically

    class Mine(TorchCheckpointIO):
        pass

    trainer = _trainer(
        plugins=[Mine()], callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last="link")]
    )
    use_atomic_checkpoints(trainer)
    assert type(trainer.strategy.checkpoint_io) is Mine  # the user's own: kept
    assert "_link_checkpoint" not in vars(trainer.checkpoint_callback)

    trainer = _trainer(plugins=[AsyncCheckpointIO()])
    use_atomic_checkpoints(trainer)
    io = trainer.strategy.checkpoint_io
    assert (
        type(io) is AsyncCheckpointIO and type(io.checkpoint_io) is AtomicCheckpointIO
    )  # ours as its base
    io.teardown()


def test_use_atomic_checkpoints_leaves_deepspeed_alone():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = DeepSpeedStrategy.__new__(
        DeepSpeedStrategy
    )  # no engine needed: only its type is read
    strategy._checkpoint_io = None
    use_atomic_checkpoints(SimpleNamespace(strategy=strategy, checkpoint_callbacks=[]))
    assert strategy._checkpoint_io is None


def test_last_link_is_swapped_in_not_deleted_first(tmp_path, monkeypatch):
    """Lightning deletes ``last.ckpt`` and then links it: between the two there is no last.ckpt."""
    old, new, link = (
        tmp_path / "epoch=0-step=2.ckpt",
        tmp_path / "epoch=0-step=4.ckpt",
        tmp_path / "last.ckpt",
    )
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    os.symlink(old.name, link)
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda: None))
    states = []
    real_replace = os.replace

    def replace(src, dst):
        states.append(Path(dst).read_bytes())  # what last.ckpt is just before the swap
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    _link_atomically(trainer, str(new), str(link))
    assert (
        states == [b"old"]
        and link.is_symlink()
        and os.readlink(link) == new.name
        and link.read_bytes() == b"new"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([old.name, new.name, link.name])


def test_fit_ckpt_path_goes_through_the_plugin(tmp_path):
    """``trainer.fit(ckpt_path=...)`` loads via strategy.load_checkpoint ->
    checkpoint_io.load_checkpoint."""
    from lightning.pytorch import LightningModule

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

    empty = tmp_path / "last.ckpt"
    empty.write_bytes(b"")
    trainer = _trainer(max_steps=1, default_root_dir=tmp_path, enable_checkpointing=False)
    use_atomic_checkpoints(trainer)
    with pytest.raises(InputError, match=r"^checkpoint .*last.ckpt is empty \(0 bytes\)"):
        trainer.fit(Tiny(), ckpt_path=str(empty))
