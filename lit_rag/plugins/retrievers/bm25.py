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

import json
from pathlib import Path
from typing import Any

import numpy as np

from lit_rag.api import (
    IndexCorruptError,
    IndexedRetriever,
    IndexMismatchError,
    Manifest,
    Passage,
    corpus_fingerprint,
    read_corpus,
)

BM25S_DIR = "bm25s"
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
#: keys bm25s writes into params.index.json; anything else is refused before bm25s sees it
#: (bm25s passes them to ``BM25.__init__``)
BM25S_PARAMS = (
    "k1",
    "b",
    "delta",
    "method",
    "idf_method",
    "dtype",
    "int_dtype",
    "num_docs",
    "version",
    "backend",
    "csc_backend",
)


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


_REBUILD = "rebuild the index (lit-rag index build)"


def _looks_like_fingerprint(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class BM25Retriever(IndexedRetriever):
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
        corpus: Build the index from this corpus (a corpus file, or ``synthetic[:SEED]``) when
            ``index`` does not exist yet, on first use; an existing index is loaded as it is.
    """

    kind = "bm25"

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
        corpus: str | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown BM25 method '{method}'; allowed: {', '.join(METHODS)}")
        super().__init__(index, corpus)
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
        self._bm25: Any = None

    def __getstate__(self) -> dict:
        # PyStemmer's stemmer does not pickle (a rollout worker gets the retriever pickled)
        return {**self.__dict__, "_stem": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stem = _make_stemmer(self.settings["stemmer"])

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

    # ------------------------------------------------------------------ the method

    def build_state(self, passages: list[Passage]) -> None:
        """Index ``passages`` (title and text together) in memory."""
        import bm25s

        settings = self.settings
        bm25 = bm25s.BM25(k1=settings["k1"], b=settings["b"], method=settings["method"])
        bm25.index(
            self._tokenize([f"{p.title}\n{p.text}" for p in passages]),
            show_progress=self.show_progress,
        )
        self._bm25 = bm25

    def rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """The passages holding a query's indexed terms, in one batched bm25s call.

        A query with no indexed term gets none. Ties are broken by corpus order, so results
        are deterministic.
        """
        vocab = self._bm25.vocab_dict
        tokens = [[t for t in q if t in vocab] for q in self._tokenize(queries)]
        ranked: list[list[tuple[int, float]]] = [[] for _ in queries]
        todo = [i for i, t in enumerate(tokens) if t]
        if not todo:
            return ranked
        docs, scores = self._bm25.retrieve(
            [tokens[i] for i in todo], k=k, show_progress=False, n_threads=1
        )
        for i, row_docs, row_scores in zip(todo, np.asarray(docs), np.asarray(scores), strict=True):
            ranked[i] = sorted(
                ((int(d), float(s)) for d, s in zip(row_docs, row_scores, strict=True) if s > 0),
                key=lambda pair: (-pair[1], pair[0]),
            )
        return ranked

    # ------------------------------------------------------------------ its files

    def save_state(self, directory: Path) -> list[str]:
        """Write the bm25s matrices into ``bm25s/``; every file there is recorded."""
        self._bm25.save(str(directory / BM25S_DIR), show_progress=False)
        return sorted(
            p.relative_to(directory).as_posix()
            for p in (directory / BM25S_DIR).iterdir()
            if p.is_file()
        )

    def adopt_manifest(self, manifest: Manifest, directory: Path) -> None:
        """Tokenize queries as the corpus was: the manifest's tokenizer settings, checked."""
        settings = manifest.settings
        _check_settings(settings, directory)
        stemmer = settings.get("stemmer")
        self._stem = _make_stemmer(stemmer)
        if stemmer is not None and self._stem is None:
            raise IndexMismatchError(
                f"index {directory} was built with stemmer='{stemmer}' but PyStemmer is not "
                "installed; pip install PyStemmer or rebuild the index with stemmer=None"
            )
        self.settings = dict(settings)

    def load_state(self, directory: Path) -> None:
        """Memory-map the score matrices and check their shapes against the manifest."""
        assert self.manifest is not None
        bm25 = _read_bm25s(directory / BM25S_DIR)
        _check_matrices(bm25, self.manifest, directory / BM25S_DIR)
        self._bm25 = bm25

    def ensure_loaded(self) -> None:
        """Load the index (see :class:`IndexedRetriever`), then check it was built from
        ``expected_corpus``."""
        if self.manifest is not None:
            return
        super().ensure_loaded()
        assert self.manifest is not None
        expected = self.expected_corpus
        if expected is not None and not _looks_like_fingerprint(expected):
            expected = corpus_fingerprint(read_corpus(expected))
        self.manifest.check({"corpus_fingerprint": expected}, where=self.index)


def _check_settings(settings: dict[str, Any], directory: Path) -> None:
    """The tokenizer settings queries are tokenized with must be there, with their types."""
    wanted = {
        "lowercase": (bool,),
        "stopwords": (str, list, type(None)),
        "stemmer": (str, type(None)),
    }
    for key, types in wanted.items():
        if key not in settings or not isinstance(settings[key], types):
            raise IndexCorruptError(
                f"{directory / 'manifest.json'}: settings['{key}'] must be "
                f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}, got "
                f"{settings.get(key, '<missing>')!r:.40}; {_REBUILD}"
            )


