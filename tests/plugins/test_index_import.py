"""``lit-rag index import``: a dense index built the way FlashRAG / Search-R1 build it becomes a
lit-rag index without re-encoding, and searches to the same hits and scores.

Each source index is built here as Search-R1's ``index_builder.py`` builds one: transformers
``AutoModel`` + ``AutoTokenizer`` on a tiny random BERT, ``"passage: "`` before each corpus
``contents`` for e5, mean (e5) or CLS (bge) pooling, L2 norm, ``faiss.index_factory(dim, type,
METRIC_INNER_PRODUCT)``; its queries are encoded as ``retrieval_server.py`` encodes them
(``"query: "`` for e5, the BGE instruction for bge). The corpus is the first 200 rows of the real
FlashRAG Wikipedia sample in ``../shared/data``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import require_package

require_package("faiss", "pip install faiss-cpu")
require_package("sentence_transformers", "pip install sentence-transformers")
import faiss

from lit_rag.cli.commands import main
from lit_rag.plugins.retrievers.faiss_import import BGE_INSTRUCTION
from lit_rag.retrieval.base import open_index
from lit_rag.retrieval.manifest import IndexMismatchError
from tests.helpers import one_line_error, shared_data_dir, tiny_bert_folder

ROWS = 200
MAX_LENGTH = 64  # the tiny BERT's positions; sentence-transformers cuts there too
QUERIES = [
    "Evan Morris lobbyist Genentech",
    "who founded the city on the river",
    "a film by the painter",
    "Washington intern at the White House",
    "music of the band",
]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 200-row FlashRAG corpus, its words and the tiny encoders' common vocabulary."""
    sample = shared_data_dir() / "wiki_corpus1000_flashrag.jsonl"  # skipped outside CI if absent
    root = tmp_path_factory.mktemp("source")
    lines = sample.read_text(encoding="utf-8").splitlines()[:ROWS]
    corpus = root / "wiki-200.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = [json.loads(line) for line in lines]
    words = sorted({w for r in rows for w in r["contents"].lower().split() if w.isalpha()})
    return {"root": root, "corpus": corpus, "rows": rows, "words": words[:3000]}


def encoder_folder(source, name: str) -> str:
    """The tiny BERT saved under ``root/name`` (the name is what Search-R1's rules read)."""
    folder = source["root"] / name
    if not folder.exists():
        tiny_bert_folder(folder, source["words"], max_positions=MAX_LENGTH)
    return str(folder)


