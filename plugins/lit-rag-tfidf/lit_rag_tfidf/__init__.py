"""``tfidf``: a TF-IDF retriever written against ``lit_rag.api`` alone.

Scores are cosines between l2-normalized TF-IDF vectors: term frequency ``1 + log(tf)``
(``sublinear_tf``) or raw counts, smoothed idf ``log((1 + n) / (1 + df)) + 1``, the weighting
of scikit-learn's ``TfidfVectorizer``. ``IndexedRetriever`` keeps the index folder (manifest,
passages, checks, loading on first search); this module adds a sparse matrix, read with
``allow_pickle=False``, and a JSON vocabulary.
"""

import re
from pathlib import Path

import numpy as np
from scipy import sparse

from lit_rag.api import IndexedRetriever, Passage

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
        super().__init__(index, corpus)
        self.settings = {
            "lowercase": bool(lowercase),
            "sublinear_tf": bool(sublinear_tf),
            "min_df": int(min_df),
        }
        self.vocabulary: dict[str, int] = {}  # word -> column
        self.idf = np.zeros(0, dtype=np.float32)
        self.matrix = sparse.csr_matrix((0, 0), dtype=np.float32)  # [passages, words]

    def _words(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower() if self.settings["lowercase"] else text)

    def _vectors(self, texts: list[str]) -> sparse.csr_matrix:
        """l2-normalized TF-IDF rows over the vocabulary (unknown words dropped)."""
        rows, cols, values = [], [], []
        for row, text in enumerate(texts):
            known = [self.vocabulary[w] for w in self._words(text) if w in self.vocabulary]
            columns, counts = np.unique(np.array(known, dtype=np.int64), return_counts=True)
            tf = 1.0 + np.log(counts) if self.settings["sublinear_tf"] else counts
            rows += [row] * len(columns)
            cols += columns.tolist()
            values += (tf * self.idf[columns]).tolist()
        shape = (len(texts), len(self.vocabulary))
        matrix = sparse.csr_matrix((values, (rows, cols)), shape=shape, dtype=np.float32)
        norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sparse.csr_matrix(sparse.diags(1.0 / norms) @ matrix, dtype=np.float32)

    def build_state(self, passages: list[Passage]) -> None:
        texts = [f"{p.title}\n{p.text}" for p in passages]
        df: dict[str, int] = {}
        for text in texts:
            for word in set(self._words(text)):
                df[word] = df.get(word, 0) + 1
        kept = sorted(word for word, n in df.items() if n >= self.settings["min_df"])
        self.vocabulary = {word: i for i, word in enumerate(kept)}
        counts = np.array([df[word] for word in kept], dtype=np.float64)
        self.idf = (np.log((1 + len(texts)) / (1 + counts)) + 1.0).astype(np.float32)
        self.matrix = self._vectors(texts)

    def rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        scores = (self._vectors(queries) @ self.matrix.T).toarray()  # [Q, passages] cosines
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: corpus order
        return [
            [(i, row[i]) for i in top if row[i] > 0] for row, top in zip(scores, best, strict=True)
        ]

    def save_state(self, directory: Path) -> list[str]:
        sparse.save_npz(directory / MATRIX_NAME, self.matrix, compressed=False)
        words = {"words": list(self.vocabulary), "idf": self.idf.tolist()}
        self.write_json(directory / VOCABULARY_NAME, words)
        return [MATRIX_NAME, VOCABULARY_NAME]

    def load_state(self, directory: Path) -> None:
        words = self.read_json(directory / VOCABULARY_NAME, {"words": list, "idf": list})
        matrix = sparse.load_npz(directory / MATRIX_NAME)  # numpy arrays, allow_pickle=False
        shape = (len(self.passages), len(words["words"]))
        self.require(
            matrix.shape == shape and len(words["idf"]) == shape[1],
            directory / MATRIX_NAME,
            f"{matrix.shape} matrix for {shape[0]} passages, {shape[1]} words and "
            f"{len(words['idf'])} idf values in {VOCABULARY_NAME}",
        )
        self.vocabulary = {str(word): i for i, word in enumerate(words["words"])}
        self.idf = np.asarray(words["idf"], dtype=np.float32)
        self.matrix = sparse.csr_matrix(matrix, dtype=np.float32)
