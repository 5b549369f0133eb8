"""Hybrid retrieval: reciprocal rank fusion (RRF) of two or more retrievers.

RRF (Cormack, Clarke and Buettcher, SIGIR 2009): each passage scores
``sum over retrievers r of 1 / (k + rank_r(passage))`` with 1-based ranks, counting only the
retrievers that returned it; ``k = 60`` as in the paper. Passages are fused by id. Ties are
broken by the best single rank the passage reached in any child, then by id, so the order is
deterministic whatever order the children are listed in.

A saved hybrid index is one folder per child (``0-bm25``, ``1-dense``) and a manifest naming
each child's folder and registered kind. Loading resolves those kinds through the registry only
and opens only folders directly inside the index, so the manifest cannot choose an import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lit_rag.api import (
    MANIFEST_NAME,
    Hit,
    IndexCorruptError,
    IndexedRetriever,
    Manifest,
    Passage,
    Retriever,
    check_search_args,
    open_index,
)

#: a child folder is a plain name inside the hybrid index folder (no separators, no "..")
_FOLDER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_REBUILD = "rebuild the index (lit-rag index build)"


def reciprocal_rank_fusion(rankings: list[list[Hit]], k: float = 60) -> list[Hit]:
    """Fuse several rankings of one query into one, best first.

    Example:
        Rankings ``[a, b]`` and ``[b, c]`` with ``k = 60``: ``b`` scores 1/62 + 1/61,
        ``a`` 1/61, ``c`` 1/62, so the fused order is ``b, a, c``.
    """
    scores: dict[str, float] = {}
    best_rank: dict[str, int] = {}
    passages: dict[str, Passage] = {}
    for hits in rankings:
        for position, hit in enumerate(hits, start=1):
            pid = hit.passage.id
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (k + position)
            best_rank[pid] = min(best_rank.get(pid, position), position)
            passages.setdefault(pid, hit.passage)
    order = sorted(scores, key=lambda pid: (-scores[pid], best_rank[pid], pid))
    return [Hit(passage=passages[pid], score=scores[pid], rank=i) for i, pid in enumerate(order)]


class HybridRetriever(IndexedRetriever):
    """Reciprocal rank fusion of two or more retrievers (e.g. bm25 + dense).

    Args:
        retrievers: The retrievers to fuse, at least two; each searches its own index.
        k: RRF constant added to every 1-based rank (60 in the RRF paper).
        depth: How many hits to ask each retriever for; raised to the requested ``k`` of a
            search when that is larger.
        index: With ``corpus``: the hybrid index folder to build when it does not exist yet
            (children ``0-bm25``, ``1-dense``, ... inside it, which the children's own ``index``
            name); the children search it as they do any index.
        corpus: Build ``index`` from this corpus (a corpus file, or ``synthetic[:SEED]``) on
            first use when it is missing; an existing index is used as it is.
    """

    kind = "hybrid"
    #: each child keeps the passages in its own folder
    stores_passages = False

    def __init__(
        self,
        retrievers: list[Retriever],
        k: int = 60,
        depth: int = 100,
        index: str | None = None,
        corpus: str | None = None,
    ) -> None:
        if len(retrievers) < 2:
            raise ValueError(f"retrievers: got {len(retrievers)}; hybrid fuses two or more")
        if k < 0:
            raise ValueError(f"k: got {k}; the RRF constant must be >= 0")
        if depth < 1:
            raise ValueError(f"depth: got {depth}; expected >= 1")
        super().__init__(index, corpus)
        self.retrievers = list(retrievers)
        self.k = k
        self.depth = depth
        self._index_checked = False

    @property
    def passages(self) -> list[Passage]:  # type: ignore[override]
        """The first child's passages (every child indexes the same ones)."""
        first = self.retrievers[0]
        return first.passages if isinstance(first, IndexedRetriever) else []

    def passage_count(self) -> int | None:
        return self.retrievers[0].passage_count()

    def parts(self) -> list[Retriever]:
        return [self, *self.retrievers]

    @property
    def settings(self) -> dict[str, Any]:  # type: ignore[override]
        """What the manifest records: ``k``, ``depth``, and each child's folder and registered
        kind (never a dotted class path, which would let an index choose an import)."""
        children = [
            {"folder": f"{i}-{c.kind or type(c).__name__}", "kind": c.kind}
            for i, c in enumerate(self.retrievers)
        ]
        return {"k": self.k, "depth": self.depth, "children": children}

    def _indexed(self) -> list[IndexedRetriever]:
        """The children, when every one builds an index (what build and save need)."""
        searching = [c.kind or type(c).__name__ for c in self.retrievers if not c.builds_index]
        if searching:
            raise ValueError(
                f"retrievers: {', '.join(searching)} builds no index; a hybrid index "
                "fuses retrievers with an index of their own (bm25, dense, ...)"
            )
        return self.retrievers  # type: ignore[return-value]

    def build_state(self, passages: list[Passage]) -> None:
        """Build every child over the same passages."""
        for child in self._indexed():
            child.build(passages)

    def save_state(self, directory: Path) -> list[str]:
        """Save each child into its own subfolder (``0-bm25``, ``1-dense``, ...), with its own
        manifest; the hybrid's manifest records no file of its own."""
        for spec, child in zip(self.settings["children"], self._indexed(), strict=True):
            child.save(directory / spec["folder"])
        return []

    def ensure_loaded(self) -> None:
        """With ``corpus``, build the index when its folder is missing (once); the children
        load their own folders on their first search."""
        if self.corpus is not None and not self._index_checked:
            from lit_rag.api import build_missing_index

            build_missing_index(self.index, self.corpus, self)
            self._index_checked = True  # built or found: the children hold or load it now

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` fused hits per query; an empty query gives no hits.

        Raises:
            ValueError: ``k < 1``, or a query with a lone surrogate (names the query).
        """
        check_search_args(queries, k)
        if not queries:
            return []
        self.ensure_loaded()
        depth = max(self.depth, k)
        per_child = [child.search(queries, depth) for child in self.retrievers]
        results = []
        for i, query in enumerate(queries):
            if not query.strip():
                results.append([])
                continue
            fused = reciprocal_rank_fusion([hits[i] for hits in per_child], self.k)
            results.append(fused[:k])
        return results

    @classmethod
    def load(
        cls, directory: str | Path, encoder: str | None = None, trust_manifest_encoder: bool = False
    ) -> HybridRetriever:
        """Read a folder written by :meth:`save`; each child opens with its registered kind.

        Args:
            directory: The index folder.
            encoder: Passed to each child whose ``load`` takes it (the dense child).
            trust_manifest_encoder: Likewise (see
                :class:`~lit_rag.plugins.retrievers.dense.DenseRetriever`).

        Raises:
            IndexNotFoundError: No index at ``directory``.
            IndexCorruptError: A child folder or kind that is not allowed or not installed, or a
                child built over another corpus than the hybrid records.
        """
        directory = Path(directory)
        manifest = Manifest.read(directory)  # IndexNotFoundError when the folder is not an index
        manifest.check({"retriever": cls.kind}, where=directory)
        options = {"encoder": encoder, "trust_manifest_encoder": trust_manifest_encoder}
        children = []
        for folder, kind in _children(manifest, directory):
            child_dir = directory / folder
            child_manifest = Manifest.read(child_dir)
            if child_manifest.retriever != kind:
                raise IndexCorruptError(
                    f"{child_dir / MANIFEST_NAME}: retriever {child_manifest.retriever!r}, but "
                    f"{directory / MANIFEST_NAME} records kind {kind!r} for it; {_REBUILD}"
                )
            _check_same_corpus(manifest, child_manifest, directory, child_dir)
            children.append(open_index(child_dir, **options))
        try:
            retriever = cls(
                children,
                k=manifest.settings.get("k", 60),
                depth=manifest.settings.get("depth", 100),
            )
        except (TypeError, ValueError) as err:
            raise IndexCorruptError(
                f"{directory / MANIFEST_NAME}: bad settings ({err}); {_REBUILD}"
            ) from None
        retriever.manifest = manifest
        return retriever


def _children(manifest: Manifest, directory: Path) -> list[tuple[str, str]]:
    """``(folder, kind)`` of each child, checked: plain folder names, string kinds.

    The ``class`` a lit-rag 0.1.0 manifest also wrote is ignored: the kind, looked up in the
    registry, decides the class.
    """
    where = directory / MANIFEST_NAME
    spec = manifest.settings.get("children")
    if not isinstance(spec, list) or len(spec) < 2:
        raise IndexCorruptError(
            f"{where}: settings['children'] must list two or more children, got {spec!r:.60}; "
            f"{_REBUILD}"
        )
    out = []
    for child in spec:
        folder = child.get("folder") if isinstance(child, dict) else None
        kind = child.get("kind") if isinstance(child, dict) else None
        if (
            not isinstance(folder, str)
            or not _FOLDER.fullmatch(folder)
            or (directory / folder).is_symlink()
        ):
            raise IndexCorruptError(
                f"{where}: child folder {folder!r} must be a plain folder name inside the index "
                f"(letters, digits, _ . -; not a link); {_REBUILD}"
            )
        if not isinstance(kind, str) or not kind:
            raise IndexCorruptError(
                f"{where}: child {folder!r} needs a retriever kind, got {kind!r}"
            )
        out.append((folder, kind))
    return out


def _check_same_corpus(parent: Manifest, child: Manifest, directory: Path, child_dir: Path) -> None:
    """Each child must index the corpus the hybrid records (same count and fingerprint; a
    fingerprint recorded as ``""``, by a retriever that keeps no passages, is not compared)."""
    pairs: list[tuple[str, Any, Any]] = [
        ("passage_count", child.passage_count, parent.passage_count),
        ("corpus_fingerprint", child.corpus_fingerprint, parent.corpus_fingerprint),
    ]
    for key, have, want in pairs:
        if "" not in (have, want) and have != want:
            raise IndexCorruptError(
                f"{child_dir / MANIFEST_NAME}: {key}={_short(have)} but "
                f"{directory / MANIFEST_NAME} records {key}={_short(want)} (a child from another "
                f"build); {_REBUILD}"
            )


def _short(value: Any) -> str:
    """A fingerprint as its first 12 hex digits (enough to tell two apart), anything else as is."""
    return f"{value[:12]}..." if isinstance(value, str) and len(value) > 16 else repr(value)
