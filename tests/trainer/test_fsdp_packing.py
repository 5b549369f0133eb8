"""Shared-prefix log-probs and gradients under FSDP equal the unshared computation's and the
unsharded model's: two gloo processes, ``fsdp_packing.py`` (~20 s per case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[1] / "scripts" / "fsdp_packing.py"


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_shared_prefix_under_fsdp_equals_unshared(tmp_path, kind):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), kind],
        check=False,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["packed_a_group"] and result["attention"] == "lit_rag_sdpa"  # the split path ran
    assert result["grad_names"] and result["grads"] > 0
    # differences in units of rtol 1e-5 / atol 1e-6 (<= 1: torch.allclose holds)
    for key in (
        "logprobs_shared_vs_unshared",
        "logprobs_shared_vs_unsharded_model",
        "grads_shared_vs_unshared",
        "grads_shared_vs_unsharded_model",
    ):
        assert result[key] <= 1.0, (key, result[key])