def search_r1_encode(folder: str, texts: list[str], pooling: str) -> np.ndarray:
    """``[N, D]`` embeddings as Search-R1's ``index_builder.encode_all`` / ``Encoder.encode``."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        inputs = tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
        )
        hidden = model(**inputs, return_dict=True).last_hidden_state  # [N, L, D]
        mask = inputs["attention_mask"]  # [N, L]
        if pooling == "mean":
            hidden = hidden.masked_fill(~mask[..., None].bool(), 0.0)
            vectors = hidden.sum(dim=1) / mask.sum(dim=1)[..., None]
        else:  # cls
            vectors = hidden[:, 0]
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return vectors.numpy().astype(np.float32)


def search_r1_index(source, folder: str, spec: str, path: Path) -> tuple[np.ndarray, object]:
    """Encode the corpus Search-R1's way into ``faiss.index_factory(dim, spec, IP)`` at ``path``."""
    e5 = "e5" in Path(folder).name
    contents = [("passage: " if e5 else "") + r["contents"] for r in source["rows"]]
    vectors = search_r1_encode(folder, contents, "mean" if e5 else "cls")  # [200, 16]
    index = faiss.index_factory(vectors.shape[1], spec, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    faiss.write_index(index, str(path))
    return vectors, index


def search_r1_hits(source, folder: str, index, k: int) -> tuple[list[list[str]], np.ndarray]:
    """Top-``k`` corpus ids (by row, as Search-R1's ``corpus[idx]``) and scores per query."""
    e5 = "e5" in Path(folder).name
    prefix = "query: " if e5 else BGE_INSTRUCTION
    vectors = search_r1_encode(folder, [prefix + q for q in QUERIES], "mean" if e5 else "cls")
    scores, rows = index.search(vectors, k)
    return [[source["rows"][j]["id"] for j in row] for row in rows], scores


def run_import(faiss_file, corpus, encoder, out, *extra) -> None:
    main(
        [
            "index",
            "import",
            "--faiss",
            str(faiss_file),
            "--corpus",
            str(corpus),
            "--encoder",
            str(encoder),
            "--out",
            str(out),
            *extra,
        ]
    )


def assert_same_hits(retriever, expected_ids, expected_scores) -> None:
    got = retriever.search(QUERIES, len(expected_ids[0]))
    assert [[h.passage.id for h in hits] for hits in got] == expected_ids
    np.testing.assert_allclose(
        [[h.score for h in hits] for hits in got], expected_scores, atol=1e-5
    )


def test_flat_e5_import_keeps_vectors_and_searches_as_search_r1(source, tmp_path, capsys):
    folder = encoder_folder(source, "tiny-e5")
    flat = tmp_path / "e5_Flat.index"
    vectors, original = search_r1_index(source, folder, "Flat", flat)
    out = tmp_path / "wiki-e5"
    capsys.readouterr()
    run_import(flat, source["corpus"], folder, out)
    summary = capsys.readouterr().out.strip()
    assert summary.startswith(
        "imported 200 passages (dim 16, flat IndexFlatIP, pooling mean, "
        "query prefix 'query: '), index.faiss as a copy, in "
    )
    assert summary.endswith(f"-> {out}")
    # (a) no re-encoding: the very file, hence the very vectors
    assert (out / "index.faiss").read_bytes() == flat.read_bytes()
    np.testing.assert_array_equal(
        faiss.read_index(str(out / "index.faiss")).reconstruct_n(0, ROWS), vectors
    )
    # (c) what the manifest records
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["retriever"] == "dense" and manifest["encoder"] == folder
    assert manifest["passage_count"] == ROWS
    settings = manifest["settings"]
    assert {
        k: settings[k]
        for k in ("query_prefix", "passage_prefix", "pooling", "faiss_index", "faiss_class", "dim")
    } == {
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
        "pooling": "mean",
        "faiss_index": "flat",
        "faiss_class": "IndexFlatIP",
        "dim": 16,
    }
    assert settings["imported_from"] == {
        "faiss": "e5_Flat.index",
        "corpus": "wiki-200.jsonl",
        "format": "flashrag",
        "index_file": "copy",
    }
    assert set(manifest["files"]["index.faiss"]) == {"bytes", "sha256"}  # small: hashed
    # (b) the same top-5 ids and scores as Search-R1's server on the original index
    ids, scores = search_r1_hits(source, folder, original, 5)
    retriever = open_index(out, encoder=folder)
    assert retriever.pooling == "mean" and retriever.query_prefix == "query: "
    assert retriever.passages[0].title == "Evan Morris"  # contents split into title and text
    assert_same_hits(retriever, ids, scores)
    # ... and through the command line
    main(["index", "search", str(out), QUERIES[0], "-k", "3", "--encoder", folder])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in printed] == ids[0][:3]


