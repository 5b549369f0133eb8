"""BM25Retriever (bm25s): ranking on hand-built corpora, edge cases, save/load, manifest checks."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import require_package

from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.retrieval.corpus import corpus_fingerprint, read_corpus, write_corpus
from lit_rag.retrieval.manifest import IndexMismatchError, IndexNotFoundError, Manifest
from lit_rag.types import Passage

# Four passages whose words barely overlap, so each query below has one obvious winner.
CORPUS = [
    Passage("cat", "Cat", "The cat sat on the mat."),
    Passage("dog", "Dog", "Dogs chase cats in the park."),
    Passage("fish", "Goldfish", "Goldfish swim in a bowl of water."),
    Passage("cafe", "Café Zürich", "Crème brûlée is served at the café in Zürich."),
]


def _ids(hits: list) -> list[str]:
    return [h.passage.id for h in hits]


@pytest.fixture
def bm25() -> BM25Retriever:
    retriever = BM25Retriever()
    retriever.build(CORPUS)
    return retriever


def test_obvious_ranking_and_only_matching_passages(bm25: BM25Retriever) -> None:
    # "goldfish" and "bowl" occur only in the fish passage; the other three share no term
    # with the query, so (like Lucene) they are not returned at all.
    [hits] = bm25.search(["goldfish bowl"], k=3)
    assert _ids(hits) == ["fish"]
    assert hits[0].rank == 0 and hits[0].score > 0
    # "cat" is in the title and text of "cat" (tf 2) and, stemmed from "cats", once in "dog".
    [hits] = bm25.search(["cat"], k=3)
    assert _ids(hits) == ["cat", "dog"]
    assert [h.rank for h in hits] == [0, 1] and hits[0].score > hits[1].score


def test_lucene_score_by_hand() -> None:
    # Two one-line passages, no stopwords/stemming: "apple banana", "cherry date".
    # Lucene BM25: idf = ln(1 + (N - df + 0.5) / (df + 0.5)) = ln(1 + 1.5 / 1.5) = ln 2;
    # tf = 1, dl = avgdl = 2 -> score = idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))
    #                                 = ln 2 * 1 / (1 + 1.5 * 1) = 0.693147 / 2.5 = 0.277259
    retriever = BM25Retriever(stopwords=None, stemmer=None)
    retriever.build([Passage("a", "", "apple banana"), Passage("c", "", "cherry date")])
    [hits] = retriever.search(["apple"], k=2)
    assert _ids(hits) == ["a"]
    assert hits[0].score == pytest.approx(math.log(2) / 2.5, rel=1e-5)


def test_empty_whitespace_and_stopword_queries_get_no_hits(bm25: BM25Retriever) -> None:
    # "the in a" is all English stopwords; "zzzz" is not in the vocabulary.
    assert bm25.search(["", "   \n\t", "the in a", "zzzz"], k=3) == [[], [], [], []]
    assert bm25.search([], k=3) == []


def test_unicode_queries(bm25: BM25Retriever) -> None:
    # Accented words are word characters; lowercasing maps "ZÜRICH" to "zürich".
    assert _ids(bm25.search(["ZÜRICH crème brûlée"], k=2)[0]) == ["cafe"]
    assert bm25.search(["東京 😀"], k=2) == [[]]  # unknown unicode words: no hits, no error


def test_k_larger_than_corpus_is_clipped(bm25: BM25Retriever) -> None:
    # Every passage contains a word of this query, so all 4 come back even though k = 100.
    [hits] = bm25.search(["cat dog goldfish café"], k=100)
    assert sorted(_ids(hits)) == ["cafe", "cat", "dog", "fish"]
    assert [h.rank for h in hits] == [0, 1, 2, 3]
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_batch_equals_one_by_one(bm25: BM25Retriever) -> None:
    queries = ["goldfish bowl", "", "cat", "Zürich"]
    batched = bm25.search(queries, k=2)
    assert batched == [bm25.search([q], k=2)[0] for q in queries]


def test_stemming_and_stopword_settings() -> None:
    require_package("Stemmer", "pip install PyStemmer")
    # Stemming maps "swimming" and "swim" to "swim"; without it the words differ.
    stemmed, plain = BM25Retriever(), BM25Retriever(stemmer=None)
    stemmed.build(CORPUS)
    plain.build(CORPUS)
    assert _ids(stemmed.search(["swimming"], k=2)[0]) == ["fish"]
    assert plain.search(["swimming"], k=2) == [[]]
    # Keeping stopwords makes "the" searchable: "cat" has it twice, "dog" and "cafe" once.
    keep = BM25Retriever(stopwords=None)
    keep.build(CORPUS)
    assert _ids(keep.search(["the"], k=4)[0])[0] == "cat"
    assert stemmed.manifest is not None and stemmed.manifest.settings["stemmer"] == "english"


def test_without_pystemmer_stemming_is_off_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "Stemmer", None)  # makes `import Stemmer` fail
    retriever = BM25Retriever(stemmer="english")
    retriever.build(CORPUS)
    assert retriever.manifest is not None and retriever.manifest.settings["stemmer"] is None
    assert retriever.search(["swimming"], k=2) == [[]]


def test_stemmed_index_without_pystemmer_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_package("Stemmer", "pip install PyStemmer")
    stemmed = BM25Retriever()
    stemmed.build(CORPUS)
    stemmed.save(tmp_path / "idx")
    monkeypatch.setitem(sys.modules, "Stemmer", None)  # this machine has no PyStemmer
    with pytest.raises(
        IndexMismatchError, match="built with stemmer='english' but PyStemmer is not installed"
    ) as info:
        BM25Retriever.load(tmp_path / "idx")
    assert "\n" not in str(info.value)


def test_save_load_round_trip_identical_and_memory_mapped(
    bm25: BM25Retriever, tmp_path: Path
) -> None:
    bm25.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")
    queries = ["goldfish bowl", "cat", "ZÜRICH crème", "", "cat dog goldfish café"]
    assert loaded.search(queries, k=10) == bm25.search(queries, k=10)  # ids, scores, ranks
    assert isinstance(loaded._bm25.scores["data"], np.memmap)
    manifest = Manifest.read(tmp_path / "idx")
    assert manifest.retriever == "bm25" and manifest.encoder is None
    assert manifest.passage_count == 4
    assert manifest.corpus_fingerprint == corpus_fingerprint(CORPUS)
    assert manifest.settings["k1"] == 1.5 and manifest.settings["method"] == "lucene"
    # every matrix file is recorded with its size and SHA-256 (all are small here)
    assert sorted(manifest.files) == [
        "bm25s/data.csc.index.npy",
        "bm25s/indices.csc.index.npy",
        "bm25s/indptr.csc.index.npy",
        "bm25s/params.index.json",
        "bm25s/vocab.index.json",
    ]
    assert all(set(v) == {"bytes", "sha256"} for v in manifest.files.values())


def test_lazy_index_and_expected_corpus(bm25: BM25Retriever, tmp_path: Path) -> None:
    bm25.save(tmp_path / "idx")
    corpus_file = write_corpus(CORPUS, tmp_path / "corpus.jsonl")
    # by path and by fingerprint: both match
    for expected in (str(corpus_file), corpus_fingerprint(CORPUS)):
        lazy = BM25Retriever(index=str(tmp_path / "idx"), expected_corpus=expected)
        assert lazy._bm25 is None  # nothing read until the first search
        assert _ids(lazy.search(["goldfish"], k=1)[0]) == ["fish"]
    # the corpus changed since the index was built -> one clear line
    changed = write_corpus(CORPUS[:3], tmp_path / "changed.jsonl")
    stale = BM25Retriever(index=str(tmp_path / "idx"), expected_corpus=str(changed))
    with pytest.raises(IndexMismatchError, match="has corpus_fingerprint=") as info:
        stale.search(["cat"], k=1)
    assert "\n" not in str(info.value)


def test_loading_another_retrievers_index_fails(tmp_path: Path) -> None:
    Manifest(retriever="dense", encoder="e5", corpus_fingerprint="0" * 64, passage_count=1).write(
        tmp_path / "dense"
    )
    with pytest.raises(
        IndexMismatchError, match="has retriever='dense' but the recipe expects retriever='bm25'"
    ):
        BM25Retriever.load(tmp_path / "dense")
    with pytest.raises(IndexNotFoundError, match="index folder not found"):
        BM25Retriever(index=str(tmp_path / "missing")).search(["x"], k=1)


def test_argument_errors(bm25: BM25Retriever) -> None:
    with pytest.raises(ValueError, match="unknown BM25 method 'okapi'; allowed: lucene"):
        BM25Retriever(method="okapi")
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        bm25.search(["cat"], k=0)
    with pytest.raises(RuntimeError, match="no index"):
        BM25Retriever().search(["cat"], k=1)
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever().build([])


def test_real_flashrag_sample(shared_data: Path, tmp_path: Path) -> None:
    passages = read_corpus(shared_data / "wiki_corpus1000_flashrag.jsonl")
    retriever = BM25Retriever()
    retriever.build(passages)
    queries = [
        "Which lobbyist worked for Genentech and Roche?",
        "Frick union wage negotiations at the steel plant",
    ]
    hits = retriever.search(queries, k=5)
    assert hits[0][0].passage.title == "Evan Morris"
    assert hits[1][0].passage.title == "Andrew Carnegie"
    retriever.save(tmp_path / "wiki")
    assert BM25Retriever.load(tmp_path / "wiki").search(queries, k=5) == hits
    assert json.loads((tmp_path / "wiki" / "manifest.json").read_text())["passage_count"] == 1000
