"""``lit-rag index serve``: any lit-rag index over HTTP, with Search-R1's API (FastAPI + uvicorn).

    lit-rag index serve indexes/wiki-e5 --host 127.0.0.1 --port 8000 --encoder /models/e5-base-v2

    POST /retrieve  {"queries": [...], "topk": 3, "return_scores": true}
        -> {"result": [[{"document": {"id", "contents", "title", "text"}, "score": s}, ...], ...]}
    GET  /health    -> {"status": "ok", "retriever": "dense", "passages": N, "topk": 3}

The request and answer are those of Search-R1's ``search_r1/search/retrieval_server.py``
(``QueryRequest``: ``queries``, ``topk`` defaulting to the server's ``--topk``,
``return_scores`` defaulting to false; without scores each entry is the document itself), so
Search-R1's rollout loop, verl's search tool and lit-rag's ``retriever: http`` all work against
it. A document carries ``contents`` in FlashRAG's form (``"Title"``, a newline, the text),
which Search-R1's client splits back, and ``title`` / ``text`` as lit-rag stores them.

Several training processes share one server. Searches run one at a time under a lock (a
retriever's encoder and index are not made for concurrent calls); each request is one batched
search, so a client sending all of a generation turn's queries at once gets them in one pass.
A bad request (``topk < 1``, more than ``max_queries`` queries, a query that is not valid
Unicode) is answered 422 with the reason, and the server keeps serving.
"""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any

from pydantic import BaseModel

from lit_rag.errors import InputError
from lit_rag.retrieval.base import Hit, Retriever

#: the most passages one query may ask for
MAX_TOPK = 1000


class QueryRequest(BaseModel):
    """Search-R1's request body (``retrieval_server.py::QueryRequest``)."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def create_app(retriever: Retriever, topk: int = 3, max_queries: int = 4096, name: str = "") -> Any:
    """The FastAPI application serving ``retriever``.

    Args:
        retriever: An opened retriever (its index loaded).
        topk: Passages per query when a request gives no ``topk`` (Search-R1's ``--topk``).
        max_queries: Most queries one request may hold.
        name: What the server serves (the index folder), shown by ``/health``.
    """
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="lit-rag retrieval", description=__doc__.splitlines()[0])
    lock = threading.Lock()
    passages = retriever.passage_count() or 0

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:
        k = request.topk or topk
        if not 1 <= k <= MAX_TOPK:
            raise HTTPException(422, f"topk: got {k}; expected 1 to {MAX_TOPK}")
        if len(request.queries) > max_queries:
            raise HTTPException(
                422,
                f"queries: got {len(request.queries)}; this server takes at "
                f"most {max_queries} a request (--max-queries)",
            )
        try:
            with lock:
                ranked = retriever.search(request.queries, k)
        except ValueError as err:  # a query that is not valid Unicode text
            raise HTTPException(422, str(err)) from None
        return {"result": [[_entry(hit, request.return_scores) for hit in hits] for hits in ranked]}

    @app.get("/health")
    def health() -> dict:
        return {
            "status": "ok",
            "index": name,
            "retriever": retriever.kind,
            "passages": passages,
            "topk": topk,
        }

    return app


def _entry(hit: Hit, with_score: bool) -> dict:
    """One hit as Search-R1 returns it: the corpus row, with its score when asked."""
    from lit_rag.retrieval.corpus import join_contents

    p = hit.passage
    document = {
        "id": p.id,
        "contents": join_contents(p.title, p.text),
        "title": p.title,
        "text": p.text,
    }
    return {"document": document, "score": hit.score} if with_score else document


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    Binding here, before uvicorn starts, turns a taken port into one clear line.

    Raises:
        InputError: The address is taken, not local, or not allowed.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise InputError(
            f"--host {host} --port {port}: cannot listen there ({err.strerror}); "
            "pick another --port (0 picks a free one)"
        ) from None
    except (OverflowError, TypeError) as err:
        sock.close()
        raise InputError(f"--port: got {port}; expected 0 to 65535 ({err})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    retriever: Retriever,
    host: str,
    port: int,
    topk: int = 3,
    max_queries: int = 4096,
    name: str = "",
) -> None:
    """Serve ``retriever`` until interrupted.

    Prints ``serving NAME (KIND, N passages) at http://HOST:PORT/retrieve`` once listening.
    Ctrl-C (SIGINT) and SIGTERM both stop it cleanly: uvicorn finishes the requests in flight
    and closes the socket, then this prints ``stopped`` and returns (exit status 0).
    """
    import uvicorn

    sock = bind(host, port)
    app = create_app(retriever, topk=topk, max_queries=max_queries, name=name)
    real_host, real_port = sock.getsockname()[:2]
    shown = f"[{real_host}]" if ":" in real_host else real_host
    passages = retriever.passage_count() or 0
    print(
        f"serving {name} ({retriever.kind}, {passages} passages) at "
        f"http://{shown}:{real_port}/retrieve",
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    # uvicorn stops cleanly on SIGINT or SIGTERM, then raises the signal again with the
    # handlers it found: make SIGTERM's, like SIGINT's, a KeyboardInterrupt we end on
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    print("stopped", flush=True)
