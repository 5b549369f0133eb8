"""Multi-turn rollout under FSDP (Eval-RAR Appendix A.2: the paper trains with FSDP): two gloo
processes whose episodes take different numbers of turns (``fsdp_multiturn_fit.py`` runs the
fit; ~30 s).

Rank 0's episodes answer at once: 1 generation call per step, 0 turns. Rank 1's search three
times and evaluate after each search, then answer: search, evaluate (x3), answer = 7 calls per
step, 3 turns. With the hf engine's old ``per_layer`` FSDP generation every call is a
collective: rank 0 stops after 1 while rank 1 waits in its 2nd, until the 60 s gloo timeout
(measured: both ranks fail, "Timed out waiting 60000ms for recv"). The default ``gather``
generates from weights gathered once per rollout, without collectives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[1] / "scripts" / "fsdp_multiturn_fit.py"


def test_ranks_with_different_turn_counts_train_under_fsdp(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "gather"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert [row["step"] for row in first] == [row["step"] for row in second] == [1, 2]
    for step, (a, b) in enumerate(zip(first, second, strict=True), start=1):
        # G = 2 episodes of one prompt per rank, all answered
        assert a["turns"] == [0, 0] and a["searches"] == [0, 0] and all(a["answered"])
        assert b["turns"] == [3, 3] and b["searches"] == [3, 3] and all(b["answered"])
        # generation calls so far: rank 0 one per step, rank 1 seven per step
        assert a["generate_calls"] == 1 * step
        assert b["generate_calls"] == 7 * step
