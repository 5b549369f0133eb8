"""The update on two ranks equals the update on one process over the same global batch:
``lit-rag fit`` on the tiny recipe with full parameters, a reference model (beta > 0), a token
budget that gives the ranks different micro-batch counts, under DDP, FSDP and DeepSpeed ZeRO-3.

Both runs sample the same trajectories (``global_batch.PromptScripted``: completions from the
prompt alone, 1 to 48 words) for the same 4 examples a step: one process takes all 4, each of
two ranks 2 of them. The loss is a mean over the global batch's tokens (or rows), so the logged
loss (the mean of the ranks' losses, each scaled by 2 x its share of the count) and the first
optimizer step's gradient (averaged over ranks by the strategy) must equal the one-process run's.
A loss that is each rank's own mean fails both whenever the ranks' token counts differ.

Under FSDP and ZeRO-3 every forward gathers weights from all ranks, the reference's as well as
the policy's: the rank with fewer micro-batches re-splits its rows into as many (or runs idle
forwards of the same model), or its collectives pair with the other rank's forwards of another
model (a hang, or wrong weights).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import require_package

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))


def fit(
    out: Path,
    devices: int,
    strategy: str,
    aggregation: str,
    mini_batches: int = 1,
    extra: tuple[str, ...] = (),
) -> Path:
    """One ``lit-rag fit`` of 2 steps; returns its run folder (metrics.csv, grads.pt)."""
    out.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[1] / "scripts"), os.environ.get("PYTHONPATH")])
        ),
        "OMP_NUM_THREADS": "1",
        "RECORD_DIR": str(out),
    }
    args = [
        "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"),
        f"--trainer.devices={devices}", f"--trainer.strategy={strategy}",
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.callbacks+=global_batch.RecordUpdate",
        "--model.engine=global_batch.PromptScripted",
        "--model.sampling.max_new_tokens=256",
        "--model.micro_batch_size=null", "--model.micro_batch_tokens=780",
        "--model.optimizer.max_grad_norm=null",
        f"--model.algorithm.init_args.loss_aggregation={aggregation}",
        f"--model.algorithm.init_args.mini_batches={mini_batches}",
        "--data.batch_size=null", "--data.global_batch_size=4", *extra,
    ]  # fmt: skip
    done = subprocess.run(
        [LIT_RAG, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def losses(run: Path) -> list[float]:
    rows = csv.DictReader((run / "tiny" / "version_0" / "metrics.csv").open())
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


def micro_batches(run: Path, rank: int) -> list[int]:
    return json.loads((run / f"rank{rank}.json").read_text())["micro_batches"]


def assert_same_update(one: Path, two: Path) -> None:
    # the ranks' own micro-batch counts differ at some step (else their work was even); the
    # rank with fewer re-splits its rows into as many passes (or runs idle ones)
    assert micro_batches(two, 0) != micro_batches(two, 1), "the ranks ran equal micro-batches"
    assert losses(one) == pytest.approx(losses(two), rel=1e-5, abs=1e-7)
    expected, got = torch.load(one / "grads.pt"), torch.load(two / "grads.pt")
    assert sorted(expected) == sorted(got)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "aggregation,mini_batches",
    [
        ("token", 1),
        pytest.param("sequence", 1, marks=pytest.mark.slow),  # the default run stays short
        pytest.param("token", 2, marks=pytest.mark.slow),
    ],
)
def test_ddp_update_equals_one_process_on_the_global_batch(aggregation, mini_batches, tmp_path):
    """With 2 mini-batches one process trains on groups 1-2, then 3-4 of its 4; each rank
    takes every other example, so its first mini-batch is group 1 (rank 0) or 2 (rank 1): the
    first optimizer step sees the same 2 groups either way."""
    one = fit(tmp_path / "one", 1, "auto", aggregation, mini_batches)
    two = fit(tmp_path / "two", 2, "ddp", aggregation, mini_batches)
    assert_same_update(one, two)


@pytest.mark.slow  # two two-process fits under sharding, ~1 minute each
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_sharded_update_with_uneven_micro_batches_equals_one_process(strategy, tmp_path):
    if strategy.startswith("deepspeed"):
        require_package("deepspeed", "bash scripts/install.sh dev")
    one = fit(tmp_path / "one", 1, "auto", "token")
    two = fit(tmp_path / "two", 2, strategy, "token")
    assert_same_update(one, two)


@pytest.mark.slow  # two fits, one of them two FSDP processes
def test_fsdp_accumulation_inside_no_sync_equals_one_process(tmp_path):
    """FSDP with CPU offload accumulates an optimizer step's micro-batches inside ``no_sync()``
    (its offloaded shards cannot be added up: each backward pass overwrote the last, so a step
    learned from its last micro-batch only). The same passes, on CPU ranks that cannot offload:
    uneven micro-batch counts, idle passes, one reduction at the last pass."""
    one = fit(tmp_path / "one", 1, "auto", "token")
    forced = ("--trainer.callbacks+=global_batch.UnsyncedAccumulation",)
    two = fit(tmp_path / "two", 2, "fsdp", "token", extra=forced)
    assert_same_update(one, two)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP's CPU offload needs a GPU")
def test_fsdp_cpu_offload_accumulates_as_without_offload(tmp_path):
    """The Eval-RAR and Search-R1 recipes' strategy (FSDP, ``cpu_offload: true``) on one GPU:
    the first optimizer step's gradient over several micro-batches equals FSDP's without
    offload. Before accumulating inside ``no_sync()`` it was the last micro-batch's alone."""
    gpu = ("--trainer.accelerator=gpu", "--trainer.precision=32-true")
    plain = fit(tmp_path / "plain", 1, "fsdp", "token", extra=gpu)
    offload = ("--trainer.strategy=FSDPStrategy", "--trainer.strategy.cpu_offload=true")
    offloaded = fit(tmp_path / "offload", 1, "fsdp", "token", extra=(*gpu, *offload))
    assert losses(plain) == pytest.approx(losses(offloaded), rel=1e-5, abs=1e-7)
    expected, got = torch.load(plain / "grads.pt"), torch.load(offloaded / "grads.pt")
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)
