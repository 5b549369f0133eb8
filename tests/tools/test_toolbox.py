"""Tools and the ToolBox: schemas from functions, checked / limited / cached / timed calls that
never raise, and the call parsers on untrusted text."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from lit_rag import registry
from lit_rag.tools import (
    ERRORS,
    FunctionTool,
    ServerDied,
    ToolBox,
    ToolCall,
    ToolError,
    ToolResult,
    build_tools,
    hermes,
    llama3,
    parser,
)


def lookup(city: str, year: int = 2020) -> dict:
    """Population of a city.

    Args:
        city: The city's name.
        year: The census year.
    """
    return {"city": city, "year": year, "population": len(city) * 1000}


async def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "done"


def broken(what: str) -> str:
    """Fail.

    Args:
        what: Which failure.
    """
    if what == "tool":
        raise ToolError("no such page")
    if what == "server":
        raise ServerDied("connection closed")
    raise KeyError(what)


def test_a_documented_function_is_a_tool_with_transformers_schema():
    tool = FunctionTool(lookup)
    schema = tool.schema()["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Population of a city."
    assert schema["parameters"]["required"] == ["city"]
    assert schema["parameters"]["properties"]["year"]["type"] == "integer"
    with pytest.raises(Exception, match="docstring|description"):
        FunctionTool(lambda x: x)  # no types, no docstring: transformers refuses it


def test_calls_are_checked_and_every_failure_is_a_result_never_an_exception():
    box = ToolBox([FunctionTool(lookup), FunctionTool(broken), FunctionTool(slow, timeout_s=0.2)])
    try:
        results = box.call_all(
            [
                ToolCall("lookup", {"city": "Kessa"}),
                ToolCall("lookup", {"city": 3}),
                ToolCall("lookup", {"town": "Kessa"}),
                ToolCall("nowhere", {}),
                ToolCall("broken", {"what": "tool"}),
                ToolCall("broken", {"what": "other"}),
                ToolCall("broken", {"what": "server"}),
                ToolCall("slow", {"seconds": 5}),
                ToolResult(None, "Error: malformed tool call", "malformed"),
            ]
        )
    finally:
        box.close()
    assert json.loads(results[0].text)["population"] == 5000 and not results[0].error
    assert [r.error for r in results[1:]] == [
        "bad_arguments",
        "bad_arguments",
        "unknown_tool",
        "tool_error",
        "tool_error",
        "server_died",
        "timeout",
        "malformed",
    ]
    assert (
        "3 is not of type 'string'" in results[1].text
        and "unexpected argument 'town'" in results[2].text
    )
    assert "no such page" in results[4].text and "KeyError" not in results[4].text
    assert set(r.error for r in results[1:]) <= set(ERRORS)


def test_calls_run_concurrently_within_each_tools_limit_and_results_are_cached():
    running, most = [0], [0]
    lock = threading.Lock()

    def wait(key: str) -> str:
        """Wait a little.

        Args:
            key: Any key.
        """
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return key

    box = ToolBox([FunctionTool(wait, max_concurrency=2)])
    try:
        started = time.perf_counter()
        results = box.call_all([ToolCall("wait", {"key": str(i)}) for i in range(4)])
        took = time.perf_counter() - started
        assert [r.text for r in results] == ["0", "1", "2", "3"] and most[0] == 2
        assert 0.35 < took < 1.5  # two rounds of two, not four in a row (0.8 s) nor all at once
        again = box.call_all([ToolCall("wait", {"key": "1"})])[0]
        assert again.cached and again.text == "1"
    finally:
        box.close()


def test_two_tools_with_one_name_are_refused():
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        ToolBox([FunctionTool(lookup), FunctionTool(lookup)])


def test_tools_from_a_recipe_get_the_retriever_and_functions_become_tools(monkeypatch):
    class FakeRetriever:
        def parts(self):
            return [self]

    registry.register("tool", "lookup", lookup)
    try:
        search, fetch, answer, mine = build_tools(
            [
                "search",
                {"name": "fetch"},
                "answer",
                {"name": "lookup", "init_args": {"timeout_s": 3}},
            ],
            retriever=FakeRetriever(),
        )
    finally:
        registry.unregister("tool", "lookup")
    assert fetch.search is search and isinstance(search.retriever, FakeRetriever)
    assert answer.final and mine.timeout_s == 3 and mine.name == "lookup"
    with pytest.raises(ValueError, match="each tool is a name"):
        build_tools([{"init_args": {}}])


def test_hermes_and_llama3_read_calls_and_name_what_is_malformed():
    parsed = hermes(
        'Let me check.\n<tool_call>\n{"name": "search", "arguments": {"query": "Kessa"}}\n'
        '</tool_call>\n<tool_call>{"name": "fetch", "arguments": "{\\"id\\": \\"p1\\"}"}'
        "</tool_call><tool_call>{'name': 'x'}</tool_call><tool_call>[1]</tool_call>"
        '<tool_call>{"name": "answer", "arguments": {"answer": "Ke'
    )
    assert parsed.content == "Let me check."
    assert [getattr(c, "name", None) for c in parsed.calls[:2]] == ["search", "fetch"]
    assert parsed.calls[1].arguments == {"id": "p1"}
    assert parsed.malformed == 3 and "not valid JSON" in parsed.calls[2].text
    assert "JSON object" in parsed.calls[3].text
    calls = llama3(
        '{"name": "search", "parameters": {"query": "a"}}; '
        '{"name": "answer", "parameters": {"answer": "b"}}'
    )
    assert [c.name for c in calls.calls] == ["search", "answer"]
    assert llama3("Kessa, I think.").calls == [] and llama3("{oops").malformed == 1
    assert parser("hermes") is hermes
    with pytest.raises(ValueError, match="allowed: hermes, llama3"):
        parser("mistral")


def test_parsers_never_raise_on_random_text():
    rng = random.Random(0)
    alphabet = list('{}[]":,<>/ \\ntool_callnameargumentsparameters0123456789') + [
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
    ]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for parse in (hermes, llama3):
            parsed = parse(text)
            assert all(isinstance(c, ToolCall | ToolResult) for c in parsed.calls)
    deep = "<tool_call>" + "[" * 100000 + "</tool_call>"
    assert hermes(deep).malformed == 1 and llama3("{" + '"a":' * 50000).malformed == 1
