"""A SIGTERM (SLURM's preemption and time-limit signal) ends a ``lit-rag fit`` at the next step
boundary with a checkpoint, and the run resumed from it continues as the uninterrupted run does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_rag.callbacks import PreemptionCheckpoint
from lit_rag.cli.commands import build_cli
from lit_rag.contracts.step import StepOutput

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")


class Losses(Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.texts: list[list[str]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = StepOutput.of(outputs)
        self.losses.append(float(step.metrics["train/loss"]))
        self.texts.append([t.text for t in step.trajectories])


class SigtermAfter(Callback):
    """Sends this process a real SIGTERM at the end of training batch ``n`` (1-based)."""

    def __init__(self, n: int):
        self.n = n

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx + 1 == self.n:
            os.kill(os.getpid(), signal.SIGTERM)


def run(
    tmp_path: Path, max_steps: int, *extra: Callback, ckpt: str | None = None
) -> tuple[Losses, object]:
    cli = build_cli(
        [
            "--config",
            TINY,
            f"--trainer.max_steps={max_steps}",
            "--trainer.limit_val_batches=0",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    losses = Losses()
    cli.trainer.callbacks.extend([losses, *extra])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
    return losses, cli.trainer


def test_sigterm_saves_at_the_step_boundary_and_the_run_resumes(tmp_path):
    full, _ = run(tmp_path / "full", 4)
    with pytest.raises(SIGTERMException):
        run(tmp_path / "stopped", 4, SigtermAfter(2))
    saved = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert saved.is_file()  # lit-rag fit adds PreemptionCheckpoint to every run
    state = torch.load(saved, weights_only=True, map_location="cpu")
    assert state["global_step"] == 2  # batch 2 finished (its optimizer step), nothing after it
    resumed, trainer = run(tmp_path / "resumed", 4, ckpt=str(saved))
    assert trainer.global_step == 4 and len(resumed.losses) == 2
    assert resumed.texts == full.texts[2:]  # data position and RNG states restored
    assert resumed.losses == pytest.approx(full.losses[2:], abs=1e-6)  # weights and optimizer too


def test_a_recipe_can_choose_the_folder(tmp_path):
    callback = PreemptionCheckpoint(dirpath=str(tmp_path / "pre"))
    with pytest.raises(SIGTERMException):
        run(tmp_path / "run", 4, callback, SigtermAfter(1))
    assert callback.saved == tmp_path / "pre" / "last.ckpt" and callback.saved.is_file()


def test_lit_rag_exits_143_after_a_sigterm(monkeypatch):
    """Lightning ends a SIGTERM'd run with a code-less SystemExit (exit 0); lit-rag exits 128 + 15,
    as a process killed by SIGTERM does, so SLURM and shell scripts see the run did not finish."""
    from lit_rag.cli import commands as cli

    def stopped(args, run=True):
        raise SIGTERMException()

    monkeypatch.setattr(cli, "build_cli", stopped)
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", "--config", TINY])
    assert info.value.code == 143
