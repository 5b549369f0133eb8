"""A verifiers environment built with verifiers' own API (tests/fixtures/vf_corpus_env, loaded
through ``vf.load_environment`` as an installed package would be: its folder on ``sys.path``)
as lit-rag's data, tools and reward: the verifiers environment driven by a scripted policy,
and the verifiers_rubric reward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import require_package
from kit import TurnScript, tool_call

require_package("verifiers", "pip install 'lit-rag[verifiers]'")

from lit_rag.errors import InputError  # noqa: E402
from lit_rag.integrations.verifiers import (  # noqa: E402
    VerifiersEnv,
    conversation,
    load_examples,
)
from lit_rag.models.tiny import build_tiny_tokenizer  # noqa: E402
from lit_rag.plugins.environments.verifiers_env import VerifiersEnvironment  # noqa: E402
from lit_rag.plugins.rewards.verifiers_rubric import VerifiersRubricReward  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.tools.parsers import hermes  # noqa: E402
from lit_rag.types import Trajectory  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vf_corpus_env"
ENV = "vf-corpus-env"
END = "<|im_end|>"


@pytest.fixture(scope="module", autouse=True)
def installed():
    """The fixture environment importable as an installed one (its folder on sys.path)."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(FIXTURE))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def examples():
    return load_examples(f"verifiers:{ENV}")


def rollout(env, tok, turns, examples, group_size=1):
    engine = TurnScript(tok, turns)
    try:
        out = env.rollout(list(examples), engine, group_size, SamplingParams(max_new_tokens=400))
    finally:
        env.close()
    assert not engine.turns, "scripted turns left unused"
    return out, engine


def test_the_tasks_are_examples_with_their_own_prompt_messages(examples):
    assert len(examples) == 8 and len({e.id for e in examples}) == 8
    first = examples[0]
    assert first.id == "syn-0-0" and first.answers and first.question.startswith("In which")
    system, user = first.meta["verifiers_messages"]
    assert system["role"] == "system" and "search tool" in system["content"]
    assert user == {"role": "user", "content": first.question}
    assert first.meta["verifiers_env"] == ENV and first.meta["verifiers_task"]["answer"]
    # num_tasks is the taskset config's field; a limit takes the first ones
    assert [e.id for e in load_examples(f"verifiers:{ENV}", env_args={"num_tasks": 3})] == [
        e.id for e in examples[:3]
    ]
    assert len(VerifiersEnvironment(ENV).examples(limit=2)) == 2


def test_a_missing_environment_or_a_bad_source_is_one_line():
    with pytest.raises(InputError, match="does not load"):
        VerifiersEnv("vf-no-such-env-here")
    with pytest.raises(InputError, match="verifiers:<env-id>"):
        load_examples("verifiers:")


def test_the_toolsets_tools_have_their_mcp_schemas_and_run():
    env = VerifiersEnvironment(ENV, chat_template="hermes")
    try:
        (schema,) = env.toolbox.schemas()
        function = schema["function"]
        assert function["name"] == "search"  # TOOL_PREFIX = None: advertised bare
        assert function["description"].startswith("Search the corpus")
        assert function["parameters"]["required"] == ["query"]
        assert function["parameters"]["properties"]["k"]["default"] == 3
        from lit_rag.tools import ToolCall

        ok, bad = env.toolbox.call_all(
            [ToolCall("search", {"query": "Zarim Foundry headquarters"}), ToolCall("search", {})]
        )
        assert not ok.error and "Zarim Foundry has its headquarters" in ok.text
        assert bad.error == "bad_arguments"
    finally:
        env.close()


