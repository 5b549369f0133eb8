"""Retriever base: batches of queries -> ranked passages (issue 3 builds bm25/dense/hybrid)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lit_rag.types import Passage


class Retriever(ABC):
    """Searches a corpus."""

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[tuple[Passage, float]]]:
        """Top-``k`` passages with scores for each query, best first."""
