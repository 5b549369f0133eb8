"""The ``IndexedRetriever`` template: a retriever written in this file supplies only its method
(``build_state``, ``rank``, ``save_state``, ``load_state``); the base builds, saves, verifies and
loads the index folder, lazily on the first search.

``OverlapRetriever`` scores a passage by how many distinct query words it holds; its whole
state is one JSON file of postings (word -> rows).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from lit_rag import __version__
from lit_rag.api import (
    IndexCorruptError,
    IndexedRetriever,
    IndexMismatchError,
    Manifest,
    Passage,
    corpus_fingerprint,
    write_corpus,
)

CORPUS = [
    Passage("a", "A", "red apples and red cherries"),
    Passage("b", "B", "green apples"),
    Passage("c", "C", "blue sky"),
]
POSTINGS = "postings.json"


class OverlapRetriever(IndexedRetriever):
    """Score = number of distinct query words in the passage's text."""

    kind = "overlap"

    def __init__(
        self, index: str | None = None, corpus: str | None = None, lowercase: bool = True
    ) -> None:
        super().__init__(index, corpus)
        self.settings = {"lowercase": lowercase}
        self.postings: dict[str, list[int]] = {}
        self.loads = 0  # how often load_state ran

    def _words(self, text: str) -> set[str]:
        return set((text.lower() if self.settings["lowercase"] else text).split())

    def build_state(self, passages: list[Passage]) -> None:
        self.postings = {}
        for row, passage in enumerate(passages):
            for word in sorted(self._words(passage.text)):
                self.postings.setdefault(word, []).append(row)

    def rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        ranked = []
        for query in queries:
            counts = Counter(r for w in self._words(query) for r in self.postings.get(w, []))
            pairs = sorted(((r, float(n)) for r, n in counts.items()), key=lambda p: (-p[1], p[0]))
            ranked.append(pairs[:k])
        return ranked

    def save_state(self, directory: Path) -> list[str]:
        self.write_json(directory / POSTINGS, {"postings": self.postings})
        return [POSTINGS]

    def load_state(self, directory: Path) -> None:
        self.loads += 1
        data = self.read_json(directory / POSTINGS, {"postings": dict})
        rows = {r for rows in data["postings"].values() for r in rows}
        self.require(
            rows <= set(range(len(self.passages))),
            directory / POSTINGS,
            f"rows {sorted(rows)} for {len(self.passages)} passages",
        )
        self.postings = data["postings"]


def ids(hits) -> list[tuple[str, float, int]]:
    return [(h.passage.id, h.score, h.rank) for h in hits]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    retriever = OverlapRetriever()
    retriever.build(CORPUS)
    retriever.save(tmp_path / "idx")
    return tmp_path / "idx"


def one_line(info: pytest.ExceptionInfo) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


def test_build_and_search_worked_by_hand():
    retriever = OverlapRetriever()
    retriever.build(CORPUS)
    # "red apples sky": a holds red and apples (2), b apples (1), c sky (1); ties by row
    hits, blank = retriever.search(["red apples sky", "  "], k=5)
    assert ids(hits) == [("a", 2.0, 0), ("b", 1.0, 1), ("c", 1.0, 2)]
    assert blank == []  # a blank query gets no hits, and never reaches rank
    (top,) = retriever.search(["red apples sky"], k=1)
    assert ids(top) == [("a", 2.0, 0)]
    assert retriever.manifest is not None and retriever.manifest.passage_count == 3


def test_the_saved_folder_and_its_manifest(index: Path):
    assert sorted(p.name for p in index.iterdir()) == [
        "manifest.json",
        "passages.jsonl",
        POSTINGS,
    ]
    manifest = json.loads((index / "manifest.json").read_text())
    postings = (index / POSTINGS).read_bytes()
    # the postings of "red apples and red cherries", "green apples", "blue sky", sorted words
    assert json.loads(postings) == {
        "postings": {
            "and": [0],
            "apples": [0, 1],
            "cherries": [0],
            "red": [0],
            "green": [1],
            "blue": [2],
            "sky": [2],
        }
    }
    assert manifest.pop("lit_rag_version").startswith(__version__) and manifest.pop("created")
    assert manifest == {
        "retriever": "overlap",
        "encoder": None,
        "corpus_fingerprint": corpus_fingerprint(CORPUS),
        "passage_count": 3,
        "settings": {"lowercase": True},
        "files": {
            POSTINGS: {"bytes": len(postings), "sha256": hashlib.sha256(postings).hexdigest()}
        },
    }
    # the fingerprint is SHA-256 over json.dumps([id, title, text]) + "\n" of each passage
    stream = "".join(json.dumps([p.id, p.title, p.text]) + "\n" for p in CORPUS)
    assert manifest["corpus_fingerprint"] == hashlib.sha256(stream.encode()).hexdigest()
    assert (index / "passages.jsonl").read_text().splitlines()[1] == (
        '{"id": "b", "title": "B", "text": "green apples"}'
    )


def test_load_takes_the_settings_the_index_records(tmp_path: Path):
    cased = OverlapRetriever(lowercase=False)
    cased.build(CORPUS)
    cased.save(tmp_path / "cased")
    loaded = OverlapRetriever.load(tmp_path / "cased")  # constructed with lowercase=True
    assert loaded.settings == {"lowercase": False} and loaded.passages == CORPUS
    assert loaded.search(["RED"], 3) == [[]]  # queries are tokenized as the index was


