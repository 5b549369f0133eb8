"""BM25 over a corpus with bm25s (scores precomputed into a sparse matrix).

bm25s stores each token's BM25 score per document in a CSC matrix, so a query costs a sum of
sparse rows; the matrix files are memory-mapped on load, so a large index opens instantly and
shares pages between processes. Tokenization: a regex word splitter (two or more word
characters), optional lowercasing, optional stopword removal and Snowball stemming via
PyStemmer when it is installed (silently off otherwise; the manifest records what was used, and
loading an index that was stemmed on a machine without PyStemmer fails with one line).

Like Lucene, a query returns only the passages that contain at least one of its terms, so an
empty query, or one made only of stopwords or unknown words, gets no hits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lit_rag.retrieval.base import Hit, Retriever
from lit_rag.retrieval.corpus import corpus_fingerprint, read_corpus, write_corpus
from lit_rag.retrieval.manifest import Manifest
from lit_rag.types import Passage

PASSAGES_NAME = "passages.jsonl"
BM25S_DIR = "bm25s"
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _make_stemmer(name: str | None) -> Any | None:
    """A PyStemmer ``stemWords`` callable for language ``name``, or None when unavailable."""
    if name is None:
        return None
    try:
        import Stemmer
    except ImportError:
        return None
    try:
        return Stemmer.Stemmer(name).stemWords
    except KeyError:
        allowed = ", ".join(Stemmer.algorithms())
        raise ValueError(f"unknown stemmer '{name}'; PyStemmer knows: {allowed}") from None


def _looks_like_fingerprint(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class BM25Retriever(Retriever):
    """Sparse BM25 retriever (bm25s).

    Args:
        index: Folder of a saved index; loaded (and checked) on the first search.
        k1: Term-frequency saturation.
        b: Length normalization.
        method: BM25 variant, one of ``lucene``, ``robertson``, ``atire``, ``bm25l``, ``bm25+``.
        lowercase: Lowercase text before tokenizing.
        stopwords: Stopword list language (``"en"``) or None to keep every word.
        stemmer: Snowball language for PyStemmer (``"english"``) or None; ignored when
            PyStemmer is not installed.
        expected_corpus: Corpus the index must have been built from, as a corpus file path or
            its :func:`corpus_fingerprint`; checked when ``index`` is loaded.
    """

    kind = "bm25"
    #: progress bars while building (``lit-rag index build`` turns them on)
    show_progress: bool = False

    def __init__(
        self,
        index: str | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        lowercase: bool = True,
        stopwords: str | None = "en",
        stemmer: str | None = "english",
        expected_corpus: str | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown BM25 method '{method}'; allowed: {', '.join(METHODS)}")
        self.index = index
        self.expected_corpus = expected_corpus
        self._stem = _make_stemmer(stemmer)
        self.settings: dict[str, Any] = {
            "k1": float(k1),
            "b": float(b),
            "method": method,
            "lowercase": bool(lowercase),
            "stopwords": stopwords,
            "stemmer": stemmer if self._stem is not None else None,
        }
        self.passages: list[Passage] = []
        self.manifest: Manifest | None = None
        self._bm25: Any = None

    # ------------------------------------------------------------------ tokenization

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        if not texts:
            return []
        tokens = bm25s.tokenize(
            texts,
            lower=self.settings["lowercase"],
            stopwords=self.settings["stopwords"],
            stemmer=self._stem,
            return_ids=False,
            show_progress=False,
        )
        return [list(t) for t in tokens]

    # ------------------------------------------------------------------ lifecycle

    def build(self, passages: list[Passage]) -> None:
        """Index ``passages`` (title and text together) in memory."""
        import bm25s

        if not passages:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        self.passages = list(passages)
        settings = self.settings
        bm25 = bm25s.BM25(k1=settings["k1"], b=settings["b"], method=settings["method"])
        bm25.index(self._tokenize([f"{p.title}\n{p.text}" for p in self.passages]),
                   show_progress=self.show_progress)
        self._bm25 = bm25
        self.manifest = Manifest(
            retriever=self.kind,
            encoder=None,
            corpus_fingerprint=corpus_fingerprint(self.passages),
            passage_count=len(self.passages),
            settings=dict(self.settings),
        )

    def save(self, directory: str | Path) -> None:
        """Write the bm25s matrices, ``passages.jsonl`` and ``manifest.json`` to ``directory``."""
        if self._bm25 is None or self.manifest is None:
            raise RuntimeError("nothing to save: call build(passages) (or load an index) first")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(directory / BM25S_DIR), show_progress=False)
        write_corpus(self.passages, directory / PASSAGES_NAME)
        self.manifest.write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> BM25Retriever:
        """Open an index written by :meth:`save`; the score matrices are memory-mapped.

        Tokenization settings come from the manifest, so queries are tokenized as the corpus was.

        Raises:
            IndexNotFoundError: ``directory`` or its manifest is missing.
            IndexMismatchError: The folder holds another retriever's index.
        """
        retriever = cls()
        retriever._load(directory)
        return retriever

    def _load(self, directory: str | Path) -> None:
        import bm25s

        manifest = Manifest.read(directory)
        manifest.check({"retriever": self.kind}, where=directory)
        settings = manifest.settings
        stemmer = settings.get("stemmer")
        self._stem = _make_stemmer(stemmer)
        if stemmer is not None and self._stem is None:
            raise RuntimeError(
                f"index {directory} was built with stemmer='{stemmer}' but PyStemmer is not "
                "installed; pip install PyStemmer or rebuild the index with stemmer=None"
            )
        self.settings = dict(settings)
        self._bm25 = bm25s.BM25.load(str(Path(directory) / BM25S_DIR), mmap=True,
                                     show_progress=False)
        self.passages = read_corpus(Path(directory) / PASSAGES_NAME, format="litrag")
        self.manifest = manifest

    def _ensure_loaded(self) -> None:
        if self._bm25 is not None:
            return
        if self.index is None:
            raise RuntimeError("BM25Retriever has no index: pass index=PATH or call build()")
        self._load(self.index)
        assert self.manifest is not None
        expected = self.expected_corpus
        if expected is not None and not _looks_like_fingerprint(expected):
            expected = corpus_fingerprint(read_corpus(expected))
        self.manifest.check({"corpus_fingerprint": expected}, where=self.index)

    # ------------------------------------------------------------------ search

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` passages per query in one batched bm25s call.

        ``k`` is clipped to the corpus size; a query with no indexed term gets ``[]``. Ties are
        broken by corpus order, so results are deterministic.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self._ensure_loaded()
        vocab = self._bm25.vocab_dict
        tokens = [[t for t in q if t in vocab] for q in self._tokenize(list(queries))]
        results: list[list[Hit]] = [[] for _ in queries]
        todo = [i for i, t in enumerate(tokens) if t]
        if not todo:
            return results
        k = min(k, len(self.passages))
        docs, scores = self._bm25.retrieve([tokens[i] for i in todo], k=k, show_progress=False,
                                           n_threads=1)
        for i, row_docs, row_scores in zip(todo, np.asarray(docs), np.asarray(scores)):
            ranked = sorted(
                ((float(s), int(d)) for d, s in zip(row_docs, row_scores) if s > 0),
                key=lambda pair: (-pair[0], pair[1]),
            )
            results[i] = [
                Hit(passage=self.passages[d], score=s, rank=r) for r, (s, d) in enumerate(ranked)
            ]
        return results
