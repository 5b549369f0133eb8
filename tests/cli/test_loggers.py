"""TensorBoard and Weights & Biases from a recipe with a one-line logger override, and
``lit-rag report`` on what a real tiny fit writes.

Each fit is ``lit-rag fit --config recipes/tiny.yaml`` in-process (random 2-layer model, 2 steps,
seconds). The recipe sets a CSVLogger with ``init_args``; ``--trainer.logger=TensorBoardLogger``
replaces it (jsonargparse keeps the init_args the new class takes: ``save_dir``, ``name``) and
``--trainer.logger+=...`` adds a logger beside it. W&B runs offline (no network).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers import require_package

from lit_rag import registry
from lit_rag.cli.commands import main
from lit_rag.report.page import build_report

require_package("tensorboard", "pip install 'lit-rag[loggers]'")

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
SAMPLES = "--trainer.callbacks+=lit_rag.callbacks.RolloutSampleLogger"


def fit(root: Path, *overrides: str) -> None:
    """``lit-rag fit`` on the tiny recipe with the working directory ``root`` (the recipe's
    ``save_dir: runs`` lands there)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["lit-rag"])
        mp.chdir(root)
        registry.clear_cache()
        try:
            main(["fit", "--config", RECIPE, "--trainer.default_root_dir", str(root), *overrides])
        finally:
            registry.clear_cache()


def scalars(folder: Path) -> dict[str, list[float]]:
    """Every scalar tag in the event files under ``folder``: its steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for file in folder.rglob("events.out.tfevents.*"):
        events = EventAccumulator(str(file))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.step for e in events.Scalars(tag))
    return out


@pytest.fixture(scope="module")
def csv_and_tensorboard(tmp_path_factory) -> Path:
    """One fit with the list form: the recipe's CSVLogger plus a TensorBoardLogger in its own
    folder, rollouts sampled every step, and a validation after the second step."""
    root = tmp_path_factory.mktemp("both")
    fit(
        root,
        "--trainer.logger+=TensorBoardLogger",
        "--trainer.logger.save_dir=runs/tensorboard",
        "--trainer.logger.name=tiny",
        SAMPLES,
        "--trainer.val_check_interval=2",
    )
    return root


def test_tensorboard_override_replaces_the_csv_logger(tmp_path: Path) -> None:
    fit(tmp_path, "--trainer.logger=TensorBoardLogger")
    assert not list(tmp_path.rglob("metrics.csv"))  # replaced, not added
    version = tmp_path / "runs" / "tiny" / "version_0"  # save_dir and name kept from the recipe
    tags = scalars(version)
    for key in ("reward/total", "reward/format", "train/kl", "train/loss"):
        assert tags[key] == [0, 1], (key, sorted(tags))  # max_steps: 2, logged every step
    report = build_report(tmp_path / "runs" / "tiny")  # the report reads the event files
    assert (report.out / "rewards.png").is_file() and (report.out / "kl.png").is_file()
    assert "metrics from TensorBoard event files" in (report.out / "index.html").read_text()


def test_csv_and_tensorboard_together(csv_and_tensorboard: Path) -> None:
    assert (csv_and_tensorboard / "runs" / "tiny" / "version_0" / "metrics.csv").is_file()
    tags = scalars(csv_and_tensorboard / "runs" / "tensorboard" / "tiny" / "version_0")
    assert tags["reward/total"] == [0, 1]


def test_report_on_a_real_run(csv_and_tensorboard: Path, capsys) -> None:
    run = csv_and_tensorboard / "runs" / "tiny"
    main(["report", str(run)])
    printed = capsys.readouterr().out
    out = run / "version_0" / "report"
    # 7 plots (validation and throughput too), the page, and the run-health plot and page
    assert f"wrote 10 files to {out}:" in printed, printed
    page = (out / "index.html").read_text(encoding="utf-8")
    assert (out / "health.html").is_file() and 'href="health.html"' in page
    # RolloutSampleLogger writes after each optimizer step: global_step 1 and 2, 4 rows each
    # (max_per_step 4 = batch 2 x group 2)
    for step in (1, 2):
        assert f'<section id="step-{step}">' in page
    assert page.count('<div class="rollout">') == 8
    assert "<th>format</th>" in page and "<th>relevance</th>" in page  # ARENA's components
    assert '<img src="validation.png"' in page


def test_wandb_offline_writes_its_run_folder(tmp_path: Path, monkeypatch) -> None:
    require_package("wandb", "pip install 'lit-rag[loggers]'")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    try:
        fit(
            tmp_path,
            "--trainer.logger=WandbLogger",
            "--trainer.logger.offline=true",
            "--trainer.logger.project=lit-rag",
        )
    finally:
        wandb.finish()  # what the end of ``lit-rag fit``'s process does: flush and close the run
    runs = list((tmp_path / "runs" / "wandb").glob("offline-run-*"))  # save_dir kept: runs
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    (record,) = runs[0].glob("run-*.wandb")
    # W&B's record log, written by its service process: history keys are stored as plain
    # strings. On a busy machine the service may still be writing when finish() returns.
    deadline = time.monotonic() + 60
    data = record.read_bytes()
    while not (b"reward/total" in data and b"train/kl" in data) and time.monotonic() < deadline:
        time.sleep(0.5)
        data = record.read_bytes()
    assert b"reward/total" in data and b"train/kl" in data, data[:200]
