"""The tool_agent environment driven by a scripted policy: token-exact tool turns, the
re-rendering check, failures as messages and counts, budgets, answers for the rewards."""

from __future__ import annotations

import threading
import time

import pytest
from kit import CORPUS, TurnScript, tool_call, trajectory

from lit_rag import registry
from lit_rag.errors import InputError
from lit_rag.models.tiny import build_tiny_tokenizer
from lit_rag.plugins.environments.tool_agent import ToolAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.qa import ExactMatchReward
from lit_rag.rollout.base import SamplingParams
from lit_rag.tools import ServerDied
from lit_rag.types import Example

EX = Example(id="q1", question="Where was Mira Tolvan born?", answers=["Kessa"])
EX2 = Example(id="q2", question="Which region is Kessa in?", answers=["Dorvale"])
END = "<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def rollout(env, tok, turns, examples=(EX,), group_size=1, max_new_tokens=400):
    engine = TurnScript(tok, turns)
    try:
        out = env.rollout(
            list(examples), engine, group_size, SamplingParams(max_new_tokens=max_new_tokens)
        )
    finally:
        env.close()
    assert not engine.turns, "scripted turns left unused"
    return out, engine


def runs(trajectory, tok):
    """(mask, text) runs of the completion."""
    ids, mask = trajectory.completion_ids.tolist(), trajectory.loss_mask.tolist()
    found, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            found.append((mask[start], tok.decode(ids[start:i])))
            start = i
    return found


