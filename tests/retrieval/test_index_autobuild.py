"""A recipe's ``corpus:``: a missing index is built on first use, once, and an existing one is
used as it is (the quickstarts run on a fresh machine without ``lit-rag index build``)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from lit_rag import registry
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.retrievers.hybrid import HybridRetriever
from lit_rag.retrieval.manifest import Manifest
from lit_rag.retrieval.storage import build_missing_index
from lit_rag.types import Passage

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
CORPUS = [
    Passage("a", "Orbel Mills", "Orbel Mills was founded by Tamar Vesk."),
    Passage("b", "Tamar Vesk", "Tamar Vesk was born in Drosstead."),
    Passage("c", "Drosstead", "Drosstead is a harbour town."),
]


@pytest.fixture
def corpus_file(tmp_path: Path) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(f'{{"id": "{p.id}", "title": "{p.title}", "text": "{p.text}"}}\n' for p in CORPUS)
    )
    return str(path)


def test_missing_index_is_built_on_first_search_with_progress(tmp_path, corpus_file, capsys):
    out = tmp_path / "indexes" / "bm25"
    hits = BM25Retriever(index=str(out), corpus=corpus_file).search(["who founded Orbel Mills"], 1)
    assert hits[0][0].passage.id == "a"
    err = capsys.readouterr().err
    assert f"index {out} not found; building it from corpus" in err
    assert "BM25S" in err  # bm25s' progress bars were on
    assert Manifest.read(out).passage_count == 3
    # the built index is a normal one: another retriever opens it without a corpus
    assert BM25Retriever(index=str(out)).search(["Drosstead harbour"], 1)[0][0].passage.id == "c"


def test_existing_index_is_used_as_it_is(tmp_path, corpus_file, capsys):
    out = tmp_path / "bm25"
    first = BM25Retriever()
    first.build(CORPUS[:2])
    first.save(out)
    before = (out / "manifest.json").stat().st_mtime_ns
    retriever = BM25Retriever(index=str(out), corpus=corpus_file)  # names a 3-passage corpus
    assert len(retriever.search(["Tamar Vesk"], 5)[0]) == 2  # the 2-passage index, not rebuilt
    assert (out / "manifest.json").stat().st_mtime_ns == before
    assert "building" not in capsys.readouterr().err


class SlowBM25(BM25Retriever):
    """Counts builds and takes 0.5 s for each, so a second process arrives mid-build."""

    builds = 0

    def build(self, passages):
        type(self).builds += 1
        time.sleep(0.5)
        super().build(passages)


def test_processes_starting_together_build_once(tmp_path, corpus_file):
    """Two builders (as two DDP ranks would be): the second waits for the first's lock, then
    finds the index. Threads suffice: flock locks belong to each open of the lock file."""
    out = tmp_path / "bm25"
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(build_missing_index(out, corpus_file, SlowBM25()))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [False, True] and SlowBM25.builds == 1
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_a_folder_that_is_not_an_index_is_never_replaced(tmp_path, corpus_file):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a lit-rag index"):
        BM25Retriever(index=str(out), corpus=corpus_file).search(["q"], 1)
    assert (out / "mine.txt").read_text() == "keep me"


def test_hybrid_builds_its_children_where_they_look(tmp_path, corpus_file):
    """The children name ``INDEX/0-bm25`` and ``INDEX/1-bm25``, the folders a hybrid save writes."""
    out = tmp_path / "hy"
    children = [
        BM25Retriever(index=str(out / "0-bm25")),
        BM25Retriever(index=str(out / "1-bm25"), k1=0.9),
    ]
    hybrid = HybridRetriever(children, index=str(out), corpus=corpus_file)
    assert hybrid.search(["Tamar Vesk born"], 1)[0][0].passage.id == "b"
    assert Manifest.read(out).settings["children"] == [
        {"folder": "0-bm25", "kind": "bm25"},
        {"folder": "1-bm25", "kind": "bm25"},
    ]
    assert Manifest.read(out / "1-bm25").settings["k1"] == 0.9  # each child with its own settings
    again = HybridRetriever(
        [BM25Retriever(index=str(out / "0-bm25")), BM25Retriever(index=str(out / "1-bm25"))],
        index=str(out),
        corpus=corpus_file,
    )
    assert again.search(["Tamar Vesk born"], 1) == hybrid.search(["Tamar Vesk born"], 1)
    with pytest.raises(ValueError, match="needs index"):
        HybridRetriever(children, corpus=corpus_file)


@pytest.mark.parametrize("recipe", ["eval_rar_quickstart.yaml", "r2ag_quickstart.yaml"])
def test_bm25_quickstarts_build_their_index_on_a_fresh_machine(recipe, tmp_path, monkeypatch):
    """The retriever exactly as the recipe configures it, in an empty folder."""
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((RECIPES / recipe).read_text())["model"]["environment"]["init_args"][
        "retriever"
    ]
    retriever = registry.resolve("retriever", config["class_path"])(**config["init_args"])
    assert retriever.search(["Orbel Mills founded"], 1)[0]
    assert Manifest.read(tmp_path / config["init_args"]["index"]).passage_count > 1000
