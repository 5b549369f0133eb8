"""Retriever base: batches of queries -> ranked passages, over an index saved on disk.

Every index folder holds ``manifest.json`` (see :mod:`lit_rag.retrieval.manifest`) beside
the retriever's own files; loading checks the manifest against what the recipe expects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from lit_rag.types import Passage


@dataclass(frozen=True)
class Hit:
    """One retrieved passage with its score (higher is better) and 0-based rank."""

    passage: Passage
    score: float
    rank: int


class Retriever(ABC):
    """Searches a corpus.

    Lifecycle: ``build(passages)`` then ``save(dir)``; later ``load(dir)`` (a classmethod)
    and ``search(queries, k)``. A recipe gives ``index: PATH`` to the constructor and the
    index is loaded on first search.
    """

    #: registered name, written into the manifest
    kind: str = ""

    @abstractmethod
    def build(self, passages: list[Passage]) -> None:
        """Index ``passages`` in memory."""

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query, best first (fewer when the corpus is smaller)."""

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the index and its manifest to ``directory``."""

    @classmethod
    @abstractmethod
    def load(cls, directory: str | Path) -> Retriever:
        """Read an index written by :meth:`save`."""
