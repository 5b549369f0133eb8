"""Rollout workers through ``lit-rag fit`` on two training processes (DDP, gloo, CPU) with a
FAKE engine in the workers (``fake_workers.FakeWorkerEngine``): the real worker processes,
queues and weight links, an engine that fails on one rank at a chosen call. Slow: every fit
starts two ranks and their workers (about a minute each on two cores).

- two workers per rank start (whichever says ready first) and share uneven work;
- a worker of rank 1 that fails while its rank regenerates stale groups, in validation, or in
  DAPO's refill stops both ranks at the same point, with one ``worker-fault-step`` checkpoint
  and a line naming the fault, instead of rank 1 raising while rank 0 waits for it.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_folder

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
TINY = str(ROOT / "recipes" / "tiny.yaml")
FAKE = "--model.engine=fake_workers.FakeWorkerEngine"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory.mktemp("tiny-hf"))


def _fit(folder: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``lit-rag fit`` of the tiny recipe on 2 DDP processes with 1 fake worker each."""
    tests = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": tests, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = [
        "fit", "--config", TINY, f"--model.policy.path={folder}", "--model.policy.tiny=null",
        FAKE, "--model.reward=helpers.EvenTokenReward", "--trainer.devices=2",
        "--trainer.strategy=ddp", "--model.rollout.workers=2", "--trainer.max_steps=4",
        "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}", *extra,
    ]  # fmt: skip
    return subprocess.run(
        [LIT_RAG, *args], capture_output=True, text=True, env=env, timeout=600, cwd=out,
        check=False,
    )  # fmt: skip


def _steps(out: Path) -> list[dict]:
    (metrics,) = out.glob("*/version_*/metrics.csv")
    return [r for r in csv.DictReader(open(metrics, encoding="utf-8")) if r.get("reward/total")]


def test_two_workers_per_rank_share_uneven_work(folder, tmp_path) -> None:
    """4 workers over 2 ranks: 2 per rank. Batch 6 over 2 ranks: 3 prompts each, split 2 + 1
    over the rank's workers; 2 samples each: every step trains 3 x 2 = 6 samples a rank."""
    done = _fit(
        folder, tmp_path, "--model.rollout.workers=4", "--data.batch_size=6",
        "--trainer.max_steps=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "did not start" not in done.stderr
    rows = _steps(tmp_path)
    assert [float(r["policy/version"]) for r in rows] == [0, 1]


@pytest.mark.parametrize(
    ("where", "extra", "step"),
    [
        # samples 2 versions older than they are, bound 0: the first step (global step 0)
        # regenerates every group, and rank 1's second generate (the regeneration) fails
        (
            "regenerate",
            [
                "--model.environment=fake_workers.FakeStaleEnvironment",
                "--model.environment.init_args.stale_by=2",
                "--model.engine.init_args.fail_at_call=2",
            ],
            0,
        ),
        # validation after step 2: rank 1's first greedy generate fails
        (
            "validation",
            [
                "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2",
                "--model.engine.init_args.fail_greedy=true",
            ],
            2,
        ),
        # every sample is [7, 8], so no group varies: the first step refills, and rank 1's
        # second generate (the refill's) fails
        (
            "refill",
            [
                "--model.algorithm.init_args.dynamic_sampling_rounds=1",
                "--model.algorithm.init_args.drop_zero_variance_groups=true",
                "--model.engine.init_args.fail_at_call=2",
            ],
            0,
        ),
    ],
)  # fmt: skip
def test_a_fault_on_one_rank_stops_both_with_a_checkpoint(folder, tmp_path, where, extra, step):
    done = _fit(folder, tmp_path, "--model.engine.init_args.fail_rank=1", *extra)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [x for x in done.stdout.splitlines() if "stopping (model.rollout.on_fault" in x]
    assert any("RuntimeError: fake engine fault at call" in x for x in lines), lines
    assert any("a rollout worker of another rank failed" in x for x in lines), lines
    (checkpoint,) = tmp_path.glob("**/worker-fault-step=*.ckpt")
    assert checkpoint.name == f"worker-fault-step={step}.ckpt", where
