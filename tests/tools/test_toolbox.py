"""Tools and the ToolBox: schemas from functions, checked / limited / cached / timed calls that
never raise, hung sync calls that keep their own threads, identical calls sharing one run,
batched tools' calls as one batch, and the call parsers on untrusted text."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from lit_rag import api, registry
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.tools.builtin import SearchTool
from lit_rag.tools import (
    ENVIRONMENT_ERRORS,
    ERRORS,
    FunctionTool,
    ServerDied,
    Tool,
    ToolBox,
    ToolCall,
    ToolError,
    ToolResult,
    build_tools,
    hermes,
    llama3,
    mistral,
    parser,
)
from lit_rag.types import Passage


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
    # the kinds that are the environment's fault, not the policy's
    assert ENVIRONMENT_ERRORS == ("timeout", "server_died") and set(ENVIRONMENT_ERRORS) < set(
        ERRORS
    )
    assert api.ENVIRONMENT_ERRORS is ENVIRONMENT_ERRORS


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
    with pytest.raises(ValueError, match="allowed: hermes, llama3, mistral"):
        parser("qwen")


def test_parsers_never_raise_on_random_text():
    rng = random.Random(0)
    alphabet = list('{}[]":,<>/ \\ntool_callnameargumentsparameters0123456789') + [
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "<think>",
        "</think>",
        "[TOOL_CALLS]",
        "[ARGS]",
    ]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for parse in (hermes, llama3, mistral):
            parsed = parse(text)
            assert all(isinstance(c, ToolCall | ToolResult) for c in parsed.calls)
    deep = "<tool_call>" + "[" * 100000 + "</tool_call>"
    assert hermes(deep).malformed == 1 and llama3("{" + '"a":' * 50000).malformed == 1
    assert mistral("[TOOL_CALLS]" + "[" * 100000).malformed == 1


def stall(seconds: float) -> str:
    """Hang until the test lets go, or answer at once.

    Args:
        seconds: 0: answer at once; else hang (until released, at most a minute).
    """
    if seconds:
        RELEASE.wait(60)
    return "ok"


RELEASE = threading.Event()


def test_hung_sync_calls_keep_their_own_threads_and_other_calls_still_answer():
    """Seven calls hang past their 0.2 s timeout (more threads than the default executor's
    min(32, cores + 4) workers on a small machine): a fast call of the same tool and of another
    sync tool still answer within their own timeout. The eighth hung call reaches the limit
    (max_concurrency 8): the next call fails at once, saying so, until the hung ones return."""
    RELEASE.clear()
    box = ToolBox(
        [
            FunctionTool(stall, timeout_s=0.2, max_concurrency=8, cache_size=0),
            FunctionTool(lookup, timeout_s=1),
        ]
    )
    try:
        hung = box.call_all([ToolCall("stall", {"seconds": 1 + i}) for i in range(7)])
        assert [r.error for r in hung] == ["timeout"] * 7
        assert "timed out after 0.2 s" in hung[0].text
        fast = box.call_all([ToolCall("stall", {"seconds": 0}), ToolCall("lookup", {"city": "K"})])
        assert [r.error for r in fast] == ["", ""] and fast[0].text == "ok"
        assert box.call_all([ToolCall("stall", {"seconds": 99})])[0].error == "timeout"
        started = time.perf_counter()
        (refused,) = box.call_all([ToolCall("stall", {"seconds": 0})])
        assert time.perf_counter() - started < 0.15  # at once, not after 0.2 s
        assert refused.error == "timeout" and "8 calls are still hung" in refused.text
        assert not box.call_all([ToolCall("lookup", {"city": "K"})])[0].error  # other tools run
        RELEASE.set()
        deadline = time.monotonic() + 5
        while box.call_all([ToolCall("stall", {"seconds": 0})])[0].error:
            assert time.monotonic() < deadline, "the hung calls' threads never came back"
            time.sleep(0.05)
    finally:
        RELEASE.set()
        box.close()


def test_time_queued_behind_other_calls_is_not_counted_against_the_timeout():
    """Each call sleeps 0.15 s against a 0.4 s timeout. Five through max_concurrency 1 take
    0.75 s in all; sixteen at once (max_concurrency 16) are more than the default executor's
    workers on a small machine: none may time out."""

    def nap(key: str) -> str:
        """Sleep 0.15 s.

        Args:
            key: Any key.
        """
        time.sleep(0.15)
        return key

    one = ToolBox([FunctionTool(nap, timeout_s=0.4, max_concurrency=1)])
    many = ToolBox([FunctionTool(nap, timeout_s=0.4, max_concurrency=16)])
    try:
        started = time.perf_counter()
        results = one.call_all([ToolCall("nap", {"key": str(i)}) for i in range(5)])
        assert [r.error for r in results] == [""] * 5 and time.perf_counter() - started > 0.7
        results = many.call_all([ToolCall("nap", {"key": str(i)}) for i in range(16)])
        assert [r.text for r in results] == [str(i) for i in range(16)]
    finally:
        one.close()
        many.close()


def test_identical_calls_share_the_running_call_and_its_failure():
    """Eight identical calls (a GRPO group's first search): one run, seven followers marked
    cached. A call started while it runs joins it too. A failure is shared with the calls that
    waited for it, not cached: the next identical call runs again."""
    runs = []
    lock = threading.Lock()

    def shout(word: str) -> str:
        """Shout a word, slowly.

        Args:
            word: The word ("bad" fails).
        """
        with lock:
            runs.append(word)
        time.sleep(0.2)
        if word == "bad":
            raise ToolError("no such word")
        return word.upper()

    box = ToolBox([FunctionTool(shout)])
    try:
        results = box.call_all([ToolCall("shout", {"word": "kessa"}, id=str(i)) for i in range(8)])
        assert runs == ["kessa"] and [r.text for r in results] == ["KESSA"] * 8
        assert [r.cached for r in results] == [False] + [True] * 7
        assert [r.call.id for r in results] == [str(i) for i in range(8)]
        first, second = box.start([[ToolCall("shout", {"word": "dorvale"})]] * 2)
        assert first.result()[0].text == second.result()[0].text == "DORVALE"
        assert runs == ["kessa", "dorvale"]
        failed = box.call_all([ToolCall("shout", {"word": "bad"})] * 4)
        assert runs.count("bad") == 1 and {r.error for r in failed} == {"tool_error"}
        assert len({r.text for r in failed}) == 1 and "no such word" in failed[0].text
        assert box.call_all([ToolCall("shout", {"word": "bad"})])[0].error == "tool_error"
        assert runs.count("bad") == 2
    finally:
        box.close()


CORPUS = [
    Passage("p1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("p2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("p3", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
]


class CountedBM25(BM25Retriever):
    """lit-rag's BM25 retriever, keeping the queries of each ``search`` call."""

    def search(self, queries, k):
        self.calls.append(list(queries))
        return super().search(queries, k)


@pytest.fixture
def bm25():
    retriever = CountedBM25(stopwords="en")
    retriever.build(CORPUS)
    retriever.calls = []
    return retriever


def test_the_search_calls_of_every_group_are_one_retriever_call(bm25):
    """Four episodes' turns (groups), five searches, two of one query and one empty: one
    retriever call with the three distinct queries; each result is what a call of its own
    gives (the empty query fails alone)."""
    groups = [
        [ToolCall("search", {"query": "Mira Tolvan born"})],
        [ToolCall("search", {"query": "Kessa region"}), ToolCall("search", {"query": ""})],
        [ToolResult(None, "Error: malformed tool call", "malformed")],
        [ToolCall("search", {"query": "Mira Tolvan born"}), ToolCall("search", {"query": "x"})],
    ]
    box = ToolBox([SearchTool(bm25, top_k=2, cache_size=0)])
    try:
        batched = [future.result() for future in box.start(groups)]
    finally:
        box.close()
    assert bm25.calls == [["Mira Tolvan born", "Kessa region", "x"]]
    bm25.calls = []
    box = ToolBox([SearchTool(bm25, top_k=2, cache_size=0)], batch=False)
    try:
        alone = [box.call_all([call]) for group in groups for call in group]
    finally:
        box.close()
    assert len(bm25.calls) == 4  # one per call with a query
    flat = [result for group in batched for result in group]
    assert [(r.text, r.error) for r in flat] == [(r.text, r.error) for (r,) in alone]
    assert flat[0].text.startswith("Doc 1(Title: Mira Tolvan)") and flat[2].error == "tool_error"


def test_a_query_the_retriever_refuses_fails_only_its_own_call(bm25):
    """A lone surrogate is not valid Unicode: the retriever refuses the batch holding it, and
    the batch's queries are searched one by one, so only that call fails."""
    box = ToolBox([SearchTool(bm25, cache_size=0)])
    try:
        good, bad = box.call_all(
            [ToolCall("search", {"query": "Kessa"}), ToolCall("search", {"query": "x \ud800"})]
        )
    finally:
        box.close()
    assert good.text.startswith("Doc 1(Title: Kessa)") and not good.error
    assert bad.error == "tool_error" and "\\ud800" in bad.text
    assert bm25.calls == [["Kessa", "x \ud800"], ["Kessa"], ["x \ud800"]]


class Squares(Tool):
    """A batched tool whose ``run_batch`` is a coroutine; 13 is refused, 99 never answers."""

    name = "square"
    parameters = {  # noqa: RUF012 (read only)
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.batches: list[list[int]] = []

    async def run_batch(self, arguments):
        numbers = [a["n"] for a in arguments]
        self.batches.append(numbers)
        if 99 in numbers:
            await asyncio.sleep(5)
        return [ToolError("unlucky") if n == 13 else n * n for n in numbers]


def test_a_batched_tools_errors_and_timeouts_are_per_call_results():
    tool = Squares(timeout_s=0.2)
    box = ToolBox([tool])
    try:
        results = box.call_all(
            [ToolCall("square", {"n": 3}), ToolCall("square", {"n": 13}), ToolCall("nope", {})]
        )
        assert [(r.text, r.error) for r in results] == [
            ("9", ""),
            ("Error: square failed: unlucky", "tool_error"),
            ("Error: unknown tool 'nope'; tools: square", "unknown_tool"),
        ]
        slow = box.call_all([ToolCall("square", {"n": 4}), ToolCall("square", {"n": 99})])
        assert [r.error for r in slow] == ["timeout", "timeout"]  # one batch, one timeout
        assert box.call_all([ToolCall("square", {"n": 3})])[0].cached
        assert tool.batches == [[3, 13], [4, 99]]
    finally:
        box.close()