def test_a_search_then_answer_episode_is_token_exact_and_matches_a_full_rendering(tok, retriever):
    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes")
    first = "I will search." + tool_call("search", query="Mira Tolvan born") + END
    (t,), engine = rollout(env, tok, [[first], [tool_call("answer", answer="Kessa") + END]])
    episode = t.contract
    assert episode.stop_reason == "answer" and episode.answer == "Kessa" and episode.turns == 2
    assert episode.calls == {"search": 1, "answer": 1} and episode.errors == {}
    # trained tokens are exactly the sampled ones; the tool turn is masked and ends with the
    # next assistant header
    assert t.token_mismatch == 0 and episode.template_mismatch == 0
    (m1, a1), (m2, tool), (m3, a2) = runs(t, tok)
    assert (m1, m2, m3) == (1, 0, 1) and a1 == first and a2.startswith("<tool_call>")
    assert tool.startswith("\n<|im_start|>user\n<tool_response>\nDoc 1(Title: Mira Tolvan)")
    assert tool.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # the engine continued the ids as they are, and they are what the template writes
    messages = t.meta["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    whole = env.render(tok, messages[:-1], add_generation_prompt=True)
    assert engine.prompts[1][0] == tok(whole, add_special_tokens=False)["input_ids"]
    assert t.prompt_ids.tolist() + t.completion_ids.tolist()[: -len(engine.prompts[1][0]) or None]
    assert "search" in t.prompt_text and '"name": "answer"' in t.prompt_text  # tools' schemas
    assert ExactMatchReward()([t]).total.tolist() == [1.0]
    assert env.extract_answer(t) == "Kessa"


def test_a_non_canonical_sample_is_trained_as_sampled_and_counted_as_retokenized(tok, retriever):
    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes")
    text = "founded." + tool_call("search", query="Kessa")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # "founded." sampled one character at a time: the same text, other ids than a re-encoding
    split = [i for ch in "founded." for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert split != tok("founded.", add_special_tokens=False)["input_ids"]
    sampled = (
        split
        + ids[len(tok("founded.", add_special_tokens=False)["input_ids"]) :]
        + [tok.eos_token_id]
    )
    (t,), _ = rollout(env, tok, [[sampled], ["Kessa." + END]])
    assert t.token_mismatch == 0  # the trained tokens are the sampled ones
    assert t.completion_ids.tolist()[: len(sampled)] == sampled
    assert t.contract.retokenized == 1 and t.contract.template_mismatch == 0
    (where,) = t.meta["template_mismatches"]
    assert where["turn"] == 1 and "f" in where["trained"] and where["kind"] == "tokens"
    assert env.metrics([t])["retokenized"] > 0 and env.metrics([t])["template_mismatch"] == 0
    assert t.contract.stop_reason == "message" and t.contract.answer == "Kessa."


def test_failed_calls_become_messages_and_counts_and_budgets_hold(tok, retriever):
    env = ToolAgentEnvironment(
        retriever=retriever, tools=["search", "fetch", "answer"], chat_template="hermes",
        max_calls=5, max_result_tokens=16,
    )  # fmt: skip
    first = (
        tool_call("fetch", id="p404") + tool_call("search", q="x") + "<tool_call>{oops</tool_call>"
        + tool_call("lookup", x=1) + END
    )  # fmt: skip
    second = tool_call("search", query="Kessa") + tool_call("fetch", id="p3") + END
    (t,), _ = rollout(env, tok, [[first], [second], ["Dorvale" + END]], examples=(EX2,))
    episode = t.contract
    # only fetch p404 reached its tool (tool_error); then the fifth call written ran and the
    # sixth is over the budget of 5
    assert episode.errors == {
        "tool_error": 1, "bad_arguments": 1, "malformed": 1, "unknown_tool": 1, "budget": 1,
    }  # fmt: skip
    assert episode.calls == {"fetch": 1, "search": 1}
    tool_turns = [text for mask, text in runs(t, tok) if mask == 0]
    assert (
        "no passage has id 'p404'" in tool_turns[0] and "unexpected argument 'q'" in tool_turns[0]
    )
    assert "unknown tool 'lookup'" in tool_turns[0] and "malformed tool call" in tool_turns[0]
    assert "budget (5 per episode) is spent" in tool_turns[1] and " ..." in tool_turns[1]
    assert episode.answer == "Dorvale" and ExactMatchReward()([t]).total.tolist() == [1.0]
    metrics = env.metrics([t])
    assert metrics["tool_errors/budget"] == 1 and metrics["tool_errors/timeout"] == 0


def test_the_turn_and_response_budgets_end_episodes(tok, retriever):
    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes", max_turns=1)
    (t,), _ = rollout(env, tok, [[tool_call("search", query="Kessa") + END]])
    assert t.contract.stop_reason == "max_turns" and t.contract.answer is None
    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes", max_response_tokens=40)
    (t,), _ = rollout(env, tok, [["word " * 60 + END]])
    assert t.truncated and t.contract.stop_reason == "max_response_tokens"
    assert t.completion_ids.numel() <= 40


def test_calls_of_different_episodes_run_together(tok, retriever):
    started: list[float] = []
    lock = threading.Lock()

    def wait(key: str) -> str:
        """Wait.

        Args:
            key: A key.
        """
        with lock:
            started.append(time.perf_counter())
        time.sleep(0.3)
        return key

    registry.register("tool", "wait", wait)
    try:
        env = ToolAgentEnvironment(tools=["wait", "answer"], chat_template="hermes")
        turns = [[tool_call("wait", key=str(i)) + END for i in range(4)], ["x" + END] * 4]
        trajectories, _ = rollout(env, tok, turns, examples=(EX, EX2), group_size=2)
    finally:
        registry.unregister("tool", "wait")
    assert len(trajectories) == 4 and max(started) - min(started) < 0.25
    assert all(t.contract.calls == {"wait": 1} for t in trajectories)


def test_a_dead_tool_server_fails_the_episode_or_stops_the_run(tok, retriever, capsys):
    def remote(query: str) -> str:
        """A remote search.

        Args:
            query: The query.
        """
        raise ServerDied("the server at stdio:corpus exited")

    registry.register("tool", "remote", remote)
    try:
        env = ToolAgentEnvironment(tools=["remote", "answer"], chat_template="hermes")
        (t,), _ = rollout(env, tok, [[tool_call("remote", query="x") + END]])
        assert t.contract.stop_reason == "server_died" and t.contract.answer is None
        assert "exited" in t.contract.failed and env.metrics([t])["failed"] == 1
        (line,) = capsys.readouterr().err.strip().splitlines()  # one line, once
        assert "exited" in line and "the episodes that call remote fail" in line
        assert ExactMatchReward()([t]).total.tolist() == [0.0]
        env = ToolAgentEnvironment(
            tools=["remote", "answer"], chat_template="hermes", on_server_death="stop"
        )
        with pytest.raises(InputError, match="exited.*on_server_death: stop"):
            rollout(env, tok, [[tool_call("remote", query="x") + END]])
    finally:
        registry.unregister("tool", "remote")


def test_llama3_calls_through_the_llama3_template(tok, retriever):
    env = ToolAgentEnvironment(retriever=retriever, chat_template="llama3", parser="llama3")
    # a Llama model ends its turn with <|eot_id|>, which the template writes: the tiny
    # tokenizer's samples stop without an end token, and the template's follows (masked)
    first = '{"name": "search", "parameters": {"query": "Mira Tolvan"}}'
    (t,), _ = rollout(
        env, tok, [[first], ['{"name": "answer", "parameters": {"answer": "Kessa"}}']]
    )
    assert t.contract.answer == "Kessa" and t.contract.calls == {"search": 1, "answer": 1}
    tool = [text for mask, text in runs(t, tok) if mask == 0][0]
    assert tool.startswith("<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\nDoc 1")
    assert t.contract.template_mismatch == 0


def test_bad_settings_are_one_line_each(tok):
    with pytest.raises(
        ValueError, match="on_server_death: got 'ignore'; allowed: fail_episode, stop"
    ):
        ToolAgentEnvironment(on_server_death="ignore")
    with pytest.raises(ValueError, match="chat_template: got 'chatml'"):
        ToolAgentEnvironment(chat_template="chatml")
    with pytest.raises(ValueError, match="max_calls must be >= 1"):
        ToolAgentEnvironment(max_calls=0)
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    with pytest.raises(InputError, match="needs a chat template"):
        ToolAgentEnvironment(tools=["answer"]).build_prompt(EX, plain)


def test_an_assistant_prefix_starts_the_first_call_and_stays_out_of_training(tok, retriever):
    prefix = '<tool_call>{"name": "search", "arguments": {"query": "'
    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes", assistant_prefix=prefix)
    first = 'Mira Tolvan"}}</tool_call>' + END
    (t,), _ = rollout(env, tok, [[first], [tool_call("answer", answer="Kessa") + END]])
    assert t.prompt_text.endswith("<|im_start|>assistant\n" + prefix)
    assert t.contract.calls == {"search": 1, "answer": 1} and t.contract.template_mismatch == 0
    assert t.meta["messages"][2]["content"] == prefix + 'Mira Tolvan"}}</tool_call>'
    assert runs(t, tok)[0] == (1, first)


@pytest.mark.parametrize("template", ["qwen2_5", "qwen3"])
def test_the_models_own_templates_render_the_tool_turns(retriever, template):
    """Qwen2.5's and Qwen3's templates as they ship (tests/fixtures/chat_templates) render the
    tools and the tool turns themselves, and the turns line up with a full re-rendering (Qwen3
    keeps the reasoning of the turns after the last user message, so tool turns keep it)."""
    from pathlib import Path

    tok = build_tiny_tokenizer()
    path = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates" / f"{template}.jinja"
    tok.chat_template = path.read_text(encoding="utf-8")
    env = ToolAgentEnvironment(retriever=retriever)  # chat_template: the tokenizer's own
    think = "<think>\nFind the town.\n</think>\n\n" if template == "qwen3" else ""
    first = think + tool_call("search", query="Mira Tolvan") + END
    (t,), _ = rollout(env, tok, [[first], [tool_call("answer", answer="Kessa") + END]])
    assert t.token_mismatch == 0 and t.contract.answer == "Kessa"
    assert '"name": "search"' in t.prompt_text and "<tools>" in t.prompt_text
    tool = [text for mask, text in runs(t, tok) if mask == 0][0]
    assert "<tool_response>\nDoc 1(Title: Mira Tolvan)" in tool
    assert t.contract.template_mismatch == 0
    assert t.meta["messages"][2]["content"].startswith(think)


def test_the_tool_format_reward_pays_well_formed_calls_and_a_tool_answer(tok, retriever):
    from lit_rag.plugins.rewards.tool_format import ToolFormatReward

    env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes")
    good = [tool_call("search", query="Kessa") + END, tool_call("answer", answer="Dorvale") + END]
    bad = [
        "<tool_call>{oops</tool_call>" + tool_call("search", query="Kessa") + END,
        "Dorvale" + END,
    ]
    trajectories, _ = rollout(
        env, tok, [[good[0], bad[0]], [good[1], bad[1]]], examples=(EX2,), group_size=2
    )
    rewards = ToolFormatReward()(trajectories)
    assert rewards.components["calls_ok"].tolist() == [1.0, 0.0]
    assert rewards.components["answered"].tolist() == [1.0, 0.0]
    assert rewards.total.tolist() == [1.0, 0.0]
    with pytest.raises(InputError, match="reward tool_format needs ToolEpisode"):
        ToolFormatReward()([trajectory()])
