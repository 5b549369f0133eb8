"""Per-episode query cache: the same sub-query twice costs one search.

Agents (EVO-RAG, Eval-RAR) often re-issue a sub-query inside one episode or across the samples
of a group. :class:`QueryCache` answers repeated ``(query, k)`` pairs from memory and sends the
new ones to the retriever in one batched call. Call :meth:`QueryCache.clear` between episodes.
"""

from __future__ import annotations

from lit_rag.retrieval.base import Hit, Retriever


class QueryCache:
    """Wraps a :class:`Retriever` with a ``(query, k) -> hits`` memo.

    Args:
        retriever: Any retriever.

    Example:
        ``cache.search(["a", "b", "a"], k=3)`` sends ``["a", "b"]`` in one call
        (misses 2, hits 1); a second ``cache.search(["b"], k=3)`` sends nothing (hits 2).
    """

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self._store: dict[tuple[str, int], list[Hit]] = {}
        self.hits = 0
        self.misses = 0

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query; only queries not seen with this ``k`` reach the retriever.

        Args:
            queries: The queries (repeats allowed, also inside one batch).
            k: Number of hits per query.

        Returns:
            One list of hits per query, in the order of ``queries``.
        """
        new: list[str] = []
        for query in queries:
            if (query, k) in self._store or query in new:
                self.hits += 1
            else:
                new.append(query)
                self.misses += 1
        if new:
            results = self.retriever.search(new, k)
            if len(results) != len(new):
                raise ValueError(
                    f"{type(self.retriever).__name__}.search returned {len(results)} result "
                    f"lists for {len(new)} queries; it must return one per query"
                )
            for query, hits in zip(new, results):
                self._store[(query, k)] = list(hits)
        return [list(self._store[(query, k)]) for query in queries]

    def clear(self) -> None:
        """Forget every cached query (call at the start of an episode); counters are kept."""
        self._store.clear()

    def reset_counters(self) -> None:
        """Set :attr:`hits` and :attr:`misses` back to 0."""
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """Number of cached ``(query, k)`` pairs."""
        return len(self._store)
