"""Ctrl-C (SIGINT) stops any ``lit-rag`` command with one line, ``lit-rag: interrupted``, and exit
code 130 (128 + SIGINT, as a shell reports it), never a ``KeyboardInterrupt`` traceback; what
the command was writing is cleaned up as the exception unwinds.

The signal is sent to the real console command once it is busy: an index build once its
staging folder exists (100,000 passages take seconds to index here), a fit once its first step
is logged. SIGTERM keeps its own handling (a checkpoint, exit 143): tests/checkpoints/
test_preemption.py.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess]

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
#: how long the command may take to get busy before the test gives up (not a timing assert:
#: only a hung start fails here)
START_LIMIT_S = 120.0


def _command() -> list[str]:
    """The ``lit-rag`` console script of this environment (``python -m lit_rag`` without it)."""
    script = Path(sys.executable).with_name("lit-rag")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lit_rag"]


def _corpus(path: Path, passages: int) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    with path.open("w", encoding="utf-8") as handle:
        for i in range(passages):
            text = " ".join(rng.choices(words, k=20))
            handle.write(json.dumps({"id": f"p{i}", "title": f"T{i}", "text": text}) + "\n")
    return path


def _interrupt_when(args: list[str], cwd: Path, busy: Callable[[], bool]) -> tuple[int, str]:
    """Start ``lit-rag ARGS``, send SIGINT once ``busy()``; returns its exit code and stderr."""
    process = subprocess.Popen(
        [*_command(), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + START_LIMIT_S
        while not busy():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command never got busy"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _assert_one_line(code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip().splitlines()[-1] == "lit-rag: interrupted", err
    assert err.count("lit-rag:") == 1, err


def test_ctrl_c_during_index_build_is_one_line_and_the_earlier_index_stays(tmp_path: Path) -> None:
    small = _corpus(tmp_path / "small.jsonl", 50)
    build = ["index", "build", "--retriever", "bm25", "--out", "idx", "--corpus"]
    done = subprocess.run([*_command(), *build, str(small)], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    index = tmp_path / "idx"
    before = _files(index)
    big = _corpus(tmp_path / "big.jsonl", 100_000)

    def staging() -> bool:
        return any(tmp_path.glob(".idx.tmp-*"))

    code, err = _interrupt_when([*build, str(big)], tmp_path, staging)
    _assert_one_line(code, err)
    assert _files(index) == before
    assert not staging()
    again = subprocess.run([*_command(), *build, str(small)], cwd=tmp_path, capture_output=True)
    assert again.returncode == 0, again.stderr  # the lock was let go


def test_ctrl_c_during_fit_is_one_line(tmp_path: Path) -> None:
    metrics = tmp_path / "runs" / "tiny" / "version_0" / "metrics.csv"

    def stepping() -> bool:  # the CSV logger writes after each step (a header and a row)
        return metrics.is_file() and len(metrics.read_text().splitlines()) >= 2

    args = ["fit", "--config", TINY, "--trainer.max_steps=100000", "--model.engine=hf"]
    code, err = _interrupt_when(args, tmp_path, stepping)
    _assert_one_line(code, err)
