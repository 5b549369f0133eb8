"""``lit-rag fit`` whose checkpoint folder is on a full disk: one ``lit-rag: error:`` line, exit
code 2, no traceback; the earlier checkpoint in the folder is as it was and no partial file is
left.

The disk is real: a tmpfs of :data:`DISK` bytes mounted for the test, holding an earlier 64 KiB
checkpoint, so the run's first checkpoint (the tiny recipe's policy and its optimizer state,
about 440 KiB) finds no room and the write itself fails with ``ENOSPC``. Mounting needs root
(``CAP_SYS_ADMIN``); without it the test is skipped on a user's machine (a failure in CI, which
runs as root), and ``tests/checkpoints/test_checkpointing.py`` covers the same error with the write
failing in-process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import lit_rag_command, mount_unavailable, one_step_fit

pytestmark = pytest.mark.subprocess

DISK = 160 * 1024  # the earlier checkpoint (64 KiB of tensors) and the run's config.yaml fit


@pytest.fixture
def full_disk(tmp_path: Path):
    """A :data:`DISK`-byte tmpfs mounted on ``tmp_path/disk``, unmounted afterwards."""
    point = tmp_path / "disk"
    point.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        mount_unavailable("no mount command to make a small filesystem")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        mount_unavailable(f"mounting a tmpfs needs root here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_fit_on_a_full_disk_ends_with_one_line(full_disk: Path, tmp_path: Path) -> None:
    folder = full_disk / "checkpoints"  # where Lightning's ModelCheckpoint writes without logger
    folder.mkdir()
    earlier = folder / "epoch=0-step=0.ckpt"  # a previous run's
    torch.save({"state_dict": {"w": torch.zeros(16 * 1024)}}, earlier)  # 16 Ki float32 = 64 KiB
    before = earlier.read_bytes()
    run = subprocess.run(
        [*lit_rag_command(), *one_step_fit(full_disk)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("lit-rag: error:")]
    assert len(errors) == 1, run.stderr
    new = folder / "epoch=0-step=1.ckpt"
    sizes = re.fullmatch(
        rf"lit-rag: error: disk full while writing checkpoint {re.escape(str(new))}: it needs at "
        r"least ([\d,]+) bytes for its tensors, ([\d,]+) bytes free on that filesystem; "
        rf"the earlier checkpoint {re.escape(str(earlier))} is intact; free space there or "
        r"point checkpoints elsewhere \(.*\)",
        errors[0],
    )
    assert sizes is not None, errors[0]
    needs, free = (int(size.replace(",", "")) for size in sizes.groups())
    assert needs > free
    assert sorted(p.name for p in folder.iterdir()) == [earlier.name]  # no partial, no staging
    assert earlier.read_bytes() == before
