"""EVO-RAG's alternating loop with two DDP processes (gloo, CPU): ranks with different numbers
of preference pairs (so of micro-batches) still step together, and both ranks train the same
reward model on the pairs of both (``ddp_evo_fit.py``; ~20 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_evo_fit.py"


def test_both_ranks_fit_the_same_reward_model_on_all_pairs(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["cycles"] == second["cycles"] == 2  # one reward-model epoch per policy epoch
    assert first["pairs"] == second["pairs"] > 0  # each rank holds both ranks' pairs
    assert first["heads"] == second["heads"]  # the same reward model on every rank
    assert first["hist"] == second["hist"]
