"""Tool calls in the episode loop (lit_rag/contracts/episodes.py): the searches of every episode
at one tool turn are one retriever call, and with ``overlap`` the engine keeps generating other
episodes' segments while tools run, giving the same trajectories.

The engines here are fakes (no model), named as such: what they show is the order requests are
made and answered in, which a real engine on this machine would only blur.
"""

from __future__ import annotations

import threading
import time
import zlib

import pytest
import torch
from kit import CORPUS, TurnScript, tool_call

from lit_rag import registry
from lit_rag.api import EpisodeLoop, ToolBox
from lit_rag.models.tiny import build_tiny_tokenizer
from lit_rag.plugins.environments.tool_agent import ToolAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example

EXAMPLES = [
    Example(id="q1", question="Where was Mira Tolvan born?", answers=["Kessa"]),
    Example(id="q2", question="Which region is Kessa in?", answers=["Dorvale"]),
    Example(id="q3", question="Who founded Orbel Mills?", answers=["Mira Tolvan"]),
    Example(id="q4", question="What does Orbel Mills make?", answers=["paper"]),
]
END = "<|im_end|>"
PARAMS = SamplingParams(max_new_tokens=200)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


class CountedBM25(BM25Retriever):
    """lit-rag's BM25 retriever, keeping the queries of each ``search`` call."""

    def search(self, queries, k):
        self.calls.append(list(queries))
        return super().search(queries, k)


class OneAtATime(RolloutEngine):
    """A fake engine that batches continuously (its own ``collect``): a segment's text is
    ``texts[crc32(prompt) % len(texts)]``, so it depends on its prompt alone, and each
    ``collect`` takes 10 ms and returns the oldest segment still out, as vLLM returns what
    finished first. ``during_tools`` counts the collects that ended while a tool call ran
    (``busy``)."""

    batches_continuously = True

    def __init__(self, tokenizer, texts: list[str], busy: list[int] | None = None) -> None:
        self.tokenizer, self.texts, self.busy = tokenizer, texts, busy or [0]
        self.out: list[tuple[int, list[int], SamplingParams]] = []
        self.tickets = self.during_tools = 0

    def submit(self, prompt, params):
        self.tickets += 1
        self.out.append((self.tickets, list(prompt), params))
        return self.tickets

    def collect(self):
        if not self.out:
            return []
        time.sleep(0.01)  # a few decode steps (and the tools' threads get to run)
        self.during_tools += self.busy[0] > 0
        ticket, prompt, params = self.out.pop(0)
        return [(ticket, self.one(prompt, params))]

    def generate(self, prompts, params):
        return [self.one(p, params) for p in prompts]

    def one(self, prompt: list[int], params: SamplingParams) -> Generation:
        text = self.texts[zlib.crc32(repr(prompt).encode()) % len(self.texts)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: params.max_new_tokens]
        decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(torch.tensor(ids), torch.full((len(ids),), -0.5), decoded, True)


def rollout(env: ToolAgentEnvironment, engine, examples, group_size: int, **toolbox) -> list:
    """``env``'s rollout with the toolbox's settings ``toolbox`` (``batch``, ``overlap``)."""
    for name, value in toolbox.items():
        setattr(env.toolbox, name, value)
    try:
        return env.rollout(list(examples), engine, group_size, PARAMS)
    finally:
        env.close()


def same(a: list, b: list) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert (x.example.id, x.group, x.text) == (y.example.id, y.group, y.text)
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert torch.equal(x.loss_mask, y.loss_mask)
        assert x.contract == y.contract and x.meta["messages"] == y.meta["messages"]


