"""The collectives of a training step on two gloo ranks with uneven batches (rank 0: 6 rows a
step, rank 1: 9; micro-batches of at most 3 rows; ``collectives_fit.py`` records every
``torch.distributed`` call and every DDP gradient bucket, ~20 s).

A step costs a fixed number of collectives whatever its micro-batches and metrics: the update
agrees its plan in three (the counts every rank runs, each optimizer step's passes, the global
token count), the metrics take two (the ranks' metric names, then every value in one stacked
mean), the outage watch one. DDP reduces the gradient once per optimizer step (``no_sync`` on
the micro-batches before the last), not once per micro-batch. The rank with fewer rows
re-splits them into as many micro-batches as the other runs (smaller real passes, no idle
ones). Before, a step ran about 100 Python collectives (a barrier and an all-reduce per logged
metric and per count agreed) and one gradient all-reduce per micro-batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[1] / "scripts" / "collectives_fit.py"
#: collectives of one training step besides the gradient's own (see the module docstring)
STEP_LIMIT = 6
UPDATE_PLAN = 3


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[list[dict]]:
    out = tmp_path_factory.mktemp("collectives")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "3"],
        cwd=out,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _outside_gradient(row: dict) -> int:
    """Python collectives of the step less the gradient's all-reduces (one per DDP bucket)."""
    return sum(row["step_collectives"].values()) - row["gradient_buckets"]


def test_uneven_ranks_run_as_many_real_micro_batches(ranks):
    first = [rank[0] for rank in ranks]
    assert [row["rows"] for row in first] == [6, 9]
    # rank 0's 6 rows would fill 2 micro-batches of 3; it runs 3 smaller ones, as rank 1 does
    assert [row["micro_batches"] for row in first] == [3, 3]


def test_a_step_runs_a_fixed_number_of_collectives_whatever_its_micro_batches(ranks):
    for rank in ranks:
        for row in rank:
            assert _outside_gradient(row) <= STEP_LIMIT, row
            update = sum(
                v
                for k, v in row["update_collectives"].items()
                if k not in ("micro_batches", "rows")
            )
            assert update - row["gradient_buckets"] == UPDATE_PLAN, row
            assert "barrier" not in row["step_collectives"], row


def test_ddp_reduces_the_gradient_once_per_optimizer_step(ranks):
    buckets = {row["gradient_buckets"] for rank in ranks for row in rank}
    assert buckets == {1}  # the tiny model's gradient fits one bucket; one optimizer step a step
