"""The console script itself on bad input: stderr ends with exactly one ``lit-rag: error: ...`` line
and holds no traceback, and the exit code is 2 (tests/cli/test_bad_inputs.py runs the full table
in-process). Lightning's own info line ("Seed set to 0") may come first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess]

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")


def fit_tiny(overrides: list[str], cwd) -> subprocess.CompletedProcess:
    """``lit-rag fit`` of the tiny recipe as a subprocess (no logger), in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "lit_rag", "fit", "--config", TINY, "--trainer.logger=false"]
        + overrides,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["--model.group_size=-2"], "group_size"),  # raised in a module's __init__
        (["--trainer.max_step=4"], "unrecognized arguments: --trainer.max_step=4"),  # the parser
        (["--ckpt_path=empty.ckpt"], "is empty (0 bytes)"),  # a file read before the run
    ],
)
def test_console_script_prints_one_line(overrides, fragment, tmp_path) -> None:
    (tmp_path / "empty.ckpt").write_bytes(b"")
    run = fit_tiny(overrides, tmp_path)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("lit-rag: error:")] == lines[-1:], run.stderr
    assert set(lines[:-1]) <= {"Seed set to 0"}, (
        run.stderr
    )  # nothing else: no warning, no traceback
    assert fragment in lines[-1]


def test_blank_question_is_one_line(tmp_path) -> None:
    """A data file is read once the run starts: after Lightning's start-up lines (devices, the
    batch limits), the one line names the file and line of the question that is only spaces."""
    rows = [
        {"id": "q1", "question": "Who founded Orbel Mills?", "answers": ["Ada Orbel"]},
        {"id": "q2", "question": " ", "answers": ["Ada Orbel"]},
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = fit_tiny(["--data.train=train.jsonl"], tmp_path)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("lit-rag: error:")]
    assert errors == [
        "lit-rag: error: train.jsonl:2: field 'question' is empty (got ' '); "
        "every example needs a question"
    ], run.stderr
    assert run.stderr.rstrip().endswith(errors[0])
