"""``tfidf``: a TF-IDF retriever written against ``lit_rag.api`` alone.

Scores are cosines between l2-normalized TF-IDF vectors: term frequency ``1 + log(tf)``
(``sublinear_tf``) or raw counts, smoothed idf ``log((1 + n) / (1 + df)) + 1``, the weighting
of scikit-learn's ``TfidfVectorizer``. The index is data: ``load`` reads a sparse matrix with
``allow_pickle=False`` and a JSON vocabulary, and checks both against the manifest.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
from scipy import sparse

from lit_rag.api import (
    PASSAGES_NAME,
    Hit,
    IndexCorruptError,
    IndexedRetriever,
    Manifest,
    Passage,
    build_missing_index,
    check_search_args,
    corpus_fingerprint,
    write_corpus,
)

MATRIX_NAME = "matrix.npz"
VOCABULARY_NAME = "vocabulary.json"
_TOKEN = re.compile(r"\w\w+")  # scikit-learn's default token pattern


class TfidfRetriever(IndexedRetriever):
    """TF-IDF cosine search.

    Args:
        index: The index folder to search (loaded on first search).
        corpus: With ``index``: build the index from this corpus on first use when missing.
        lowercase: Lowercase text before tokenizing.
        sublinear_tf: Term frequency ``1 + log(tf)`` instead of ``tf``.
        min_df: Keep words found in at least this many passages.
    """

    kind = "tfidf"

    def __init__(
        self,
        index: str | None = None,
        corpus: str | None = None,
        lowercase: bool = True,
        sublinear_tf: bool = True,
        min_df: int = 1,
    ) -> None:
        if min_df < 1:
            raise ValueError(f"min_df: got {min_df}; expected >= 1")
        if corpus is not None and index is None:
            raise ValueError("corpus: building a missing index needs index: FOLDER too")
        self.index, self.corpus = index, corpus
        self.settings = {
            "lowercase": bool(lowercase),
            "sublinear_tf": bool(sublinear_tf),
            "min_df": int(min_df),
        }
        self.passages: list[Passage] = []
        self.vocabulary: dict[str, int] = {}
        self.idf = np.zeros(0, dtype=np.float32)
        self.matrix: sparse.csr_matrix | None = None

    def _tokens(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower() if self.settings["lowercase"] else text)

    def _vectors(self, texts: list[str]) -> sparse.csr_matrix:
        """l2-normalized TF-IDF rows over the vocabulary (unknown words dropped)."""
        rows, cols, values = [], [], []
        for row, text in enumerate(texts):
            counts: dict[int, int] = {}
            for token in self._tokens(text):
                column = self.vocabulary.get(token)
                if column is not None:
                    counts[column] = counts.get(column, 0) + 1
            for column, count in counts.items():
                tf = 1.0 + math.log(count) if self.settings["sublinear_tf"] else float(count)
                rows.append(row)
                cols.append(column)
                values.append(tf * float(self.idf[column]))
        shape = (len(texts), len(self.vocabulary))
        matrix = sparse.csr_matrix((values, (rows, cols)), shape=shape, dtype=np.float32)
        norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sparse.csr_matrix(sparse.diags(1.0 / norms) @ matrix, dtype=np.float32)

    def build(self, passages: list[Passage]) -> None:
        if not passages:
            raise ValueError("cannot build a TF-IDF index over an empty corpus")
        self.passages = list(passages)
        texts = [f"{p.title}\n{p.text}" for p in self.passages]
        df: dict[str, int] = {}
        for text in texts:
            for token in set(self._tokens(text)):
                df[token] = df.get(token, 0) + 1
        kept = sorted(t for t, n in df.items() if n >= self.settings["min_df"])
        self.vocabulary = {token: i for i, token in enumerate(kept)}
        n = len(texts)
        self.idf = np.array([math.log((1 + n) / (1 + df[t])) + 1.0 for t in kept], dtype=np.float32)
        self.matrix = self._vectors(texts)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        self._ensure_loaded()
        assert self.matrix is not None
        scores = (self._vectors(queries) @ self.matrix.T).toarray()
        results = []
        for query, row in zip(queries, scores):
            if not query.strip():
                results.append([])
                continue
            top = np.argsort(-row, kind="stable")[: min(k, len(self.passages))]
            results.append(
                [
                    Hit(self.passages[i], float(row[i]), rank)
                    for rank, i in enumerate(top)
                    if row[i] > 0
                ]
            )
        return results

    def save(self, directory: str | Path) -> None:
        if self.matrix is None:
            raise RuntimeError("nothing to save: call build(passages) or load an index first")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        sparse.save_npz(directory / MATRIX_NAME, self.matrix, compressed=False)
        (directory / VOCABULARY_NAME).write_text(
            json.dumps({"words": list(self.vocabulary), "idf": self.idf.tolist()}), "utf-8"
        )
        write_corpus(self.passages, directory / PASSAGES_NAME)
        Manifest(
            retriever=self.kind,
            encoder=None,
            corpus_fingerprint=corpus_fingerprint(self.passages),
            passage_count=len(self.passages),
            settings=dict(self.settings),
        ).write(directory, record=[MATRIX_NAME, VOCABULARY_NAME])

    @classmethod
    def load(cls, directory: str | Path) -> TfidfRetriever:
        retriever = cls()
        retriever._load(Path(directory))
        return retriever

    def _load(self, directory: Path) -> None:
        manifest = Manifest.read(directory)
        manifest.check({"retriever": self.kind}, where=directory)
        manifest.check_files(directory)
        self.passages = manifest.read_passages(directory)
        words = json.loads((directory / VOCABULARY_NAME).read_text("utf-8"))
        if not (
            isinstance(words, dict)
            and isinstance(words.get("words"), list)
            and isinstance(words.get("idf"), list)
            and len(words["words"]) == len(words["idf"])
        ):
            raise IndexCorruptError(
                f"{directory / VOCABULARY_NAME}: expected "
                '{"words": [...], "idf": [...]} of equal length'
            )
        matrix = sparse.load_npz(directory / MATRIX_NAME)  # numpy arrays, allow_pickle=False
        manifest.check_rows("the TF-IDF matrix", matrix.shape[0], directory / MATRIX_NAME)
        if matrix.shape[1] != len(words["words"]):
            raise IndexCorruptError(
                f"{directory / MATRIX_NAME}: {matrix.shape[1]} columns but "
                f"{len(words['words'])} words in {VOCABULARY_NAME}"
            )
        self.settings = {**self.settings, **manifest.settings}
        self.vocabulary = {str(w): i for i, w in enumerate(words["words"])}
        self.idf = np.asarray(words["idf"], dtype=np.float32)
        self.matrix = sparse.csr_matrix(matrix, dtype=np.float32)

    def _ensure_loaded(self) -> None:
        if self.matrix is not None:
            return
        if self.index is None:
            raise RuntimeError("TfidfRetriever has no index: pass index=PATH or call build()")
        if self.corpus is not None:
            build_missing_index(self.index, self.corpus, self)
        if self.matrix is None:  # not just built
            self._load(Path(self.index))
