"""Tool episodes on the real tokenizers and chat templates of Qwen2.5, Qwen3 (thinking and not),
Llama 3.1 and Mistral NeMo (tests/real_tokenizers.py): the trained tokens are the sampled ones,
every tool turn lines up with a re-rendering of the conversation (``template_mismatch`` 0), the
separator after each turn's end token is the template's, and a template that rewrites earlier
turns is found at start and replaced by its family's training template."""

from __future__ import annotations

import json

import pytest
from kit import CORPUS, TurnScript
from real_tokenizers import tokenizer

from lit_rag.errors import InputError
from lit_rag.plugins.environments.tool_agent import ToolAgentEnvironment, turn_text
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.rollout.base import SamplingParams
from lit_rag.tools import ServerDied
from lit_rag.types import Example

EX = Example(id="q1", question="Where was Mira Tolvan born?", answers=["Kessa"])

#: family -> (chat_template_kwargs, end-of-turn token, template turn end after it)
FAMILY = {
    "qwen2.5": ({}, "<|im_end|>", "\n"),
    "qwen3": ({}, "<|im_end|>", "\n"),
    "qwen3-no-thinking": ({"enable_thinking": False}, "<|im_end|>", "\n"),
    "llama3.1": ({}, "<|eot_id|>", ""),
    "mistral": ({}, "</s>", ""),
}


def calls(family: str, *pairs: tuple[str, dict]) -> str:
    """Calls as the family's model writes them (one turn)."""
    if family.startswith("qwen"):
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
            for n, a in pairs
        )
    if family == "llama3.1":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in pairs)
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in pairs])


def think(family: str, text: str) -> str:
    """Reasoning as Qwen3 writes it in thinking mode (one newline before the answer, where
    Qwen3's own template writes two); nothing for the other families."""
    return f"<think>\n{text}\n</think>\n" if family == "qwen3" else ""


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def run(family, retriever, turns, max_new_tokens=400, **settings):
    kwargs, end, _ = FAMILY[family]
    tok = tokenizer(family.removesuffix("-no-thinking"))
    env = ToolAgentEnvironment(
        retriever=retriever,
        chat_template_kwargs=kwargs or None,
        tools=["search", "answer", *settings.pop("extra_tools", [])],
        **settings,
    )
    engine = TurnScript(tok, [[text + end] if isinstance(text, str) else text for text in turns])
    try:
        (t,) = env.rollout([EX], engine, 1, SamplingParams(max_new_tokens=max_new_tokens))
    finally:
        env.close()
    return t, tok, env


def assert_lines_up(t, tok, env, family):
    """The ids trained are the conversation's rendering, tokenized, up to the last sampled
    token; what the rendering writes after it is the template's turn end."""
    _, _, after = FAMILY[family]
    assert t.token_mismatch == 0 and t.contract.template_mismatch == 0, t.meta
    ours = (t.prompt_ids.tolist()) + t.completion_ids.tolist()
    full = env.render(tok, t.meta["messages"], add_generation_prompt=False)
    rendered = tok(full, add_special_tokens=False)["input_ids"]
    assert rendered[: len(ours)] == ours
    assert tok.decode(rendered[len(ours) :], skip_special_tokens=False) == after


@pytest.mark.parametrize("family", list(FAMILY))
def test_several_calls_errors_and_an_answer_line_up_with_the_template(family, retriever):
    search = ("search", {"query": "Mira Tolvan born"})
    turns = [
        think(family, "Two searches.") + calls(family, search, ("search", {"query": "Kessa"})),
        think(family, "A bad call.") + calls(family, ("search", {"q": 1}), ("nope", {})),
        think(family, "Done.") + calls(family, ("answer", {"answer": "Kessa"})),
    ]
    t, tok, env = run(family, retriever, turns)
    episode = t.contract
    assert episode.stop_reason == "answer" and episode.answer == "Kessa", episode
    assert episode.calls == {"search": 2, "answer": 1}
    assert episode.errors == {"bad_arguments": 1, "unknown_tool": 1}
    assert_lines_up(t, tok, env, family)
    inserted = [p.text for p in t.pieces if p.inserted]
    if family.startswith("qwen"):  # the newline after <|im_end|> is the separator
        assert all(text.startswith("\n<|im_start|>user\n<tool_response>") for text in inserted)
    elif family == "llama3.1":
        assert all(text.startswith("<|start_header_id|>ipython") for text in inserted)
    else:
        assert all(text.startswith("[TOOL_RESULTS]") for text in inserted)


