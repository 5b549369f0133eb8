"""Hybrid retrieval: reciprocal rank fusion (RRF) of two or more retrievers.

RRF (Cormack, Clarke and Buettcher, SIGIR 2009): each passage scores
``sum over retrievers r of 1 / (k + rank_r(passage))`` with 1-based ranks, counting only the
retrievers that returned it; ``k = 60`` as in the paper. Passages are fused by id. Ties are
broken by the best single rank the passage reached in any child, then by id, so the order is
deterministic whatever order the children are listed in.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from lit_rag.retrieval.base import Hit, Retriever
from lit_rag.types import Passage

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


class HybridRetriever(Retriever):
    """Reciprocal rank fusion of two or more retrievers (e.g. bm25 + dense).

    Args:
        retrievers: The retrievers to fuse, at least two; each searches its own index.
        k: RRF constant added to every 1-based rank (60 in the RRF paper).
        depth: How many hits to ask each retriever for; raised to the requested ``k`` of a
            search when that is larger.
    """

    kind = "hybrid"

    def __init__(self, retrievers: list[Retriever], k: int = 60, depth: int = 100) -> None:
        if len(retrievers) < 2:
            raise ValueError(f"retrievers: got {len(retrievers)}; hybrid fuses two or more")
        if k < 0:
            raise ValueError(f"k: got {k}; the RRF constant must be >= 0")
        if depth < 1:
            raise ValueError(f"depth: got {depth}; expected >= 1")
        self.retrievers = list(retrievers)
        self.k = k
        self.depth = depth

    def build(self, passages: list[Passage]) -> None:
        """Build every child over the same passages."""
        for child in self.retrievers:
            child.build(passages)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` fused hits per query; an empty query gives no hits."""
        if k < 1 or not queries:
            return [[] for _ in queries]
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

    def save(self, directory: str | Path) -> None:
        """Write one subfolder per child (``0-bm25``, ``1-dense``, ...) and a manifest."""
        from lit_rag.retrieval.corpus import corpus_fingerprint
        from lit_rag.retrieval.manifest import Manifest

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = [f"{i}-{c.kind or type(c).__name__}" for i, c in enumerate(self.retrievers)]
        for name, child in zip(names, self.retrievers):
            child.save(directory / name)
        children = [
            {"folder": n, "kind": c.kind, "class": f"{type(c).__module__}.{type(c).__qualname__}"}
            for n, c in zip(names, self.retrievers)
        ]
        settings = {"k": self.k, "depth": self.depth, "children": children}
        passages = getattr(self.retrievers[0], "passages", None) or []
        Manifest(
            retriever=self.kind,
            encoder=None,
            corpus_fingerprint=corpus_fingerprint(passages) if passages else "",
            passage_count=len(passages),
            settings=settings,
        ).write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> HybridRetriever:
        """Read a folder written by :meth:`save`, loading each child with its own class."""
        from lit_rag.retrieval.manifest import Manifest

        directory = Path(directory)
        manifest = Manifest.read(directory)  # IndexNotFoundError when the folder is not an index
        manifest.check({"retriever": cls.kind}, where=directory)
        settings = manifest.settings
        children = []
        for child in settings["children"]:
            module_name, _, attr = child["class"].rpartition(".")
            child_cls = getattr(importlib.import_module(module_name), attr)
            children.append(child_cls.load(directory / child["folder"]))
        return cls(children, k=settings["k"], depth=settings["depth"])

