"""``retriever: http`` against real FastAPI / uvicorn servers on 127.0.0.1 (threads of this test).

The served index is lit-rag's own app (``create_app``) over a BM25 index built in the test;
the misbehaving servers (busy, slow, off-API) are small FastAPI apps, so the client meets a real
HTTP stack every time. ``tests/cli/test_index_serve.py`` runs the ``lit-rag index serve``
command itself.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from helpers import ScriptedPolicy

from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.retrievers.http import (
    HttpRetriever,
    RetrieverResponseError,
    RetrieverUnavailableError,
)
from lit_rag.retrieval.base import Retriever
from lit_rag.retrieval.server import bind, create_app
from lit_rag.rollout.base import SamplingParams
from lit_rag.types import Example, Passage

CORPUS = [
    Passage("p1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("p2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("p3", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
    Passage("p4", "", "A passage without a title about Dorvale and Kessa harbours."),
]
QUERIES = ["Orbel Mills founder", "Mira Tolvan born", "", "Dorvale harbour", "zzz unknownword"]


@contextmanager
def running(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port; yields its base URL."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Recording(Retriever):
    """Delegates to ``inner`` and records the queries of every search call."""

    kind = "recording"

    def __init__(self, inner: Retriever) -> None:
        self.inner, self.calls, self.passages = inner, [], inner.passages

    def search(self, queries, k):
        self.calls.append(list(queries))
        return self.inner.search(queries, k)

    def build(self, passages): ...
    def save(self, directory): ...
    @classmethod
    def load(cls, directory): ...


@pytest.fixture(scope="module")
def local() -> BM25Retriever:
    retriever = BM25Retriever()
    retriever.build(CORPUS)
    return retriever


@pytest.fixture(scope="module")
def served(local):
    """lit-rag's app over ``local``: (URL of /retrieve, the recording retriever behind it)."""
    recording = Recording(local)
    with running(create_app(recording, topk=2, max_queries=8)) as base:
        yield f"{base}/retrieve", recording


def test_same_hits_as_the_local_index(local, served):
    url, _ = served
    remote = HttpRetriever(url).search(QUERIES, 3)
    here = local.search(QUERIES, 3)
    assert [[(h.passage, h.score, h.rank) for h in hits] for hits in remote] == [
        [(h.passage, h.score, h.rank) for h in hits] for hits in here
    ]
    assert remote[0][0].passage.id == "p1" and remote[2] == [] and remote[4] == []


def test_a_search_is_one_request_split_at_batch_size(served):
    url, recording = served
    recording.calls.clear()
    HttpRetriever(url).search(QUERIES, 1)
    assert recording.calls == [[q for q in QUERIES if q]]  # the empty query is not sent
    recording.calls.clear()
    HttpRetriever(url, batch_size=3).search(QUERIES * 2, 1)
    # 8 non-empty queries in requests of at most 3
    assert [len(c) for c in recording.calls] == [3, 3, 2]


def test_environment_searches_each_turn_in_one_request(tiny_policy, local, served):
    """Eval-RAR's search agent over the served index: every searching row of a turn goes in
    one POST, and the episodes are the ones the local index gives."""
    url, recording = served
    _, tok = tiny_policy
    examples = [
        Example(id="q1", question="Where was the founder of Orbel Mills born?", answers=["Kessa"]),
        Example(id="q2", question="Which region is Kessa in?", answers=["Dorvale"]),
    ]
    calls = [
        [
            "<search>Orbel Mills founder</search>",
            "<search>Mira Tolvan born</search>",
            "<search>Kessa region</search>",
            "<answer>Dorvale</answer>",
        ],
        ["<evaluate>a</evaluate>", "<evaluate>b</evaluate>", "<evaluate>c</evaluate>"],
        ["<answer>Kessa</answer>", "<answer>Kessa</answer>", "<answer>Dorvale</answer>"],
    ]

    def episodes(retriever):
        env = SearchAgentEnvironment(retriever, top_k=2, max_turns=2)
        return env.rollout(
            examples, ScriptedPolicy(tok, calls), 2, SamplingParams(max_new_tokens=64)
        )

    recording.calls.clear()
    remote = episodes(HttpRetriever(url))
    assert recording.calls == [["Orbel Mills founder", "Mira Tolvan born", "Kessa region"]]
    here = episodes(local)
    assert [t.text for t in remote] == [t.text for t in here]
    assert [s.passage_ids for t in remote for s in t.steps] == [
        s.passage_ids for t in here for s in t.steps
    ]
    assert "<information>Doc 1(Title: Orbel Mills)" in remote[0].text