@pytest.mark.parametrize("family", ["qwen3", "qwen3-no-thinking", "llama3.1", "mistral"])
def test_the_models_own_template_is_replaced_by_its_training_template(family, retriever, capfd):
    """These four rewrite earlier turns as they ship; the agent finds it at start, says so in
    one line and trains with the family's training template."""
    env = ToolAgentEnvironment(retriever=retriever, chat_template_kwargs=FAMILY[family][0] or None)
    tok = tokenizer(family.removesuffix("-no-thinking"))
    choice = env.template(tok)
    assert choice.template is not None and choice.note
    assert "rewrites earlier turns" in capfd.readouterr().err
    own = ToolAgentEnvironment(tools=["answer"], chat_template="own")
    assert own.template(tok).template is None
    preserving = ToolAgentEnvironment(tools=["answer"]).template(tokenizer("qwen2.5"))
    assert preserving.template is None and not preserving.note  # Qwen2.5's preserves them


def test_qwen3_without_thinking_on_its_own_template_is_a_mismatch_with_the_separator_kept(
    retriever,
):
    """``chat_template: own`` keeps Qwen3's template, which drops the empty think block of
    earlier turns: every tool turn is counted, and the inserted text still starts with the
    newline after ``<|im_end|>``."""
    turns = [
        calls("qwen3", ("search", {"query": "Mira Tolvan"})),
        calls("qwen3", ("search", {"query": "Kessa"})),
        calls("qwen3", ("answer", {"answer": "Kessa"})),
    ]
    t, _, _ = run("qwen3-no-thinking", retriever, turns, chat_template="own")
    assert t.contract.template_mismatch == 2  # each tool turn, counted on its own tokens
    assert [m["turn"] for m in t.meta["template_mismatches"]] == [1, 2]
    inserted = [p.text for p in t.pieces if p.inserted]
    assert all(text.startswith("\n<|im_start|>user\n<tool_response>") for text in inserted)


def test_calls_inside_reasoning_are_not_run_and_the_answer_leaves_the_reasoning_out(retriever):
    inner = calls("qwen3", ("search", {"query": "Kessa"}))
    turns = [f"<think>\nMaybe {inner}? No, I know it.\n</think>\n\nKessa"]
    t, tok, env = run("qwen3", retriever, turns)
    assert t.contract.calls == {} and t.contract.stop_reason == "message"
    assert t.contract.answer == "Kessa"


@pytest.mark.parametrize("family", ["qwen3", "llama3.1", "mistral"])
def test_a_turn_cut_by_its_segment_budget_is_truncated(family, retriever):
    long = think(family, "word " * 50) + calls(family, ("search", {"query": "Kessa " * 20}))
    t, _, _ = run(family, retriever, [long], max_new_tokens=20)
    assert t.truncated and t.contract.stop_reason == "max_response_tokens"
    assert t.completion_ids.numel() == 20


def test_mistral_calls_get_nine_character_ids_its_template_takes(retriever):
    turns = [
        calls("mistral", ("search", {"query": "Mira"}), ("search", {"query": "Kessa"})),
        calls("mistral", ("answer", {"answer": "Kessa"})),
    ]
    t, _, _ = run("mistral", retriever, turns)
    ids = [m["tool_call_id"] for m in t.meta["messages"] if m["role"] == "tool"]
    assert ids == ["call00000", "call00001"]


