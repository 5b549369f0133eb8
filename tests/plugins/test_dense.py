"""Dense retriever on a tiny random BERT (no downloads): flat / hnsw / ivf, edge cases,
save/load round trip, encoder mismatch, and the encoder a manifest records is not followed
unasked."""

from __future__ import annotations

import pytest
from helpers import require_package

require_package("faiss", "pip install faiss-cpu")
require_package("sentence_transformers", "pip install sentence-transformers")

from lit_rag.plugins.retrievers.dense import DenseRetriever
from lit_rag.retrieval.manifest import IndexMismatchError, IndexNotFoundError
from lit_rag.types import Passage

WORDS = [
    "the",
    "a",
    "of",
    "in",
    "is",
    "was",
    "river",
    "city",
    "mountain",
    "paris",
    "london",
    "tokyo",
    "bridge",
    "castle",
    "tower",
    "founded",
    "built",
    "king",
    "queen",
    "music",
    "film",
    "painter",
    "lake",
    "forest",
    "museum",
    "island",
    "train",
]

PASSAGES = [
    Passage("p0", "Paris", "paris is a city of music"),
    Passage("p1", "Tokyo", "tokyo tower was built in the city"),
    Passage("p2", "London", "the london bridge is over the river"),
    Passage("p3", "Lake", "a lake in the forest of the mountain"),
    Passage("p4", "Castle", "the king built a castle on the island"),
    Passage("p5", "Museum", "the museum of the painter"),
    Passage("p6", "Train", "a train to the mountain"),
    Passage("p7", "Film", "the queen was in a film"),
]


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> str:
    """A plain HF folder with a 2-layer, 32-wide random BERT and a WordPiece vocab.

    It has no ``modules.json``, so sentence-transformers adds mean pooling: the plain-HF path.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return str(folder)


def built(encoder: str, **kwargs) -> DenseRetriever:
    retriever = DenseRetriever(encoder=encoder, device="cpu", **kwargs)
    retriever.build(PASSAGES)
    return retriever


@pytest.mark.parametrize("faiss_index", ["flat", "hnsw", "ivf"])
def test_passage_text_finds_itself(tiny_encoder, faiss_index):
    # A query equal to a passage's embedded text has cosine 1 with it: rank 0 everywhere.
    retriever = built(tiny_encoder, faiss_index=faiss_index, nlist=4, nprobe=4)
    queries = [f"{p.title}\n{p.text}" for p in PASSAGES]
    for passage, hits in zip(PASSAGES, retriever.search(queries, 3), strict=True):
        assert hits[0].passage.id == passage.id
        assert hits[0].score == pytest.approx(1.0, abs=1e-4)
        assert [h.rank for h in hits] == [0, 1, 2]
        assert hits[0].score >= hits[1].score >= hits[2].score


def test_ivf_pq_nlist_clipped_to_corpus(tiny_encoder):
    # nlist 1024 > 8 passages -> 8 cells; pq_m 4 divides 32; nbits = min(8, log2 8) = 3.
    retriever = built(tiny_encoder, faiss_index="ivf", nlist=1024, pq_m=4, nprobe=1024)
    assert retriever._index.nlist == len(PASSAGES)
    hits = retriever.search(["paris music"], 5)[0]
    assert len(hits) == 5 and len({h.passage.id for h in hits}) == 5


def test_pq_m_must_divide_dim(tiny_encoder):
    with pytest.raises(ValueError, match="pq_m: got 5; it must divide the embedding size 32"):
        built(tiny_encoder, faiss_index="ivf", pq_m=5)


def test_unknown_faiss_index_names_allowed():
    with pytest.raises(ValueError, match=r"faiss_index: got 'annoy'; allowed: flat, hnsw, ivf"):
        DenseRetriever(faiss_index="annoy")


def test_empty_unicode_and_large_k(tiny_encoder):
    retriever = built(tiny_encoder)
    queries = ["", "   ", "Ünïcödé 東京タワー 🗼", "paris"]
    empty, blank, unicode, normal = retriever.search(queries, 50)
    assert empty == [] and blank == []
    # k = 50 > 8 passages: clipped to the corpus, every passage once
    assert len(unicode) == len(normal) == len(PASSAGES)
    assert {h.passage.id for h in normal} == {p.id for p in PASSAGES}
    assert retriever.search([], 5) == []
    for k in (0, -1):  # as bm25 does: a bad k is an error, not an empty answer
        with pytest.raises(ValueError, match=f"k must be >= 1, got {k}"):
            retriever.search(["paris"], k)
    # a lone surrogate (invalid UTF-8 bytes decoded by Python) fails naming the query, before
    # the tokenizer's TypeError
    with pytest.raises(ValueError, match=r"query 'paris \\udcff' holds '\\udcff'"):
        retriever.search(["paris \udcff"], 3)


def test_save_load_round_trip_is_identical(tiny_encoder, tmp_path):
    for faiss_index in ("flat", "hnsw", "ivf"):
        retriever = built(
            tiny_encoder,
            faiss_index=faiss_index,
            nlist=2,
            pq_m=8,
            query_prefix="query: ",
            passage_prefix="passage: ",
        )
        folder = tmp_path / faiss_index
        retriever.save(folder)
        files = {p.name for p in folder.iterdir()}
        assert files == {"index.faiss", "passages.jsonl", "manifest.json"}
        queries = ["paris music", "river bridge", "Ünïcödé"]
        before = retriever.search(queries, 4)

        loaded = DenseRetriever.load(folder, encoder=tiny_encoder)
        assert loaded.passages == PASSAGES
        assert (loaded.query_prefix, loaded.passage_prefix) == ("query: ", "passage: ")
        assert loaded.search(queries, 4) == before

        lazy = DenseRetriever(index=str(folder), encoder=tiny_encoder, query_prefix="query: ")
        assert lazy.search(queries, 4) == before


def test_load_with_other_encoder_fails(tiny_encoder, tmp_path):
    built(tiny_encoder).save(tmp_path / "idx")
    with pytest.raises(IndexMismatchError, match="encoder="):
        DenseRetriever.load(tmp_path / "idx", encoder="/models/e5-small")
    with pytest.raises(IndexMismatchError, match="encoder="):
        DenseRetriever(index=str(tmp_path / "idx"), encoder="/models/e5-small").search(["x"], 1)


def test_manifest_encoder_needs_the_users_consent(tiny_encoder, tmp_path):
    built(tiny_encoder).save(tmp_path / "idx")
    # not passed, not allowed: the path in the manifest is named, not loaded
    with pytest.raises(
        IndexMismatchError, match=f"was built with encoder '{tiny_encoder}'; pass that encoder"
    ) as info:
        DenseRetriever.load(tmp_path / "idx")
    assert "--trust-manifest-encoder" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(IndexMismatchError, match="was built with encoder"):
        DenseRetriever(index=str(tmp_path / "idx")).search(["paris"], 1)
    # allowed: the recorded path is loaded
    trusted = DenseRetriever.load(tmp_path / "idx", trust_manifest_encoder=True)
    assert trusted.encoder_path == tiny_encoder
    lazy = DenseRetriever(index=str(tmp_path / "idx"), trust_manifest_encoder=True)
    assert lazy.search(["paris music"], 2) == trusted.search(["paris music"], 2)


def test_recorded_pkg_path_is_compared_never_imported(tiny_encoder, tmp_path, monkeypatch):
    # pkg://a.b/... would import package "a" if resolved (importlib finds "a.b" through "a")
    import json
    import sys

    planted = tmp_path / "site"
    planted.mkdir()
    (planted / "planted_enc.py").write_text("raise SystemExit('planted_enc was imported')\n")
    monkeypatch.syspath_prepend(str(planted))
    built(tiny_encoder).save(tmp_path / "idx")
    path = tmp_path / "idx" / "manifest.json"
    data = json.loads(path.read_text())
    data["encoder"] = "pkg://planted_enc.sub/model"
    path.write_text(json.dumps(data))
    with pytest.raises(IndexMismatchError, match="has encoder='pkg://planted_enc.sub/model'"):
        DenseRetriever.load(tmp_path / "idx", encoder=tiny_encoder)
    assert "planted_enc" not in sys.modules


def test_missing_index_folder(tmp_path):
    with pytest.raises(IndexNotFoundError):
        DenseRetriever.load(tmp_path / "nowhere")


def test_encoder_pkg_path_resolves_without_loading():
    from pathlib import Path

    from lit_rag.models.facts import resolve_path

    path = resolve_path(DenseRetriever().encoder_path)
    assert isinstance(path, Path) and path.name == "model" and (path / "modules.json").is_file()


def test_a_saved_index_is_memory_mapped_on_its_first_search(tiny_encoder, tmp_path, monkeypatch):
    import faiss

    flags = []
    read = faiss.read_index
    monkeypatch.setattr(faiss, "read_index", lambda path, f=0: flags.append(f) or read(path, f))
    expected = {
        "flat": faiss.IO_FLAG_MMAP_IFC,  # the stored vectors
        "hnsw": faiss.IO_FLAG_MMAP_IFC,  # the graph's stored vectors
        "ivf": faiss.IO_FLAG_MMAP,  # the inverted lists
    }
    for faiss_index, flag in expected.items():
        built(tiny_encoder, faiss_index=faiss_index, nlist=2).save(tmp_path / faiss_index)
        lazy = DenseRetriever(index=str(tmp_path / faiss_index), encoder=tiny_encoder)
        assert flags == [] and lazy.manifest is None  # nothing read before a search
        assert lazy.search(["paris music"], 1)[0][0].passage.id == "p0"
        assert flags == [flag], faiss_index
        flags.clear()


def test_mapping_a_flat_index_does_not_read_it_into_memory(tmp_path):
    """80,000 vectors of 64 floats: a 20 MiB file (80000 * 64 * 4 = 20,480,000 bytes). Read in,
    the process's resident memory grows by about that; mapped, by almost nothing until a search
    touches the pages."""
    import os

    import faiss
    import numpy as np

    from lit_rag.plugins.retrievers.dense import _mmap_flags, _read_faiss

    index = faiss.IndexFlatIP(64)
    index.add(np.random.default_rng(0).random((80_000, 64), dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "index.faiss"))
    del index
    size = os.path.getsize(tmp_path / "index.faiss")

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident()
    mapped = _read_faiss(tmp_path / "index.faiss", flags=_mmap_flags("flat"))
    assert mapped.ntotal == 80_000 and resident() - before < size / 10