def test_hub_id_encoder_matches_a_local_copy_by_name(source, tmp_path, capsys):
    # Recorded as typed, never loaded: intfloat/tiny-e5 exists nowhere here.
    folder = encoder_folder(source, "tiny-e5")
    flat = tmp_path / "e5_Flat.index"
    _, original = search_r1_index(source, folder, "Flat", flat)
    out = tmp_path / "wiki-e5"
    run_import(flat, source["corpus"], "intfloat/tiny-e5", out)
    assert json.loads((out / "manifest.json").read_text())["encoder"] == "intfloat/tiny-e5"
    ids, scores = search_r1_hits(source, folder, original, 4)
    assert_same_hits(open_index(out, encoder=folder), ids, scores)  # a folder named tiny-e5
    snapshot = tmp_path / "hub" / "models--intfloat--tiny-e5" / "snapshots" / "0123abc"
    shutil.copytree(folder, snapshot)  # the hub cache's layout
    assert_same_hits(open_index(out, encoder=str(snapshot)), ids, scores)
    other = tmp_path / "other-model"
    shutil.copytree(folder, other)
    with pytest.raises(IndexMismatchError, match="encoder='intfloat/tiny-e5'"):
        open_index(out, encoder=str(other))
    # a folder with the right name but another model (32-wide): one line at the first search
    wide = tmp_path / "elsewhere" / "tiny-e5"
    _wide_bert(wide, source["words"])
    with pytest.raises(
        IndexMismatchError,
        match="gives vectors of size 32 but the index .* holds vectors of size 16",
    ):
        open_index(out, encoder=str(wide)).search(QUERIES, 3)


def _wide_bert(folder: Path, words: list[str]) -> None:
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]))
    config = BertConfig(
        vocab_size=4 + len(words),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)


@pytest.mark.parametrize(
    ("name", "spec", "family", "structure"),
    [
        ("tiny-bge", "HNSW8", "hnsw", {"hnsw_m": 8}),
        ("tiny-e5", "IVF8,PQ4x4", "ivf", {"nlist": 8, "pq_m": 4}),
    ],
)
def test_approximate_indexes_import_and_search(source, tmp_path, name, spec, family, structure):
    folder = encoder_folder(source, name)
    path = tmp_path / f"{name}_{spec.replace(',', '_')}.index"
    _, original = search_r1_index(source, folder, spec, path)
    out = tmp_path / "idx"
    run_import(path, source["corpus"], folder, out)
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["faiss_index"] == family
    assert {k: settings[k] for k in structure} == structure
    bge = "bge" in name  # Search-R1: bge pools CLS, instruction on queries only
    assert settings["pooling"] == ("cls" if bge else "mean")
    assert settings["query_prefix"] == (BGE_INSTRUCTION if bge else "query: ")
    assert settings["passage_prefix"] == ("" if bge else "passage: ")
    # the imported file holds the source's vectors (ivf: make its direct map to reconstruct)
    imported = faiss.read_index(str(out / "index.faiss"))
    if family == "ivf":
        imported.make_direct_map()
        original.make_direct_map()
    np.testing.assert_array_equal(imported.reconstruct_n(0, ROWS), original.reconstruct_n(0, ROWS))
    # lit-rag searches hnsw with efSearch = max(64, k), ivf with nprobe = min(16, nlist): the
    # source index searched with the same parameters gives the same hits
    if family == "hnsw":
        original.hnsw.efSearch = 64
    else:
        original.nprobe = 8
    ids, scores = search_r1_hits(source, folder, original, 5)
    loaded = open_index(out, encoder=folder)
    assert_same_hits(loaded, ids, scores)
    if bge:  # a recipe's lazy retriever (pooling left out) takes the recorded pooling
        from lit_rag.plugins.retrievers.dense import DenseRetriever

        lazy = DenseRetriever(index=str(out), encoder=folder, query_prefix=BGE_INSTRUCTION)
        assert_same_hits(lazy, ids, scores)
        assert lazy.pooling == "cls"
        with pytest.raises(
            IndexMismatchError, match="pooling='cls' but the recipe expects pooling='max'"
        ):
            DenseRetriever(index=str(out), encoder=folder, pooling="max").search(QUERIES, 1)