def test_a_tool_that_times_out_fails_the_episode_for_the_environment(retriever):
    import time

    from lit_rag.tools import FunctionTool

    def lookup(query: str) -> str:
        """Look a query up.

        Args:
            query: What to look up.
        """
        time.sleep(2)
        return "late"

    env = ToolAgentEnvironment(retriever=retriever, tools=["answer"])
    env.toolbox.add([FunctionTool(lookup, timeout_s=0.2)])
    turns = [
        calls("qwen2.5", ("lookup", {"query": "Kessa"})) + "<|im_end|>",
        calls("qwen2.5", ("answer", {"answer": "Kessa"})) + "<|im_end|>",
    ]
    engine = TurnScript(tokenizer("qwen2.5"), [[x] for x in turns])
    try:
        (t,) = env.rollout([EX], engine, 1, SamplingParams(max_new_tokens=200))
    finally:
        env.close()
    assert t.contract.errors == {"timeout": 1} and t.contract.answer == "Kessa"
    assert "timed out" in t.failed and t.contract.failed == t.failed


def test_a_dead_server_fails_the_episode_for_the_environment(retriever):
    from lit_rag.tools import FunctionTool

    def down(query: str) -> str:
        """A tool whose server is gone.

        Args:
            query: Anything.
        """
        raise ServerDied("connection refused")

    env = ToolAgentEnvironment(retriever=retriever, tools=["answer"])
    env.toolbox.add([FunctionTool(down)])
    engine = TurnScript(
        tokenizer("qwen2.5"), [[calls("qwen2.5", ("down", {"query": "x"})) + "<|im_end|>"]]
    )
    try:
        (t,) = env.rollout([EX], engine, 1, SamplingParams(max_new_tokens=200))
    finally:
        env.close()
    assert t.contract.stop_reason == "server_died" and "connection refused" in t.failed


def test_a_template_that_cannot_be_made_to_preserve_prefixes_is_refused_in_one_line(retriever):
    tok = tokenizer("qwen2.5")
    env = ToolAgentEnvironment(retriever=retriever)
    rewriting = (
        "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}\n{%- endfor %}"
        "{%- if add_generation_prompt %}assistant: {%- endif %}"
    )
    import copy

    own = copy.copy(tok)
    own.chat_template = rewriting
    with pytest.raises(InputError, match="rewrites earlier turns") as info:
        env.template(own)
    assert "\n" not in str(info.value)


def test_turn_text_keeps_control_tokens_and_drops_the_end():
    tok = tokenizer("mistral")
    ids = tok("[TOOL_CALLS][]</s>", add_special_tokens=False)["input_ids"]
    assert turn_text(tok, ids) == "[TOOL_CALLS][]"


def test_sampled_ids_that_are_not_the_tokenizers_encoding_are_counted_apart(retriever):
    """A turn whose sampled ids spell the rendering's text in other tokens is retokenized, not
    a template mismatch: the template is right, the sampler chose a non-canonical encoding."""
    tok = tokenizer("qwen2.5")
    call = calls("qwen2.5", ("search", {"query": "Mira Tolvan"}))
    at = call.index("Mira")  # "Mira" sampled one character at a time
    pieces = [call[:at], *"Mira", call[at + 4 :], "<|im_end|>"]
    ids = [i for piece in pieces for i in tok(piece, add_special_tokens=False)["input_ids"]]
    assert ids != tok(call + "<|im_end|>", add_special_tokens=False)["input_ids"]
    answer = calls("qwen2.5", ("answer", {"answer": "Kessa"})) + "<|im_end|>"
    t, _, _ = run("qwen2.5", retriever, [[ids], answer])
    assert t.contract.template_mismatch == 0 and t.contract.retokenized == 1
    assert t.meta["template_mismatches"][0]["kind"] == "tokens"
