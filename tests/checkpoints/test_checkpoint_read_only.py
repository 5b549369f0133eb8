"""``lit-rag fit`` whose checkpoint folder is on a read-only file system: one ``lit-rag: error:``
line, exit code 2, no traceback; the earlier checkpoint in the folder is as it was. The same for
the run's own folder (its config.yaml) and for any command's write (an index build's).

The file system is real: a tmpfs mounted for the test, an earlier checkpoint written into it,
then remounted read-only, so the run's save fails with ``EROFS`` as on a read-only share. Root
ignores ``chmod``, so a mount is the way to refuse root a write. Mounting needs root
(``CAP_SYS_ADMIN``); without it the test is skipped on a user's machine (a failure in CI, which
runs as root), and ``tests/checkpoints/test_checkpointing.py`` covers the same errors with the
writes
refused in-process.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import lit_rag_command, mount_unavailable, one_step_fit

pytestmark = pytest.mark.subprocess


@pytest.fixture
def read_only(tmp_path: Path):
    """``read_only(folder, fill)``: a tmpfs mounted on ``folder``, filled by ``fill(folder)``,
    then remounted read-only; unmounted afterwards."""
    mounted: list[Path] = []
    mount = shutil.which("mount")

    def run(*args: str) -> None:
        if mount is None:
            mount_unavailable("no mount command to make a read-only filesystem")
        done = subprocess.run([mount, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            mount_unavailable(f"mounting a tmpfs needs root here: {done.stderr.strip()}")

    def make(point: Path, fill: Callable[[Path], None]) -> Path:
        point.mkdir(parents=True)
        run("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point))
        mounted.append(point)
        fill(point)
        run("-o", "remount,ro", str(point))
        return point

    yield make
    for point in reversed(mounted):
        subprocess.run(["umount", str(point)], check=True)


def _fit(run: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*lit_rag_command(), *one_step_fit(run)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _one_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("lit-rag: error:")]
    assert len(errors) == 1, run.stderr
    assert run.stderr.rstrip().endswith(errors[0]), run.stderr
    return errors[0]


def test_fit_into_a_read_only_checkpoint_folder_ends_with_one_line(
    read_only, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    earlier = run / "checkpoints" / "epoch=0-step=0.ckpt"  # a previous run's

    def fill(folder: Path) -> None:
        torch.save({"state_dict": {"w": torch.zeros(16)}}, earlier)

    folder = read_only(run / "checkpoints", fill)
    before = earlier.read_bytes()
    line = _one_line(_fit(run, tmp_path))
    new = folder / "epoch=0-step=1.ckpt"
    assert line == (
        f"lit-rag: error: cannot write checkpoint {new}: {folder} is on a read-only file system "
        f"(EROFS); the earlier checkpoint {earlier} is intact; make the folder writable or point "
        "checkpoints elsewhere (ModelCheckpoint's dirpath; by default the logger's save_dir, "
        "else trainer.default_root_dir)"
    )
    assert sorted(p.name for p in folder.iterdir()) == [earlier.name]
    assert earlier.read_bytes() == before


def test_fit_into_a_read_only_run_folder_ends_with_one_line(read_only, tmp_path: Path) -> None:
    """The run's folder itself read-only: LightningCLI's config.yaml is the first write."""
    run = read_only(tmp_path / "run", lambda folder: None)
    line = _one_line(_fit(run, tmp_path))
    assert f"'{run / 'config.yaml'}'" in line and "not writable" in line, line
    assert "point the run at a folder you can write (trainer.default_root_dir" in line


def test_index_build_into_a_read_only_folder_ends_with_one_line(read_only, tmp_path: Path):
    """Any command: a file the system refuses is named in one line (here the build's lock)."""
    folder = read_only(tmp_path / "indexes", lambda folder: None)
    args = ["index", "build", "--corpus", "synthetic", "--out", str(folder / "idx")]
    done = subprocess.run([*lit_rag_command(), *args], capture_output=True, text=True, check=False)
    assert _one_line(done) == (
        f"lit-rag: error: {folder / '.idx.lock'}: Read-only file system (EROFS); write to a "
        "folder on a writable file system"
    )
