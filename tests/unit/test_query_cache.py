"""QueryCache: repeated (query, k) pairs cost one search; new queries go in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rag.retrieval.base import Hit, Retriever
from lit_rag.retrieval.cache import QueryCache
from lit_rag.types import Passage


class CountingRetriever(Retriever):
    """Returns one hit whose passage text echoes the query; records every batch it gets."""

    kind = "counting"

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def build(self, passages: list[Passage]) -> None:
        pass

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        return [[Hit(Passage(q, q, f"about {q}"), score=1.0, rank=0)] for q in queries]

    def save(self, directory: str | Path) -> None:
        pass

    @classmethod
    def load(cls, directory: str | Path) -> CountingRetriever:
        return cls()


def test_repeats_cost_one_search_in_one_batch() -> None:
    inner = CountingRetriever()
    cache = QueryCache(inner)
    # "a" twice in one batch: one search for ["a", "b"]; misses 2 (a, b), hits 1 (second a)
    out = cache.search(["a", "b", "a"], k=3)
    assert inner.calls == [(["a", "b"], 3)]
    assert [hits[0].passage.id for hits in out] == ["a", "b", "a"]
    assert (cache.misses, cache.hits) == (2, 1)
    # next turn: "b" cached, only "c" is new -> one call with ["c"]; misses 3, hits 2
    out = cache.search(["b", "c"], k=3)
    assert inner.calls[-1] == (["c"], 3)
    assert [hits[0].passage.id for hits in out] == ["b", "c"]
    assert (cache.misses, cache.hits) == (3, 2)
    # everything cached -> no call at all
    cache.search(["c", "a"], k=3)
    assert len(inner.calls) == 2 and len(cache) == 3


def test_k_is_part_of_the_key_and_clear_forgets() -> None:
    inner = CountingRetriever()
    cache = QueryCache(inner)
    cache.search(["a"], k=3)
    cache.search(["a"], k=5)  # another k is another search
    assert inner.calls == [(["a"], 3), (["a"], 5)]
    cache.clear()  # new episode
    assert len(cache) == 0
    cache.search(["a"], k=3)
    assert len(inner.calls) == 3 and cache.misses == 3
    cache.reset_counters()
    assert (cache.hits, cache.misses) == (0, 0)


def test_cached_lists_are_not_shared_with_callers() -> None:
    cache = QueryCache(CountingRetriever())
    first = cache.search(["a"], k=1)
    first[0].clear()  # a caller mutating its result must not empty the cache
    assert len(cache.search(["a"], k=1)[0]) == 1


def test_retriever_returning_wrong_count_fails() -> None:
    class Broken(CountingRetriever):
        def search(self, queries: list[str], k: int) -> list[list[Hit]]:
            return []

    with pytest.raises(ValueError, match="returned 0 result lists for 2 queries"):
        QueryCache(Broken()).search(["a", "b"], k=1)


def test_with_bm25() -> None:
    from lit_rag.retrieval.bm25 import BM25Retriever

    bm25 = BM25Retriever(stopwords=None, stemmer=None)
    bm25.build([Passage("x", "", "red apple"), Passage("y", "", "green pear")])
    cache = QueryCache(bm25)
    first, empty, again = cache.search(["apple", "", "apple"], k=2)
    assert [h.passage.id for h in first] == ["x"] and empty == [] and again == first
    assert (cache.misses, cache.hits) == (2, 1)