def test_a_scripted_episode_searches_answers_and_the_rubric_scores_it(tok, examples):
    env = VerifiersEnvironment(ENV, chat_template="hermes")
    ex = examples[0]
    answer = ex.answers[0]
    right = [
        ["Let me look." + tool_call("search", query="Zarim Foundry headquarters") + END],
        [answer + END],
    ]
    (t,), engine = rollout(env, tok, right, [ex])
    episode = t.contract
    assert episode.stop_reason == "message" and episode.answer == answer
    assert episode.calls == {"search": 1} and episode.errors == {}
    assert t.token_mismatch == 0 and episode.template_mismatch == 0
    # the prompt is the task's own system prompt and question, the tool's schema rendered
    assert "search tool" in t.prompt_text and ex.question in t.prompt_text
    assert '"name": "search"' in t.prompt_text
    assert "Zarim Foundry has its headquarters" in tok.decode(engine.prompts[1][0])
    # the conversation as verifiers sees it: structured calls, the result tied to its call
    conv = t.meta["verifiers_conversation"]
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv[2]["tool_calls"][0]["function"]["name"] == "search"
    assert conv[3]["tool_call_id"] == conv[2]["tool_calls"][0]["id"]
    assert env.extract_answer(t) == answer

    (w,), _ = rollout(env, tok, [["Nowhere." + END]], [ex])
    reward = VerifiersRubricReward()
    out = reward([t, w])
    assert out.total.tolist() == [1.0, 0.0]
    assert out.components["exact_match"].tolist() == [1.0, 0.0]
    assert reward.weights == {"exact_match": 1.0} and not reward.failures


def test_the_rubric_scores_a_group_and_weights_as_told(tok, examples):
    env = VerifiersEnvironment(ENV, chat_template="hermes")
    a, b = examples[:2]
    turns = [[a.answers[0] + END, "wrong" + END, "x" + END, b.answers[0] + END]]
    trajectories, _ = rollout(env, tok, turns, [a, b], group_size=2)
    out = VerifiersRubricReward(weights={"exact_match": 0.5})(trajectories)
    assert out.total.tolist() == [0.5, 0.0, 0.0, 0.5]
    assert out.components["exact_match"].tolist() == [1.0, 0.0, 0.0, 1.0]


def _trajectory(example, messages) -> Trajectory:
    return Trajectory(
        example=example,
        group=0,
        prompt_ids=torch.tensor([1]),
        completion_ids=torch.tensor([2]),
        loss_mask=torch.ones(1),
        sampling_logprobs=torch.zeros(1),
        text="",
        meta={"messages": messages},
    )


def test_a_reward_function_that_raises_scores_0_and_is_counted(examples, capsys, monkeypatch):
    ex = examples[0]
    first = ex.meta["verifiers_messages"]
    good = _trajectory(ex, [*first, {"role": "assistant", "content": ex.answers[0]}])
    reward = VerifiersRubricReward()
    vf_env = VerifiersEnv.load(ENV, ex.meta["verifiers_env_args"])
    task = vf_env.task_for(ex)

    def broken(self, task, trace):
        raise RuntimeError("model text it could not read")

    broken.__name__ = "exact_match"  # verifiers names a reward by its function's name
    broken.reward, broken.reward_priority, broken._vf_weight = True, 0, 1.0
    monkeypatch.setattr(type(task), "exact_match", broken)
    out = reward([good, good])
    assert out.total.tolist() == [0.0, 0.0]
    assert reward.failures == {"exact_match": 2}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exact_match x2" in err[0] and "RuntimeError" in err[0]


def test_a_trajectory_without_the_environment_meta_is_scored_from_its_messages(examples):
    """The rubric reads a tool agent's raw messages (hermes calls) when the structured
    conversation is missing, and an example rebuilt from its data (another process)."""
    ex = examples[1]
    messages = [
        *ex.meta["verifiers_messages"],
        {"role": "assistant", "content": tool_call("search", query="x")},
        {"role": "tool", "name": "search", "content": "r"},
        {"role": "assistant", "content": f"  {ex.answers[0].upper()}. "},
    ]
    conv = conversation(messages, hermes)
    assert conv[3]["tool_call_id"] == conv[2]["tool_calls"][0]["id"]
    env = VerifiersEnv.load(ENV, ex.meta["verifiers_env_args"])
    env._tasks.clear()  # as in a process that did not load the tasks
    out = VerifiersRubricReward(environment=ENV)([_trajectory(ex, messages)])
    assert out.total.tolist() == [1.0]
