"""``lit-rag fit`` end to end on the tiny random model: 2 optimizer steps on CPU, metrics.csv.

Uses only the in-code tiny model and synthetic data (no network, no weights); each run takes
seconds. Checks that every step logs its reward components and the loss/KL of the update.
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEP_KEYS = ["reward/total", "reward/format", "train/loss", "train/kl"]


def fit(recipe: str, root: Path) -> list[dict[str, str]]:
    """Run ``lit-rag fit`` and return the rows of the single metrics.csv it writes."""
    main(
        [
            "fit",
            "--config",
            str(RECIPES / recipe),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.logger.init_args.save_dir",
            str(root),
        ]
    )
    files = sorted(root.rglob("metrics.csv"))
    assert len(files) == 1, files
    with files[0].open(newline="") as f:
        return list(csv.DictReader(f))


def step_rows(rows: list[dict[str, str]], keys: list[str]) -> list[dict[str, str]]:
    """Rows logged by training steps (those that carry ``reward/total``), all keys filled."""
    steps = [r for r in rows if r.get("reward/total")]
    for row in steps:
        missing = [k for k in keys if not row.get(k)]
        assert not missing, (missing, row)
        for key in keys:
            float(row[key])  # a number, not a placeholder
    return steps


def test_fit_tiny(tmp_path: Path) -> None:
    rows = fit("tiny.yaml", tmp_path / "run")
    steps = step_rows(rows, STEP_KEYS)
    assert [int(r["step"]) for r in steps] == [0, 1]  # max_steps: 2, log_every_n_steps: 1


def test_fit_tiny_with_third_party_reward(tmp_path: Path) -> None:
    if importlib.util.find_spec("lit_rag_length_penalty") is None:
        message = (
            "lit_rag_length_penalty is not installed "
            "(pip install --no-deps -e plugins/lit-rag-length-penalty)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the example plugin: {message}")
        pytest.skip(message)
    rows = fit("tiny_plugin.yaml", tmp_path / "run")
    steps = step_rows(rows, [*STEP_KEYS, "reward/length"])
    assert [int(r["step"]) for r in steps] == [0, 1]
    # length scores 0 without a complete <answer> pair; "<answer>" and "</answer>" are 3 + 4
    # specific tokens of the tiny tokenizer's 512, which the random model's 8 sampled tokens
    # never spell out (chance about 512^-7), so every step logs exactly 0
    for row in steps:
        assert float(row["reward/length"]) == 0.0


def test_fit_tiny_search_agent(tmp_path: Path) -> None:
    """The multi-turn environment through Lightning: index built by the CLI, 2 GRPO steps,
    episode statistics logged for training and validation."""
    main(
        [
            "index",
            "build",
            "--corpus",
            "synthetic",
            "--retriever",
            "bm25",
            "--out",
            "indexes/synthetic-bm25",
        ]
    )
    rows = fit("tiny_search_agent.yaml", tmp_path / "run")
    keys = [
        "reward/total",
        "reward/outcome",
        "reward/evaluation",
        "train/loss",
        "rollout/turns",
        "rollout/invalid_actions",
        "rollout/response_length",
    ]
    steps = step_rows(rows, keys)
    assert len(steps) == 2
    # a random model never writes a complete action: every turn is invalid, up to max_turns
    assert all(float(r["rollout/turns"]) == 2.0 for r in steps)
    assert any(r.get("val/valid_searches") for r in rows)


def test_fit_search_agent_without_index_is_one_clear_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                "--config",
                str(RECIPES / "tiny_search_agent.yaml"),
                "--trainer.default_root_dir",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lit-rag: error:") and "indexes/synthetic-bm25" in err[-1]


def test_fit_tiny_tool_agent(tmp_path: Path) -> None:
    """The tool agent through Lightning: every episode's first turn carries a search call (the
    recipe's assistant_prefix), the tool turn runs, and the trained tokens are the sampled ones."""
    rows = fit("tiny_tool_agent.yaml", tmp_path / "run")
    keys = ["reward/total", "train/loss", "rollout/tool_calls", "rollout/turns"]
    steps = step_rows(rows, [*keys, "rollout/template_mismatch", "rollout/tool_errors/malformed"])
    assert len(steps) == 2
    for row in steps:
        assert float(row["rollout/tool_calls"]) >= 1 and float(row["rollout/turns"]) == 2.0
        assert float(row["rollout/token_mismatch"]) == 0.0
    assert any(r.get("val/tool_calls") for r in rows)


def test_fit_tiny_on_a_verifiers_environment(tmp_path: Path, monkeypatch) -> None:
    """An environment built with verifiers' own API (tests/fixtures/vf_corpus_env) trains
    through ``lit-rag fit``: its tasks as the data (validation held out after the training
    tasks), its tool in the chat template, its rubric as the reward."""
    from helpers import require_package

    require_package("verifiers", "pip install 'lit-rag[verifiers]'")
    monkeypatch.syspath_prepend(
        str(Path(__file__).resolve().parents[1] / "fixtures" / "vf_corpus_env")
    )
    recipe = tmp_path / "vf.yaml"
    recipe.write_text(
        (RECIPES / "tiny_tool_agent.yaml").read_text().split("model:")[0]
        + """model:
  policy:
    tiny: {hidden_size: 32, num_layers: 2, num_heads: 2}
  environment:
    class_path: verifiers
    init_args:
      environment: vf-corpus-env
      chat_template: hermes
      max_turns: 2
      max_response_tokens: 160
  reward:
    class_path: verifiers_rubric
  algorithm: {class_path: grpo, init_args: {beta: 0.001}}
  group_size: 2
  micro_batch_size: 4
  sampling: {max_new_tokens: 8, temperature: 1.0}
data:
  train: verifiers:vf-corpus-env
  val: verifiers:vf-corpus-env
  num_train: 6
  num_val: 2
  batch_size: 2
"""
    )
    main(
        [
            "fit", "--config", str(recipe), "--trainer.default_root_dir", str(tmp_path / "run"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    (metrics,) = sorted((tmp_path / "run").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics.open(newline="")))
    steps = step_rows(rows, ["reward/total", "reward/exact_match", "train/loss", "rollout/turns"])
    assert len(steps) == 2
    assert any(r.get("val/reward/total") for r in rows)


def test_a_tool_server_down_for_every_episode_stops_the_run_in_one_line(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Episodes a dead server failed leave the loss; when that is every episode for three steps
    in a row (and ``environment_outage_s``, 0 here) nothing trains, and the run stops with one
    line instead of running on."""
    (tmp_path / "dead_tool.py").write_text(
        "from lit_rag.api import ServerDied\n\n\n"
        "def down(query: str) -> str:\n"
        '    """A tool whose server is gone.\n\n    Args:\n        query: Anything.\n    """\n'
        '    raise ServerDied("connection refused")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    prefix = '<tool_call>{"name": "down", "arguments": {"query": "born"}}</tool_call>'
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                "--config",
                str(RECIPES / "tiny_tool_agent.yaml"),
                "--model.environment.init_args.tools=[answer, dead_tool.down]",
                f"--model.environment.init_args.assistant_prefix={prefix}",
                "--trainer.max_steps=5",
                "--model.environment_outage_s=0",
                "--trainer.default_root_dir",
                str(tmp_path / "run"),
                "--trainer.logger.init_args.save_dir",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lit-rag: error: model: the environment failed every episode")
    assert "connection refused" in err[-1] and "last 3 steps" in err[-1]
