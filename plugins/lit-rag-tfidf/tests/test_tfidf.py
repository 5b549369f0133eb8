"""The TF-IDF weights, checked by hand on a three-passage corpus, and the index folder."""

from __future__ import annotations

import math
import shutil

import pytest
from lit_rag_tfidf import TfidfRetriever

from lit_rag.api import IndexCorruptError, Passage

CORPUS = [
    Passage("a", "", "red apples red"),
    Passage("b", "", "green apples"),
    Passage("c", "", "blue sky"),
]


def test_scores_are_the_cosines_worked_by_hand():
    retriever = TfidfRetriever()
    retriever.build(CORPUS)
    (hits,) = retriever.search(["red"], k=3)
    assert [h.passage.id for h in hits] == ["a"]  # b and c share no word with the query
    # passage a: red tf 2 -> 1 + ln 2, idf ln(4/2) + 1; apples tf 1, idf ln(4/3) + 1
    red = (1 + math.log(2)) * (math.log(4 / 2) + 1)
    apples = math.log(4 / 3) + 1
    assert hits[0].score == pytest.approx(red / math.hypot(red, apples), rel=1e-6)


def test_round_trip_and_min_df(tmp_path):
    retriever = TfidfRetriever(min_df=2)
    retriever.build(CORPUS)
    assert list(retriever.vocabulary) == ["apples"]
    retriever.save(tmp_path)
    loaded = TfidfRetriever.load(tmp_path)
    hits = loaded.search(["apples", "red"], k=3)
    # one word left: a and b are the same unit vector; a tie keeps the corpus order
    assert [(h.passage.id, round(h.score, 6)) for h in hits[0]] == [("a", 1.0), ("b", 1.0)]
    assert hits[1] == []  # red appears in one passage only: dropped by min_df


def test_loaded_on_first_search_and_checked_against_its_manifest(tmp_path):
    for name, min_df in (("idx", 1), ("other", 2)):
        built = TfidfRetriever(min_df=min_df)
        built.build(CORPUS)
        built.save(tmp_path / name)
    lazy = TfidfRetriever(index=str(tmp_path / "idx"))  # nothing read until the first search
    assert [h.passage.id for h in lazy.search(["blue sky"], k=3)[0]] == ["c"]
    # a vocabulary from another build: its size differs from the one the manifest records
    shutil.copy(tmp_path / "other" / "vocabulary.json", tmp_path / "idx" / "vocabulary.json")
    with pytest.raises(IndexCorruptError, match=r"vocabulary.json: \d+ bytes, but .* records"):
        TfidfRetriever.load(tmp_path / "idx")
