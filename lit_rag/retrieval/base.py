"""Retriever bases: batches of queries -> ranked passages (:class:`Retriever`), most of them
over an index saved on disk (:class:`IndexedRetriever`).

Every index folder holds ``manifest.json`` (see :mod:`lit_rag.retrieval.manifest`) beside
the retriever's own files; loading checks the manifest against what the recipe expects.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lit_rag.types import Passage


@dataclass(frozen=True)
class Hit:
    """One retrieved passage with its score (higher is better) and 0-based rank."""

    passage: Passage
    score: float
    rank: int


class Retriever(ABC):
    """Searches a corpus: ``search(queries, k)`` is all every retriever does.

    What else a retriever can do is declared here, on the class, never probed:

    - ``builds_index``: it builds an index over passages and saves it to a folder that it loads
      later (:class:`IndexedRetriever`); ``lit-rag index build`` and a recipe's ``corpus:``
      accept only these. A retriever that asks a service (``http``) leaves it False.
    - :meth:`parts`: the retrievers it is made of (a fusion of two returns itself and both).
    - :meth:`passage_count`: how many passages it searches, when it knows.
    - ``show_progress``: show progress bars while building.
    """

    #: registered name, written into the manifest
    kind: str = ""
    #: True for a retriever with ``build`` / ``save`` / ``load`` (:class:`IndexedRetriever`)
    builds_index: ClassVar[bool] = False
    #: show progress bars while building an index (``lit-rag index build`` sets it)
    show_progress: bool = False

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query, best first (fewer when the corpus is smaller)."""

    def parts(self) -> list[Retriever]:
        """This retriever and the ones it is made of (each gets ``show_progress``)."""
        return [self]

    def passage_count(self) -> int | None:
        """How many passages it searches; None when it cannot tell (a remote service)."""
        return None


class IndexedRetriever(Retriever):
    """A retriever over an index it builds and saves itself.

    Lifecycle: ``build(passages)`` then ``save(dir)``; later ``load(dir)`` (a classmethod)
    and ``search(queries, k)``. A recipe gives ``index: PATH`` to the constructor and the
    index is loaded on first search.
    """

    builds_index: ClassVar[bool] = True
    #: the passages it indexes, in index order (filled by ``build`` and ``load``)
    passages: list[Passage]

    def passage_count(self) -> int | None:
        return len(getattr(self, "passages", None) or [])

    @abstractmethod
    def build(self, passages: list[Passage]) -> None:
        """Index ``passages`` in memory."""

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the index and its manifest to ``directory``."""

    @classmethod
    @abstractmethod
    def load(cls, directory: str | Path) -> IndexedRetriever:
        """Read an index written by :meth:`save`.

        A retriever whose index needs a model may take keyword options (``encoder``,
        ``trust_manifest_encoder``); :func:`open_index` passes the ones ``load`` accepts.
        """


def check_search_args(queries: list[str], k: int) -> None:
    """The checks every ``search`` makes before it touches an index.

    Raises:
        ValueError: ``k < 1``, or a query that is not valid Unicode text: a lone surrogate such
            as ``'\\udcff'``, which is how Python decodes invalid UTF-8 bytes on a command line.
            The message names the query.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for query in queries:
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"query {query[:120]!r} holds {query[err.start]!r} "
                f"at character {err.start}, a lone "
                "surrogate (invalid UTF-8 bytes); queries must be valid Unicode text"
            ) from None


def open_index(directory: str | Path, **options: Any) -> IndexedRetriever:
    """Open an index folder with the registered retriever its manifest names.

    The kind is looked up among registered retrievers only (:func:`lit_rag.registry.load`):
    an index is data and never chooses what gets imported.

    Args:
        directory: The index folder.
        **options: Keyword options for the retriever's ``load`` (``encoder``,
            ``trust_manifest_encoder``); each is passed only to a ``load`` that accepts it.

    Raises:
        IndexNotFoundError: No index at ``directory``.
        IndexCorruptError: The manifest names a retriever kind that is not installed.
    """
    from lit_rag import registry
    from lit_rag.retrieval.manifest import MANIFEST_NAME, IndexCorruptError, Manifest

    manifest = Manifest.read(directory)
    installed = registry.available("retriever")
    if manifest.retriever not in installed:
        raise IndexCorruptError(
            f"{Path(directory) / MANIFEST_NAME}: retriever {manifest.retriever!r} is not an "
            f"installed retriever; installed: {', '.join(installed) or 'none'} (an index names "
            "a registered retriever, never a module to import)"
        )
    cls = registry.load("retriever", manifest.retriever)
    if not (isinstance(cls, type) and issubclass(cls, Retriever) and cls.builds_index):
        raise IndexCorruptError(
            f"{Path(directory) / MANIFEST_NAME}: retriever {manifest.retriever!r} builds no index "
            "of its own, so no index folder can name it"
        )
    return call_load(cls, directory, **options)


def call_load(cls: type, directory: str | Path, **options: Any) -> IndexedRetriever:
    """``cls.load(directory, **accepted)``: the ``options`` its ``load`` signature names."""
    accepted = inspect.signature(cls.load).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return cls.load(directory, **options)
    return cls.load(directory, **{k: v for k, v in options.items() if k in accepted})