def test_server_down_is_one_line_after_the_retries():
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    retriever = HttpRetriever(f"http://127.0.0.1:{port}/retrieve", retries=2, backoff=0.01)
    with pytest.raises(RetrieverUnavailableError) as info:
        retriever.search(["q"], 1)
    message = str(info.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message
    assert (
        "cannot connect" in message
        and "after 3 tries" in message
        and "lit-rag index serve" in message
    )


def flaky_app() -> FastAPI:
    """Busy (503) on the first call, then a Search-R1 answer of bare ``contents`` documents
    without ids or scores; ``/slow`` answers after 3 s; the others answer outside the API."""
    app, state = FastAPI(), {"calls": 0}

    @app.post("/retrieve")
    async def retrieve(request: Request):
        state["calls"] += 1
        if state["calls"] == 1:
            return PlainTextResponse("busy", status_code=503)
        body = await request.json()
        doc = {"contents": '"Kessa"\nKessa is a harbour town.'}
        return {
            "result": [
                [doc, {"contents": "no title line"}][: body["topk"]] for _ in body["queries"]
            ]
        }

    @app.post("/slow")
    async def slow():
        import asyncio

        await asyncio.sleep(3)
        return {"result": [[]]}

    @app.post("/short")
    def short():
        return {"result": []}

    @app.post("/not-json")
    def not_json():
        return PlainTextResponse("<html>proxy error page</html>")

    @app.post("/refuse")
    def refuse():
        return PlainTextResponse("bad request", status_code=400)

    app.state.calls = state
    return app


@pytest.fixture(scope="module")
def flaky():
    app = flaky_app()
    with running(app) as base:
        yield base, app.state.calls


def test_busy_server_is_retried_and_bare_documents_are_read(flaky):
    base, state = flaky
    retriever = HttpRetriever(f"{base}/retrieve", retries=1, backoff=0.01)
    (hits,) = retriever.search(["q"], 2)
    assert state["calls"] == 2  # 503, then the answer
    assert [(h.passage.title, h.passage.text) for h in hits] == [
        ("Kessa", "Kessa is a harbour town."),
        ("", "no title line"),
    ]
    # no score: 1 / (rank + 1) keeps the server's order; no id: named by the content's hash
    assert [h.score for h in hits] == [1.0, 0.5]
    assert hits[0].passage.id.startswith("sha1:") and hits[0].passage.id != hits[1].passage.id


def test_timeout_is_retried_then_one_line(flaky):
    base, _ = flaky
    started = time.monotonic()
    with pytest.raises(
        RetrieverUnavailableError, match=r"no answer within 0.3 s \(timeout\) after 2 tries"
    ):
        HttpRetriever(f"{base}/slow", timeout=0.3, retries=1, backoff=0.01).search(["q"], 1)
    assert time.monotonic() - started < 2.5  # did not wait for the 3 s answers


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("short", "returned 0 result lists for 1 queries"),
        ("not-json", "not JSON"),
        ("refuse", "answered HTTP 400: bad request"),
    ],
)
def test_off_api_answers_are_one_line_without_retry(flaky, route, expected):
    base, _ = flaky
    with pytest.raises(RetrieverResponseError, match=expected) as info:
        HttpRetriever(f"{base}/{route}", retries=3, backoff=5).search(["q"], 1)  # no 5 s wait
    assert "\n" not in str(info.value)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="url: got 'localhost:8000'"):
        HttpRetriever("localhost:8000")
    with pytest.raises(ValueError, match="timeout"):
        HttpRetriever(timeout=0)
    with pytest.raises(ValueError, match="batch_size"):
        HttpRetriever(batch_size=0)
