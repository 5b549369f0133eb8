"""``lit-rag index serve`` as a user runs it: a server process on 127.0.0.1, queried with plain
HTTP (Search-R1's request, as its rollout loop sends it) and with ``retriever: http``, then
stopped. Also: a recipe's ``retriever: http`` in ``lit-rag fit``, and the one-line errors."""

from __future__ import annotations

import csv
import json
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
from helpers import one_line_error, start_index_server, stop_index_server

from lit_rag.cli.commands import main
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.retrievers.http import HttpRetriever
from lit_rag.retrieval.corpus import split_contents

pytestmark = [pytest.mark.subprocess]

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUERIES = ["who founded Orbel Mills", "Tamar Vesk born", "year Stiskal Mills was founded"]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "synthetic-bm25"
    main(["index", "build", "--corpus", "synthetic", "--retriever", "bm25", "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def server(index):
    process, url = start_index_server([str(index), "--topk", "2"])
    yield url
    code, out, err = stop_index_server(process, signal.SIGTERM)
    assert (code, out) == (0, "stopped\n") and "Traceback" not in err, err


def test_ctrl_c_stops_the_server_cleanly(index):
    process, url = start_index_server([str(index)])
    assert post(url, {"queries": ["Orbel Mills"], "topk": 1})[0] == 200
    code, out, err = stop_index_server(process, signal.SIGINT)
    assert (code, out) == (0, "stopped\n") and "Traceback" not in err, err
    with pytest.raises(urllib.error.URLError):  # nothing listens there any more
        post(url, {"queries": ["Orbel Mills"], "topk": 1})


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_plain_http_speaks_search_r1(index, server):
    local = BM25Retriever.load(index)
    status, answer = post(server, {"queries": QUERIES, "topk": 3, "return_scores": True})
    assert status == 200 and len(answer["result"]) == 3
    for query, entries in zip(QUERIES, answer["result"], strict=True):
        hits = local.search([query], 3)[0]
        assert [e["document"]["id"] for e in entries] == [h.passage.id for h in hits]
        assert [e["score"] for e in entries] == pytest.approx([h.score for h in hits])
        for entry, hit in zip(entries, hits, strict=True):
            # Search-R1's client reads contents: title on the first line, the text after it
            assert split_contents(entry["document"]["contents"]) == (
                hit.passage.title,
                hit.passage.text,
            )
    # without return_scores each entry is the document; without topk the server's --topk (2)
    status, answer = post(server, {"queries": QUERIES[:1]})
    assert (
        status == 200
        and [set(d) for d in answer["result"][0]] == [{"id", "contents", "title", "text"}] * 2
    )


def test_http_retriever_matches_the_local_index(index, server):
    local = BM25Retriever.load(index).search(QUERIES, 4)
    remote = HttpRetriever(server).search(QUERIES, 4)
    assert [[h.passage for h in hits] for hits in remote] == [
        [h.passage for h in hits] for hits in local
    ]


def test_bad_requests_are_refused_and_the_server_keeps_serving(server):
    status, answer = post(server, {"queries": ["q"], "topk": -1})
    assert status == 422 and "topk: got -1" in answer["detail"]
    status, answer = post(server, {"queries": "not a list"})
    assert status == 422
    status, answer = post(server, {"queries": ["Orbel\udcff"], "topk": 1})
    assert status == 422 and "lone surrogate" in answer["detail"]
    status, _ = post(server, {"queries": ["Orbel Mills"], "topk": 1})
    assert status == 200
    with urllib.request.urlopen(server.replace("/retrieve", "/health"), timeout=30) as response:
        health = json.loads(response.read())
    assert health["status"] == "ok" and health["retriever"] == "bm25" and health["passages"] > 1000


def test_a_dense_index_serves_with_the_encoder_passed(tmp_path):
    """``--encoder`` reaches the index: a dense index over a tiny BERT answers as it does here."""
    from helpers import tiny_bert_folder

    from lit_rag.retrieval.base import open_index
    from lit_rag.retrieval.corpus import read_corpus

    words = sorted(
        {w for p in read_corpus("synthetic") for w in p.text.lower().split() if w.isalpha()}
    )
    encoder = tiny_bert_folder(tmp_path / "enc", words)
    out = tmp_path / "dense"
    main(
        [
            "index",
            "build",
            "--corpus",
            "synthetic",
            "--retriever",
            "dense",
            "--encoder",
            encoder,
            "--out",
            str(out),
        ]
    )
    process, url = start_index_server([str(out), "--encoder", encoder])
    try:
        remote = HttpRetriever(url).search(QUERIES, 3)
    finally:
        assert stop_index_server(process, signal.SIGTERM)[0] == 0
    local = open_index(out, encoder=encoder).search(QUERIES, 3)
    assert [[h.passage.id for h in hits] for hits in remote] == [
        [h.passage.id for h in hits] for hits in local
    ]
    assert [h.score for hits in remote for h in hits] == pytest.approx(
        [h.score for hits in local for h in hits]
    )
    assert len({h.score for hits in local for h in hits}) > 3  # not a tie everywhere


def test_fit_with_an_http_retriever(index, server, tmp_path, monkeypatch):
    """The tiny search-agent recipe with its retriever swapped for the server by one override."""
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(RECIPES / "tiny_search_agent.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / "run"),
            "--model.environment.init_args.retriever=http",
            f"--model.environment.init_args.retriever.init_args.url={server}",
        ]
    )
    with next((tmp_path / "run").rglob("metrics.csv")).open(newline="") as f:
        steps = [r for r in csv.DictReader(f) if r.get("reward/total")]
    assert len(steps) == 2 and all(r["rollout/turns"] for r in steps)  # the recipe's 2 steps
    # (that the server, not a local index, answered: with it down this fit fails, next test)


def test_fit_with_the_server_down_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    line = one_line_error(
        [
            "fit",
            "--config",
            str(RECIPES / "tiny_search_agent.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--model.environment.init_args.retriever=http",
            f"--model.environment.init_args.retriever.init_args.url=http://127.0.0.1:{port}/retrieve",
            "--model.environment.init_args.retriever.init_args.retries=1",
            "--model.environment.init_args.retriever.init_args.backoff=0.01",
        ],
        capsys,
    )
    assert f"retrieval server http://127.0.0.1:{port}/retrieve: cannot connect" in line


def test_taken_port_and_missing_index_are_one_line(index, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = one_line_error(["index", "serve", str(index), "--port", str(port)], capsys)
    assert f"--port {port}: cannot listen there" in line
    line = one_line_error(["index", "serve", str(index.parent / "nope")], capsys)
    assert "index folder not found" in line
    assert "--port: got 70000" in one_line_error(
        ["index", "serve", str(index), "--port", "70000"], capsys
    )
