"""Reciprocal rank fusion on hand-worked rankings, and the hybrid index folder."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from lit_rag import registry
from lit_rag.plugins.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion
from lit_rag.retrieval.base import Hit, IndexedRetriever
from lit_rag.retrieval.manifest import IndexCorruptError, IndexMismatchError, Manifest
from lit_rag.types import Passage

CORPUS = {pid: Passage(pid, pid.upper(), f"text of {pid}") for pid in "abcdef"}


class FixedRetriever(IndexedRetriever):
    """Returns the same ranking for every non-empty query; records the k it was asked for."""

    kind = "fixed"

    def __init__(self, order: str = "") -> None:
        self.order = order
        self.asked: list[int] = []
        self.passages = [CORPUS[p] for p in sorted(CORPUS)]

    def build(self, passages: list[Passage]) -> None:
        self.passages = list(passages)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.asked.append(k)
        hits = [Hit(CORPUS[p], 1.0 / (i + 1), i) for i, p in enumerate(self.order[:k])]
        return [hits if q.strip() else [] for q in queries]

    def save(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "order.json").write_text(json.dumps(self.order))
        Manifest(self.kind, None, "", len(self.passages)).write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> FixedRetriever:
        return cls(json.loads((Path(directory) / "order.json").read_text()))


@pytest.fixture
def fixed_registered(monkeypatch: pytest.MonkeyPatch):
    """Register FixedRetriever as retriever ``fixed`` (a hybrid loads children by kind only)."""
    real = registry._entry_points
    fixed = metadata.EntryPoint("fixed", f"{__name__}:FixedRetriever", "lit_rag.retrievers")
    monkeypatch.setattr(
        registry,
        "_entry_points",
        lambda group: real(group) + ([fixed] if group == "lit_rag.retrievers" else []),
    )
    registry.clear_cache()
    yield
    registry.clear_cache()


def ranking(order: str) -> list[Hit]:
    return [Hit(CORPUS[p], 0.0, i) for i, p in enumerate(order)]


def test_rrf_hand_worked_k60():
    # a: 1/61 + 1/63 = 0.0163934 + 0.0158730 = 0.0322664
    # b: 1/62 + 1/61 = 0.0161290 + 0.0163934 = 0.0325224   <- best
    # c: 1/63        = 0.0158730
    # d: 1/62        = 0.0161290
    fused = reciprocal_rank_fusion([ranking("abc"), ranking("bda")], k=60)
    assert [h.passage.id for h in fused] == ["b", "a", "d", "c"]
    assert [h.rank for h in fused] == [0, 1, 2, 3]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61 + 1 / 63)
    assert fused[3].score == pytest.approx(1 / 63)


def test_rrf_small_k_changes_order():
    # k = 0: a = 1/1 + 1/3 = 1.3333, b = 1/2 + 1/1 = 1.5 -> b first; d = 1/2 = 0.5 > c = 1/3
    fused = reciprocal_rank_fusion([ranking("abc"), ranking("bda")], k=0)
    assert [h.passage.id for h in fused] == ["b", "a", "d", "c"]
    assert fused[1].score == pytest.approx(4 / 3)


def test_rrf_ties_broken_by_best_rank_then_id():
    # "ab" and "ba": a = b = 1/61 + 1/62 (tie); both have best rank 1 -> id order: a, b.
    # "cd" and "ef": c, e score 1/61 (best rank 1), d, f 1/62 -> c, e, d, f.
    fused = reciprocal_rank_fusion([ranking("ba"), ranking("ab")])
    assert [h.passage.id for h in fused] == ["a", "b"]
    fused = reciprocal_rank_fusion([ranking("ef"), ranking("cd")])
    assert [h.passage.id for h in fused] == ["c", "e", "d", "f"]
    # three lists: x = "abc", "cab", "bca" -> every passage has ranks {1, 2, 3}: all tie at
    # 1/61 + 1/62 + 1/63 with best rank 1 -> id order.
    fused = reciprocal_rank_fusion([ranking("abc"), ranking("cab"), ranking("bca")])
    assert [h.passage.id for h in fused] == ["a", "b", "c"]
    assert len({round(h.score, 12) for h in fused}) == 1


def test_hybrid_search_depth_k_and_empty_queries():
    first, second = FixedRetriever("abc"), FixedRetriever("bda")
    hybrid = HybridRetriever([first, second], k=60, depth=3)
    top2, empty = hybrid.search(["q", " "], 2)
    assert [h.passage.id for h in top2] == ["b", "a"]
    assert empty == []
    assert first.asked == [3] and second.asked == [3]  # depth 3 >= k 2
    (everything,) = hybrid.search(["q"], 10)  # k > depth: children asked for 10
    assert first.asked[-1] == 10
    assert [h.passage.id for h in everything] == ["b", "a", "d", "c"]  # 4 distinct passages


def test_hybrid_search_refuses_k_below_1_and_lone_surrogates():
    hybrid = HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")])
    for k in (0, -1):
        with pytest.raises(ValueError, match=f"k must be >= 1, got {k}"):
            hybrid.search(["q"], k)
    with pytest.raises(ValueError, match=r"query 'q \\udcff' holds '\\udcff' at character 2"):
        hybrid.search(["q \udcff"], 3)


def test_hybrid_needs_two_retrievers():
    with pytest.raises(ValueError, match="retrievers: got 1; hybrid fuses two or more"):
        HybridRetriever([FixedRetriever("a")])


def test_hybrid_save_load_round_trip(tmp_path, fixed_registered):
    hybrid = HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")], k=10, depth=5)
    hybrid.save(tmp_path / "idx")
    manifest = Manifest.read(tmp_path / "idx")
    assert manifest.retriever == "hybrid"
    # folder and registered kind only: no dotted class path an index could point elsewhere
    assert manifest.settings["children"] == [
        {"folder": "0-fixed", "kind": "fixed"},
        {"folder": "1-fixed", "kind": "fixed"},
    ]
    loaded = HybridRetriever.load(tmp_path / "idx")
    assert (loaded.k, loaded.depth) == (10, 5)
    assert loaded.search(["q"], 3) == hybrid.search(["q"], 3)


def test_hybrid_ignores_the_class_of_old_manifests(tmp_path, fixed_registered):
    # lit-rag 0.1.0 also wrote each child's dotted class; loading now goes by kind only, so a
    # class naming a module that does not exist changes nothing
    HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")]).save(tmp_path / "idx")
    path = tmp_path / "idx" / "manifest.json"
    data = json.loads(path.read_text())
    for child in data["settings"]["children"]:
        child["class"] = "no_such_module_anywhere.Evil"
    path.write_text(json.dumps(data))
    (hits,) = HybridRetriever.load(tmp_path / "idx").search(["q"], 2)
    assert [h.passage.id for h in hits] == ["b", "a"]


def test_hybrid_child_kind_must_be_registered(tmp_path):
    # "fixed" is not registered here: the kind is looked up in the registry, never imported
    HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")]).save(tmp_path / "idx")
    with pytest.raises(
        IndexCorruptError,
        match="retriever 'fixed' is not an installed "
        "retriever; installed: bm25, dense, http, hybrid",
    ):
        HybridRetriever.load(tmp_path / "idx")


@pytest.mark.parametrize("folder", ["../elsewhere", ".", "/tmp", "a/b", ""])
def test_hybrid_child_folder_stays_inside_the_index(tmp_path, fixed_registered, folder):
    HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")]).save(tmp_path / "idx")
    path = tmp_path / "idx" / "manifest.json"
    data = json.loads(path.read_text())
    data["settings"]["children"][0]["folder"] = folder
    path.write_text(json.dumps(data))
    with pytest.raises(IndexCorruptError, match="must be a plain folder name inside the index"):
        HybridRetriever.load(tmp_path / "idx")


def test_hybrid_child_of_another_corpus(tmp_path, fixed_registered):
    HybridRetriever([FixedRetriever("abc"), FixedRetriever("bda")]).save(tmp_path / "idx")
    child = tmp_path / "idx" / "1-fixed"
    Manifest("fixed", None, "", 5).write(child)  # 5 passages; the hybrid records 6
    with pytest.raises(
        IndexCorruptError,
        match=r"1-fixed/manifest.json: passage_count=5 but "
        r".*idx/manifest.json records passage_count=6",
    ):
        HybridRetriever.load(tmp_path / "idx")


def test_hybrid_load_refuses_other_kind(tmp_path):
    FixedRetriever("ab").save(tmp_path / "fixed")
    with pytest.raises(IndexMismatchError, match="retriever='fixed'"):
        HybridRetriever.load(tmp_path / "fixed")