def test_the_first_search_loads_the_index_once(index: Path):
    lazy = OverlapRetriever(index=str(index))
    assert (lazy.manifest, lazy.passages, lazy.loads) == (None, [], 0)  # nothing read yet
    assert lazy.search([" "], 3) == [[]]  # nothing to search: still nothing read
    assert lazy.loads == 0
    (hits,) = lazy.search(["green apples"], 3)
    assert ids(hits) == [("b", 2.0, 0), ("a", 1.0, 1)]
    lazy.search(["sky"], 3)
    assert lazy.loads == 1 and lazy.manifest is not None


def test_a_missing_index_is_built_from_the_corpus_on_first_search(tmp_path: Path):
    corpus = write_corpus(CORPUS, tmp_path / "corpus.jsonl")
    out = tmp_path / "built"
    (hits,) = OverlapRetriever(index=str(out), corpus=str(corpus)).search(["blue"], 1)
    assert ids(hits) == [("c", 1.0, 0)]
    assert Manifest.read(out).corpus_fingerprint == corpus_fingerprint(CORPUS)


def test_a_changed_file_fails_in_one_line_naming_it(index: Path):
    path = index / POSTINGS
    path.write_text(path.read_text().replace("apples", "grapes"))  # same size, other bytes
    with pytest.raises(IndexCorruptError) as info:
        OverlapRetriever.load(index)
    assert one_line(info).startswith(f"{path}: content differs from the SHA-256 ")
    lazy = OverlapRetriever(index=str(index))
    with pytest.raises(IndexCorruptError, match="content differs"):
        lazy.search(["red"], 1)
    assert lazy.manifest is None and lazy.loads == 0  # nothing of the subclass read the file


def test_what_the_files_hold_is_checked_by_load_state(index: Path):
    # an index whose manifest records no files (as lit-rag 0.1.0 wrote them) reaches load_state
    manifest = json.loads((index / "manifest.json").read_text())
    (index / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    (index / POSTINGS).write_text(json.dumps({"postings": {"red": [0, 7]}}))
    lazy = OverlapRetriever(index=str(index))
    with pytest.raises(IndexCorruptError) as info:
        lazy.search(["red"], 1)
    assert one_line(info) == (
        f"{index / POSTINGS}: rows [0, 7] for 3 passages; rebuild the index (lit-rag index build)"
    )
    assert lazy.manifest is None  # not marked loaded: the next search tries again
    (index / POSTINGS).write_bytes(b"\x80\x04\x95pickle")  # a pickle is data too: refused
    with pytest.raises(
        IndexCorruptError,
        match=r"postings.json:1: not UTF-8 text \(invalid start byte: b'\\x80' at byte 1 of",
    ):
        lazy.search(["red"], 1)
    (index / POSTINGS).write_text(json.dumps({"postings": ["red"]}))
    with pytest.raises(IndexCorruptError, match=r'expected a JSON object \{"postings": dict\}'):
        lazy.search(["red"], 1)


def test_passages_of_another_corpus(index: Path, tmp_path: Path):
    write_corpus(CORPUS[:2], index / "passages.jsonl")
    with pytest.raises(IndexCorruptError) as info:
        OverlapRetriever.load(index)
    assert "passages.jsonl: holds 2 passages but" in one_line(info)
    assert "records passage_count=3" in str(info.value)


def test_a_manifest_of_another_kind_or_with_bad_settings(index: Path):
    path = index / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "retriever": "bm25"}))
    with pytest.raises(IndexMismatchError) as info:
        OverlapRetriever.load(index)
    assert one_line(info).startswith(
        f"index {index} has retriever='bm25' but the recipe expects retriever='overlap'"
    )
    path.write_text(json.dumps({**manifest, "settings": {"lowercase": "yes"}}))
    with pytest.raises(IndexCorruptError) as info:
        OverlapRetriever.load(index)
    assert one_line(info) == (
        f"{path}: settings['lowercase'] must be bool, got 'yes'; rebuild the index "
        "(lit-rag index build)"
    )


def test_a_repaired_index_loads_after_a_failed_first_search(index: Path, tmp_path: Path):
    shutil.copytree(index, tmp_path / "good")
    (index / POSTINGS).write_text("{}")
    lazy = OverlapRetriever(index=str(index))
    with pytest.raises(IndexCorruptError):
        lazy.search(["sky"], 1)
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "good", index)
    assert ids(lazy.search(["sky"], 1)[0]) == [("c", 1.0, 0)]


def test_usage_errors_are_one_line():
    with pytest.raises(ValueError, match="corpus: building a missing index needs index: FOLDER"):
        OverlapRetriever(corpus="synthetic")
    with pytest.raises(RuntimeError, match="OverlapRetriever has no index: pass index=PATH"):
        OverlapRetriever().search(["red"], 1)
    with pytest.raises(RuntimeError, match="OverlapRetriever: nothing to save; call build"):
        OverlapRetriever().save("never-written")
    with pytest.raises(ValueError, match="overlap: cannot build an index over an empty corpus"):
        OverlapRetriever().build([])
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        OverlapRetriever().search(["red"], 0)


def test_a_subclass_without_its_method_says_which_is_missing():
    class Unfinished(IndexedRetriever):
        kind = "unfinished"

    with pytest.raises(
        NotImplementedError, match=r"Unfinished must define build_state\(passages\)"
    ):
        Unfinished().build(CORPUS)
