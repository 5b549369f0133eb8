"""Retriever bases: batches of queries -> ranked passages (:class:`Retriever`), most of them
over an index saved on disk (:class:`IndexedRetriever`, the template that owns an index
folder's lifecycle).

Every index folder holds ``manifest.json`` (see :mod:`lit_rag.retrieval.manifest`) and
``passages.jsonl`` beside the retriever's own files; loading checks the folder against the
manifest, and the manifest against what the recipe expects.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from lit_rag.retrieval.corpus import corpus_fingerprint, write_corpus
from lit_rag.retrieval.manifest import (
    MANIFEST_NAME,
    PASSAGES_NAME,
    REBUILD,
    IndexCorruptError,
    Manifest,
    parse_json,
)
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
    """A retriever over an index folder it builds, saves and loads: the base owns that lifecycle,
    a subclass writes the method (the template method, as Lightning's hooks).

    A subclass sets ``kind`` (its registered name) and, in ``__init__``, :attr:`settings` (what
    the manifest records), calls ``super().__init__(index, corpus)``, and writes four methods:

    - :meth:`build_state`: turn the passages into its own state (a matrix, a faiss index);
    - :meth:`rank`: each query's best ``(row, score)`` pairs, ``row`` a position in
      :attr:`passages`;
    - :meth:`save_state` / :meth:`load_state`: write its own files into the index folder / read
      them back (:meth:`read_json`, :meth:`write_json` and :meth:`require` help).

    It may override :meth:`adopt_manifest` to check or take more of an index's manifest before
    any file is read (bm25 its tokenizer settings, dense its encoder).

    The base does the rest, the same for every retriever:

    - ``build(passages)`` refuses an empty corpus, calls ``build_state``, keeps the passages and
      describes the index in :attr:`manifest`;
    - ``save(directory)`` calls ``save_state``, writes ``passages.jsonl``, and the manifest last,
      recording the size and SHA-256 of each file ``save_state`` names;
    - ``load(directory)``, or the first ``search`` of a retriever given ``index=PATH`` (built
      first from ``corpus`` when the folder is missing), verifies the folder before anything of
      the subclass reads it (:meth:`read_index`), then calls ``load_state``;
    - ``search(queries, k)`` checks its arguments, gives a blank query no hits, clips ``k`` to
      the corpus and turns ``rank``'s rows into :class:`Hit`.

    An index folder is data: the base reads JSON and the passages, never a pickle, and nothing
    read from the folder chooses what is imported or run. A retriever made of retrievers
    (``hybrid``) keeps no passages of its own (``stores_passages = False``) and overrides
    ``load`` and ``search``; a subclass may override any public method.

    Args:
        index: The index folder to search, loaded on the first search.
        corpus: With ``index``: build the index from this corpus (a corpus file or
            ``synthetic[:SEED]``) on first use when the folder is missing; an existing index is
            used as it is.
    """

    builds_index: ClassVar[bool] = True
    #: False for a retriever that keeps no passages of its own (a fusion searches its children's)
    stores_passages: ClassVar[bool] = True
    #: the build settings the manifest records (set in ``__init__``; taken back on load)
    settings: Mapping[str, Any] = MappingProxyType({})
    #: the encoder model the manifest records (a dense retriever's); None for the others
    encoder: str | None = None
    index: str | None = None
    corpus: str | None = None
    #: how the index was built: set by ``build``, ``load`` and ``save``; None until then
    manifest: Manifest | None = None
    #: the passages it indexes, in index order (filled by ``build`` and ``load``)
    passages: list[Passage]

    def __init__(self, index: str | None = None, corpus: str | None = None) -> None:
        if corpus is not None and index is None:
            raise ValueError("corpus: building a missing index needs index: FOLDER too")
        self.index, self.corpus = index, corpus
        if self.stores_passages:
            self.passages = []

    def passage_count(self) -> int | None:
        return len(getattr(self, "passages", None) or [])

    # -- what a subclass writes ------------------------------------------------------------

    def build_state(self, passages: list[Passage]) -> None:
        """Turn ``passages`` (never empty) into this retriever's own state."""
        raise NotImplementedError(f"{type(self).__name__} must define build_state(passages)")

    def rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """For each query (none blank), up to ``k`` ``(row, score)`` pairs, best first; ``row``
        is the passage's position in :attr:`passages`, ``k`` at most their number."""
        raise NotImplementedError(f"{type(self).__name__} must define rank(queries, k)")

    def save_state(self, directory: Path) -> list[str]:
        """Write this retriever's own files into ``directory``; returns their paths relative to
        it, which the manifest records with their sizes and SHA-256s."""
        raise NotImplementedError(f"{type(self).__name__} must define save_state(directory)")

    def load_state(self, directory: Path) -> None:
        """Read the files :meth:`save_state` wrote. The folder is verified by then, and
        :attr:`manifest`, :attr:`settings` and :attr:`passages` are the index's."""
        raise NotImplementedError(f"{type(self).__name__} must define load_state(directory)")

    def adopt_manifest(self, manifest: Manifest, directory: Path) -> None:
        """Take the settings an index records before any of its files is read.

        The default takes every recorded setting, refusing one of another type than the
        constructor's value (``"lowercase": "yes"`` where a bool belongs). Override it to check
        more, or to take other fields (a dense retriever settles its encoder here).
        """
        for key, value in manifest.settings.items():
            mine = self.settings.get(key)
            if mine is not None and type(value) is not type(mine):
                raise IndexCorruptError(
                    f"{directory / MANIFEST_NAME}: settings['{key}'] must be "
                    f"{type(mine).__name__}, got {value!r:.40}; {REBUILD}"
                )
        self.settings = {**self.settings, **manifest.settings}

    # -- the lifecycle ---------------------------------------------------------------------

    def build(self, passages: list[Passage]) -> None:
        """Index ``passages`` in memory (:meth:`build_state`); :meth:`save` writes the index."""
        if not passages:
            name = self.kind or type(self).__name__
            raise ValueError(f"{name}: cannot build an index over an empty corpus")
        passages = list(passages)
        self.build_state(passages)
        if self.stores_passages:
            self.passages = passages
        self.manifest = self.describe()

    def describe(self) -> Manifest:
        """The manifest of the index this retriever holds (its files are recorded on save)."""
        passages = self.passages
        return Manifest(
            retriever=self.kind,
            encoder=self.encoder,
            corpus_fingerprint=corpus_fingerprint(passages) if passages else "",
            passage_count=len(passages),
            settings=dict(self.settings),
        )

    def save(self, directory: str | Path) -> None:
        """Write the index to ``directory``: the retriever's own files (:meth:`save_state`),
        ``passages.jsonl``, then ``manifest.json``.

        ``lit-rag index build`` saves through :func:`~lit_rag.retrieval.storage.save_index`, into
        a fresh folder swapped into place when complete.
        """
        if not self.passages:
            raise RuntimeError(
                f"{type(self).__name__}: nothing to save; call build(passages) or load an index"
            )
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = self.save_state(directory)
        if self.stores_passages:
            write_corpus(self.passages, directory / PASSAGES_NAME)
        manifest = replace(self.manifest or self.describe(), files={})
        manifest.write(directory, record=files)
        self.manifest = manifest

    @classmethod
    def load(cls, directory: str | Path) -> IndexedRetriever:
        """Read an index written by :meth:`save` into a retriever of default settings, which
        then takes the index's (:meth:`read_index`).

        A retriever whose ``load`` takes keyword options (a dense one's ``encoder``) overrides it;
        :func:`open_index` passes the options ``load`` accepts.
        """
        retriever = cls()
        retriever.read_index(directory)
        return retriever

    def read_index(self, directory: str | Path) -> None:
        """Verify an index folder and read it into this retriever.

        In order: the manifest (:meth:`Manifest.read`), whose ``retriever`` must be ``kind``;
        its settings (:meth:`adopt_manifest`); the passages, whose count and fingerprint must be
        the manifest's (:meth:`Manifest.read_passages`); the size and SHA-256 of every file the
        manifest records (:meth:`Manifest.check_files`); then :meth:`load_state`.

        Raises:
            IndexNotFoundError: No index at ``directory``.
            IndexMismatchError: Another retriever's index, or settings this one cannot use.
            IndexCorruptError: A file disagrees with the manifest or cannot be read; one line
                naming the file.
        """
        directory = Path(directory)
        manifest = Manifest.read(directory)
        manifest.check({"retriever": self.kind}, where=directory)
        self.adopt_manifest(manifest, directory)
        passages = manifest.read_passages(directory) if self.stores_passages else []
        manifest.check_files(directory)
        if self.stores_passages:
            self.passages = passages
        self.manifest = manifest
        try:
            self.load_state(directory)
        except BaseException:
            self.manifest = None  # not loaded: the next search tries again, and fails alike
            raise

    def ensure_loaded(self) -> None:
        """Load the index on first use: build it from ``corpus`` when its folder is missing
        (:func:`~lit_rag.retrieval.storage.build_missing_index`), else read it."""
        if self.manifest is not None:
            return
        if self.index is None:
            raise RuntimeError(
                f"{type(self).__name__} has no index: pass index=PATH or call build()"
            )
        if self.corpus is not None:
            from lit_rag.retrieval.storage import build_missing_index

            build_missing_index(self.index, self.corpus, self)
        if self.manifest is None:  # not just built
            self.read_index(self.index)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query, best first; a blank query gets none, and ``k`` is clipped
        to the corpus. The first search with a query to answer loads the index.

        Raises:
            ValueError: ``k < 1``, or a query that is not valid Unicode (names the query).
        """
        check_search_args(queries, k)
        results: list[list[Hit]] = [[] for _ in queries]
        asked = [i for i, query in enumerate(queries) if query.strip()]
        if not asked:
            return results
        self.ensure_loaded()
        ranked = self.rank([queries[i] for i in asked], min(k, len(self.passages)))
        for i, pairs in zip(asked, ranked, strict=True):
            results[i] = [
                Hit(self.passages[int(row)], float(score), rank)
                for rank, (row, score) in enumerate(pairs)
            ]
        return results

    # -- helpers for save_state / load_state ------------------------------------------------

    def write_json(self, path: Path, value: Any) -> None:
        """Write ``value`` to ``path`` as UTF-8 JSON."""
        path.write_text(json.dumps(value), "utf-8")

    def read_json(self, path: Path, fields: Mapping[str, type] | None = None) -> Any:
        """Read a JSON file of the index; with ``fields``, an object holding each name with a
        value of that type (``{"words": list}``).

        Raises:
            IndexCorruptError: The file is missing, not UTF-8 JSON, or lacks a field (one line
                naming the file).
        """
        if not path.is_file():
            raise IndexCorruptError(f"{path}: missing; {REBUILD}")
        value = parse_json(path.read_bytes(), path, None, "the file")
        wanted = fields or {}
        if wanted and not (
            isinstance(value, dict)
            and all(isinstance(value.get(name), kind) for name, kind in wanted.items())
        ):
            shape = ", ".join(f'"{name}": {kind.__name__}' for name, kind in wanted.items())
            raise IndexCorruptError(f"{path}: expected a JSON object {{{shape}}}; {REBUILD}")
        return value

    def require(self, ok: bool, path: Path, problem: str) -> None:
        """Raise :class:`IndexCorruptError` ``"{path}: {problem}; rebuild the index ..."``
        unless ``ok``: a check in :meth:`load_state` of what the files hold."""
        if not ok:
            raise IndexCorruptError(f"{path}: {problem}; {REBUILD}")


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