def test_link_shares_the_file_and_falls_back_to_a_copy(source, tmp_path, capsys, monkeypatch):
    folder = encoder_folder(source, "tiny-e5")
    flat = tmp_path / "e5_Flat.index"
    search_r1_index(source, folder, "Flat", flat)
    out = tmp_path / "linked"
    capsys.readouterr()
    run_import(flat, source["corpus"], folder, out, "--link")
    assert "index.faiss as a hard link" in capsys.readouterr().out
    assert os.stat(out / "index.faiss").st_ino == os.stat(flat).st_ino  # one file, not two
    assert open_index(out, encoder=folder).search(QUERIES[:1], 2)[0]

    # a fake os.link failing as across file systems (no second file system here to show it)
    def cross_device(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", cross_device)
    run_import(flat, source["corpus"], folder, tmp_path / "copied", "--link")
    assert "as a copy (hard link failed: another file system)" in capsys.readouterr().out
    assert os.stat(tmp_path / "copied" / "index.faiss").st_ino != os.stat(flat).st_ino


def test_bad_input_is_one_line(source, tmp_path, capsys):
    folder = encoder_folder(source, "tiny-e5")
    flat = tmp_path / "e5_Flat.index"
    search_r1_index(source, folder, "Flat", flat)
    out, corpus = tmp_path / "out", source["corpus"]
    lines = corpus.read_text(encoding="utf-8").splitlines()
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    litrag = tmp_path / "litrag.jsonl"
    litrag.write_text('{"id": "1", "title": "T", "text": "x"}\n', encoding="utf-8")
    text = tmp_path / "notes.index"
    text.write_text("not a faiss index\n")
    l2 = tmp_path / "l2.index"
    faiss.write_index(faiss.IndexFlatL2(16), str(l2))
    pq = tmp_path / "pq.index"
    pq_index = faiss.index_factory(16, "PQ4x4", faiss.METRIC_INNER_PRODUCT)
    pq_index.train(faiss.read_index(str(flat)).reconstruct_n(0, ROWS))
    faiss.write_index(pq_index, str(pq))

    def error(faiss_file, corpus_file, *extra, encoder=folder) -> str:
        return one_line_error(
            [
                "index",
                "import",
                "--faiss",
                str(faiss_file),
                "--corpus",
                str(corpus_file),
                "--encoder",
                encoder,
                "--out",
                str(out),
                *extra,
            ],
            capsys,
        )

    assert (
        f"{flat} holds 200 vectors but {short} has 199 passages; faiss row i is corpus line i"
    ) in error(flat, short)
    assert f"{text}: not a readable faiss index (" in error(text, corpus)
    assert f"--faiss {tmp_path / 'gone.index'}: file not found; give the faiss index file" in error(
        tmp_path / "gone.index", corpus
    )
    assert f"--corpus {tmp_path / 'gone.jsonl'}: file not found; give the FlashRAG" in error(
        flat, tmp_path / "gone.jsonl"
    )
    assert "missing field 'contents' (a flashrag corpus row needs: id, contents)" in error(
        flat, litrag
    )
    assert "a IndexFlatL2 with metric L2; lit-rag imports inner-product indexes only" in error(
        l2, corpus
    )
    assert "faiss index type IndexPQ is not supported" in error(pq, corpus)
    assert "--pooling: got 'avg'; allowed: mean, cls, max" in error(
        flat, corpus, "--pooling", "avg"
    )
    assert "model path './no/such/model' does not exist" in error(
        flat, corpus, encoder="./no/such/model"
    )
    assert not out.exists()  # a failed import leaves nothing behind
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")] == []


def test_pooling_setting_is_checked(source, tmp_path, capsys):
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    with pytest.raises(ValueError, match="pooling: got 'avg'; allowed: mean, cls, max or None"):
        DenseRetriever(pooling="avg")
    folder = encoder_folder(source, "tiny-e5")
    flat = tmp_path / "e5_Flat.index"
    search_r1_index(source, folder, "Flat", flat)
    out = tmp_path / "idx"
    run_import(flat, source["corpus"], folder, out, "--pooling", "max")
    assert open_index(out, encoder=folder).pooling == "max"  # the user's choice is recorded
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["settings"]["pooling"] = "avg"  # a tampered manifest
    (out / "manifest.json").write_text(json.dumps(manifest))
    line = one_line_error(["index", "search", str(out), "paris", "--encoder", folder], capsys)
    assert "are not valid DenseRetriever settings (pooling: got 'avg'" in line
