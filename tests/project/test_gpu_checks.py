"""``scripts/gpu_checks.py``, the checks ``scripts/gpu_smoke.sh checks`` runs on a first GPU: on
the CPU the master-weights check runs for real (a one-step ``lit-rag fit``), the GPU-only ones
say SKIP and why, and a failure is one FAIL line and exit status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "scripts" / "gpu_checks.py"

pytestmark = pytest.mark.subprocess


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKS), *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # a one-step lit-rag fit (tests/trainer/test_master_weights.py runs it too)
def test_on_the_cpu_the_masters_check_passes_and_gpu_checks_skip():
    done = run("--device", "cpu", "masters", "offload", "link")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["PASS", "masters"],
        ["SKIP", "offload"],
        ["SKIP", "link"],
    ]
    assert "moved 100.0% at lr 1e-6" in lines[0]


def test_a_failing_check_is_one_fail_line_and_exit_1(monkeypatch, capsys):
    sys.path.insert(0, str(CHECKS.parent))
    import gpu_checks

    def broken(device: str) -> str:
        raise AssertionError("weights ['torch.bfloat16']")

    monkeypatch.setitem(gpu_checks.CHECKS, "masters", broken)
    assert gpu_checks.main(["--device", "cpu", "masters"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("FAIL masters") and "torch.bfloat16" in line


def test_gpu_only_checks_say_skip_and_why_on_the_cpu():
    done = run("--device", "cpu", "offload", "index", "link", "peak", "mismatch")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    verdicts = [line.split(maxsplit=4) for line in done.stdout.splitlines()]
    assert [v[:2] for v in verdicts] == [
        ["SKIP", "offload"],
        ["SKIP", "index"],
        ["SKIP", "link"],
        ["SKIP", "peak"],
        ["SKIP", "mismatch"],
    ]
    assert all(len(v) == 5 and v[4] for v in verdicts)  # each says why