def test_the_searches_of_episodes_at_one_tool_turn_are_one_retriever_call(tok):
    """Four episodes search at their first turn, two queries twice each: one retriever call
    with the two distinct queries (the repeats wait for the first ones); one call per distinct
    query with batching off; the same trajectories either way."""
    retriever = CountedBM25(stopwords="en")
    retriever.build(CORPUS)
    first = [tool_call("search", query=q) + END for q in ["Mira Tolvan born", "Kessa region"] * 2]
    turns = [first, [tool_call("answer", answer="Kessa") + END] * 4]
    found = {}
    for batch in (True, False):
        retriever.calls = []
        env = ToolAgentEnvironment(retriever=retriever, chat_template="hermes")
        found[batch] = rollout(env, TurnScript(tok, turns), EXAMPLES[:2], 2, batch=batch)
        assert all(t.contract.calls == {"search": 1, "answer": 1} for t in found[batch])
        if batch:
            assert retriever.calls == [["Mira Tolvan born", "Kessa region"]]
        else:
            assert sorted(retriever.calls) == [["Kessa region"], ["Mira Tolvan born"]]
    same(found[True], found[False])


def test_with_overlap_the_engine_generates_while_tools_run_and_trajectories_are_the_same(tok):
    """Each tool call takes 0.2 s. Without overlap the loop waits for each one before it
    collects again; with it, it collects other episodes' segments meanwhile (``during_tools``),
    so the rollout takes less time, and the trajectories are the same (the engine's samples
    depend on their prompt alone)."""
    busy, lock = [0], threading.Lock()

    def slow(key: str) -> str:
        """Look a key up, slowly.

        Args:
            key: The key.
        """
        with lock:
            busy[0] += 1
        time.sleep(0.2)
        with lock:
            busy[0] -= 1
        return f"value of {key}"

    texts = [
        tool_call("slow", key="a") + END,
        "Let me look." + tool_call("slow", key="b") + END,
        tool_call("answer", answer="Kessa") + END,
        tool_call("slow", key="c") + END,
        tool_call("slow", key="d") + tool_call("slow", key="e") + END,
        "Dorvale" + END,
    ]
    registry.register("tool", "slow", slow)
    try:
        found, seconds, engines = {}, {}, {}
        for overlap in (False, True):
            env = ToolAgentEnvironment(
                tools=[{"name": "slow", "init_args": {"cache_size": 0}}, "answer"],
                chat_template="hermes",
                max_turns=3,
            )
            engines[overlap] = OneAtATime(tok, texts, busy)
            started = time.perf_counter()
            found[overlap] = rollout(env, engines[overlap], EXAMPLES, 1, overlap=overlap)
            seconds[overlap] = time.perf_counter() - started
    finally:
        registry.unregister("tool", "slow")
    calls = [t.contract.calls.get("slow", 0) for t in found[True]]
    assert sum(calls) >= 3, f"the texts' choice gave too few tool calls ({calls})"
    same(found[False], found[True])
    during = {overlap: engine.during_tools for overlap, engine in engines.items()}
    assert during[False] == 0 and during[True] > 0, during
    assert seconds[True] < seconds[False] - 0.2, (seconds, calls)


def test_overlap_is_on_where_the_engine_batches_continuously(tok):
    class Wrapper(RolloutEngine):
        """A rollout worker's kind of engine: its own collect around an inner engine."""

        def __init__(self, inner) -> None:
            self.inner, self.tokenizer = inner, inner.tokenizer
            self.batches_continuously = inner.batches_continuously

        def collect(self):
            return self.inner.collect()

        def generate(self, prompts, params):
            return self.inner.generate(prompts, params)

    continuous, phased = OneAtATime(tok, ["x"]), TurnScript(tok, [])
    assert EpisodeLoop(continuous, PARAMS).overlap
    assert not EpisodeLoop(phased, PARAMS).overlap
    assert not EpisodeLoop(Wrapper(phased), PARAMS).overlap
    assert EpisodeLoop(Wrapper(continuous), PARAMS).overlap
    assert EpisodeLoop(phased, PARAMS, tools=ToolBox([], overlap=True)).overlap
    assert not EpisodeLoop(continuous, PARAMS, tools=ToolBox([]), overlap=False).overlap