def _read_bm25s(folder: Path) -> Any:
    """``bm25s.BM25.load`` of a checked ``params.index.json``; library errors name the file.

    Arrays are read with ``allow_pickle=False`` (a pickled array is refused, never run), the
    retrieval backend is always numpy, and parameters bm25s does not write are refused.
    """
    import bm25s

    params_path = folder / "params.index.json"
    try:
        params = json.loads(params_path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise IndexCorruptError(f"{params_path}: missing; {_REBUILD}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise IndexCorruptError(f"{params_path}: not valid JSON ({err}); {_REBUILD}") from None
    unknown = sorted(set(params) - set(BM25S_PARAMS)) if isinstance(params, dict) else None
    if unknown is None or unknown:
        raise IndexCorruptError(
            f"{params_path}: expected a JSON object with keys from {', '.join(BM25S_PARAMS)}; "
            f"got {unknown if unknown else type(params).__name__}; {_REBUILD}"
        )
    try:
        return bm25s.BM25.load(
            str(folder), mmap=True, allow_pickle=False, show_progress=False, backend="numpy"
        )
    # what numpy / bm25s raise on a damaged file (short array, bad header, vocab not a dict)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        message = " ".join(str(err).split())[:200]
        raise IndexCorruptError(
            f"{folder}: the BM25 matrices cannot be read ({type(err).__name__}: {message}); "
            f"{_REBUILD}"
        ) from None


def _check_matrices(bm25: Any, manifest: Manifest, folder: Path) -> None:
    """Shapes of the memory-mapped CSC score matrix against the manifest and the vocabulary.

    ``indptr`` has one entry per vocabulary column plus one; ``indptr[-1]`` is the number of
    stored scores; ``num_docs`` (the matrix rows) is the passage count. Only sizes are read:
    the matrices stay memory-mapped.
    """
    scores = bm25.scores
    manifest.check_rows(
        "the BM25 score matrix", int(scores.get("num_docs") or 0), folder / "params.index.json"
    )
    data, indices, indptr = scores["data"], scores["indices"], scores["indptr"]
    columns = len(indptr) - 1
    try:
        top_id = max((v for t, v in bm25.vocab_dict.items() if t), default=-1)
    except TypeError:  # a token id that is not a number
        top_id = None
    if not isinstance(top_id, int) or top_id >= columns:
        raise IndexCorruptError(
            f"{folder / 'vocab.index.json'}: token id {top_id} but the score matrix has "
            f"{columns} columns (files from different builds); {_REBUILD}"
        )
    if len(indptr) == 0 or int(indptr[-1]) != len(data) or len(data) != len(indices):
        raise IndexCorruptError(
            f"{folder}: score matrix arrays disagree (data {len(data)}, indices {len(indices)}, "
            f"indptr ends at {int(indptr[-1]) if len(indptr) else 'nothing'}); {_REBUILD}"
        )
