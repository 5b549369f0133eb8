"""Several processes, the parts a single process can check (lit_rag/models/distributed.py): the CPU
strategies a recipe's strategy name gets, the process-group timeout set on the built strategy
(default and recipe value), and the one line a failed collective becomes. The two-process runs
of the real command are in tests/cli/test_multiprocess_cli.py."""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import one_line_error

from lit_rag.cli.commands import build_cli
from lit_rag.models.distributed import (
    DEFAULT_TIMEOUT_S,
    collective_failure,
    cpu_strategy,
)

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")


@pytest.mark.parametrize(
    "name,cls,stage",
    [
        ("fsdp", "CPUFSDP", None),
        ("deepspeed", "CPUDeepSpeed", None),
        ("deepspeed_stage_2", "CPUDeepSpeed", 2),
        ("deepspeed_stage_3", "CPUDeepSpeed", 3),
    ],
)
def test_strategies_lightning_takes_on_cuda_only_get_their_cpu_class(name, cls, stage):
    config = cpu_strategy(name)
    assert config["class_path"] == f"lit_rag.models.cpu_strategies.{cls}"
    assert config["init_args"]["process_group_backend"] == "gloo"
    assert config["init_args"].get("stage") == stage


@pytest.mark.parametrize("strategy", ["ddp", "auto", "single_device", "no-such", None])
def test_other_strategies_are_left_alone(strategy):
    assert cpu_strategy(strategy) is None


def _trainer(*extra: str):
    return build_cli(["--config", TINY, "--model.engine=hf", *extra], run=False).trainer


def test_a_distributed_fit_gets_the_cpu_default_timeout():
    trainer = _trainer("--trainer.devices=2", "--trainer.strategy=ddp")
    assert trainer.strategy._timeout == datetime.timedelta(seconds=DEFAULT_TIMEOUT_S["cpu"])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed_stage_2"])
def test_the_recipe_sets_the_timeout_of_every_strategy(strategy):
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    trainer = _trainer(
        "--trainer.devices=2", f"--trainer.strategy={strategy}", "--collective_timeout=42"
    )
    assert trainer.strategy._timeout == datetime.timedelta(seconds=42)
    if strategy != "ddp":  # Lightning refuses these on CPU; lit-rag's subclasses run them
        assert type(trainer.strategy).__module__ == "lit_rag.models.cpu_strategies"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_timeout_that_is_not_positive_is_one_line(value, capsys):
    line = one_line_error(
        ["fit", "--config", TINY, "--model.engine=hf", f"--collective_timeout={value}"], capsys
    )
    assert line == f"lit-rag: error: collective_timeout must be > 0 seconds, got {float(value)}"


#: two gloo processes: rank 1 leaves (or sleeps past the timeout); rank 0 is in a collective
_SCRIPT = textwrap.dedent(
    """
    import datetime, os, sys, time, torch, torch.distributed as dist
    from lit_rag.models.distributed import collective_failure, failure_line
    rank, how, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=2))
    if rank == 1:
        os._exit(0) if how == "gone" else time.sleep(6)
        sys.exit(0)
    def header_broadcast():
        dist.broadcast_object_list(["runs/x"], src=0)
    try:
        header_broadcast() if how == "sleep" else dist.all_reduce(torch.ones(1))
    except Exception as exc:
        print(failure_line(collective_failure(exc), 0, 2, 7, 2.0))
    """
)


@pytest.mark.parametrize("how", ["sleep", "gone"])
@pytest.mark.multiprocess
def test_a_failed_collective_is_named_with_rank_step_and_operation(how, tmp_path):
    import socket

    script = tmp_path / "collective.py"
    script.write_text(_SCRIPT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), how, port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (1, 0)
    ]
    out = ranks[1].communicate(timeout=60)[0].strip()
    ranks[0].communicate(timeout=60)
    if how == "sleep":
        assert out == (
            "rank 0 of 2 at step 7: broadcast_object_list (from collective.header_broadcast) "
            "timed out waiting for the other ranks (collective_timeout 2 s): a rank hangs, "
            "crashed or took another branch; if the run is only slow, raise it with "
            "--collective_timeout=SECONDS"
        )
    else:
        assert out.startswith(
            "rank 0 of 2 at step 7: all_reduce (from collective.<module>) failed: another rank "
            "stopped or closed its connection ("
        ), out


def test_other_errors_are_not_collective_failures():
    assert collective_failure(ValueError("group_size must be > 0")) is None
    assert collective_failure(RuntimeError("CUDA out of memory")) is None
