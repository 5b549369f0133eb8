"""Loading an index checks its files against its manifest, and an index never chooses an import.

Each case damages one file of a small saved index the way it happens in practice (a passages
file or matrix copied from another build, a file cut short by a full disk or a killed copy, a
manifest copied from another corpus) and expects one line naming the file and what differs.
Cases marked "0.1.0 manifest" drop the manifest's ``files`` record (sizes and SHA-256s), as
manifests written before it had none, to reach the structural checks behind it (row counts of
the score matrix and the faiss index).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.retrievers.hybrid import HybridRetriever
from lit_rag.retrieval.base import open_index
from lit_rag.retrieval.manifest import IndexCorruptError, Manifest
from lit_rag.types import Passage
from tests.helpers import one_line_error, require_package, tiny_bert_folder

# corpus A: 6 passages; corpus B: 5 others; corpus A2: A with one word changed (same count)
A = [Passage(f"a{i}", f"Title {i}", f"river city number {i} with bridge {i}") for i in range(6)]
B = [Passage(f"b{i}", f"Other {i}", f"mountain lake forest {i}") for i in range(5)]
A2 = [*A[:5], Passage("a5", "Title 5", "river city number 5 with tower 5")]


def bm25_index(folder: Path, passages: list[Passage]) -> Path:
    retriever = BM25Retriever(stopwords=None, stemmer=None)
    retriever.build(passages)
    retriever.save(folder)
    return folder


def drop_files_record(folder: Path) -> None:
    """Make ``folder``'s manifest look like lit-rag 0.1.0's (no ``files`` record)."""
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    del data["files"]
    path.write_text(json.dumps(data))


def cut(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def idx(tmp_path: Path) -> Path:
    return bm25_index(tmp_path / "idx", A)


@pytest.fixture
def other(tmp_path: Path) -> Path:
    return bm25_index(tmp_path / "other", B)


# --------------------------------------------------------------------------- passages.jsonl


def test_passages_of_another_corpus(idx, other):
    shutil.copy(other / "passages.jsonl", idx / "passages.jsonl")
    with pytest.raises(
        IndexCorruptError,
        match=r"idx/passages.jsonl: holds 5 passages but "
        r".*idx/manifest.json records passage_count=6",
    ):
        BM25Retriever.load(idx)


def test_passages_of_another_corpus_with_the_same_count(idx, tmp_path):
    shutil.copy(bm25_index(tmp_path / "a2", A2) / "passages.jsonl", idx / "passages.jsonl")
    with pytest.raises(
        IndexCorruptError,
        match=r"passages.jsonl: corpus fingerprint [0-9a-f]{12}"
        r"\.\.\. differs from .*manifest.json's "
        r"corpus_fingerprint=",
    ):
        BM25Retriever.load(idx)


def test_truncated_passages(idx):
    # 6 lines of 78 bytes = 468; 60% keeps 280 bytes = 3 lines (234) + 46 bytes of line 4
    cut(idx / "passages.jsonl")
    with pytest.raises(IndexCorruptError, match=r"passages.jsonl:4: invalid JSON"):
        BM25Retriever.load(idx)
    lines = (idx / "passages.jsonl").read_text().splitlines(keepends=True)
    (idx / "passages.jsonl").write_text("".join(lines[:3]))  # cut at a line boundary
    with pytest.raises(IndexCorruptError, match="holds 3 passages but .* passage_count=6"):
        BM25Retriever.load(idx)


def test_passages_rows_must_be_passages(idx):
    (idx / "passages.jsonl").write_text('{"id": "a0", "text": "no title"}\n')
    with pytest.raises(
        IndexCorruptError,
        match=r'passages.jsonl:1: expected \{"id", "title", '
        r'"text"\} strings',
    ):
        BM25Retriever.load(idx)
    (idx / "passages.jsonl").write_bytes(b"\x1f\x8b\x08\x00binary")
    with pytest.raises(IndexCorruptError, match="passages.jsonl:1: not UTF-8 text"):
        BM25Retriever.load(idx)


# --------------------------------------------------------------------------- manifest.json


def test_manifest_of_another_corpus(idx, other, tmp_path):
    shutil.copy(other / "manifest.json", idx / "manifest.json")
    with pytest.raises(IndexCorruptError, match="holds 6 passages but .* passage_count=5"):
        BM25Retriever.load(idx)
    # same passage count, other corpus: the fingerprint differs
    shutil.copy(bm25_index(tmp_path / "a2", A2) / "manifest.json", idx / "manifest.json")
    with pytest.raises(IndexCorruptError, match="corpus fingerprint .* differs"):
        BM25Retriever.load(idx)


def test_truncated_or_damaged_manifest(idx):
    cut(idx / "manifest.json")
    with pytest.raises(IndexCorruptError, match=r"manifest.json:\d+: invalid JSON .* truncated"):
        BM25Retriever.load(idx)
    (idx / "manifest.json").write_bytes(b'{"retriever": "bm\xff25"}')
    with pytest.raises(IndexCorruptError, match="manifest.json:1: not UTF-8 text"):
        Manifest.read(idx)
    Manifest("bm25", None, "f" * 64, 6).write(idx)
    data = json.loads((idx / "manifest.json").read_text())
    for field, value, message in [
        ("passage_count", "6", "field 'passage_count' must be int, got str '6'"),
        ("passage_count", True, "field 'passage_count' must be int, got bool"),
        ("passage_count", -1, "field 'passage_count' must be >= 0, got -1"),
        ("settings", [], "field 'settings' must be dict, got list"),
        ("encoder", 3, "field 'encoder' must be str or null, got int"),
    ]:
        (idx / "manifest.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(IndexCorruptError, match=message):
            Manifest.read(idx)


def test_bm25_settings_must_be_usable(idx):
    data = json.loads((idx / "manifest.json").read_text())
    data["settings"]["lowercase"] = "yes"
    (idx / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(IndexCorruptError, match=r"settings\['lowercase'\] must be bool"):
        BM25Retriever.load(idx)


# --------------------------------------------------------------------------- bm25 matrices


def test_bm25_matrices_of_another_corpus(idx, other):
    shutil.rmtree(idx / "bm25s")
    shutil.copytree(other / "bm25s", idx / "bm25s")
    # the files record catches it first: another size than the manifest records
    with pytest.raises(
        IndexCorruptError,
        match=r"bm25s/\S+: \d+ bytes, but .*manifest.json "
        r"records \d+",
    ):
        BM25Retriever.load(idx)
    drop_files_record(idx)  # 0.1.0 manifest: the matrix row count catches it
    with pytest.raises(
        IndexCorruptError,
        match=r"params.index.json: the BM25 score matrix has 5 "
        r"rows but the manifest records passage_count=6",
    ):
        BM25Retriever.load(idx)


def test_bm25_file_changed_in_place(idx):
    # same size, other bytes (another build of a same-sized vocabulary): the SHA-256 differs
    vocab = idx / "bm25s" / "vocab.index.json"
    vocab.write_text(vocab.read_text().replace("river", "rivet"))
    with pytest.raises(
        IndexCorruptError, match="vocab.index.json: content differs from the SHA-256"
    ):
        BM25Retriever.load(idx)


def test_bm25_truncated_or_pickled_matrix(idx):
    data = idx / "bm25s" / "data.csc.index.npy"
    cut(data)
    with pytest.raises(IndexCorruptError, match="data.csc.index.npy: \\d+ bytes, but"):
        BM25Retriever.load(idx)
    drop_files_record(idx)
    with pytest.raises(
        IndexCorruptError,
        match=r"bm25s: the BM25 matrices cannot be read "
        r"\(ValueError: ",
    ):
        BM25Retriever.load(idx)
    # a pickled object array is refused (allow_pickle=False), never unpickled
    np.save(data, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(IndexCorruptError, match="cannot be read .*Python objects"):
        BM25Retriever.load(idx)


def test_bm25_params_cannot_add_constructor_arguments(idx):
    drop_files_record(idx)
    params = idx / "bm25s" / "params.index.json"
    params.write_text(json.dumps({**json.loads(params.read_text()), "corpus": ["x"]}))
    with pytest.raises(
        IndexCorruptError,
        match=r"params.index.json: expected a JSON object with "
        r"keys from k1, .*got \['corpus'\]",
    ):
        BM25Retriever.load(idx)


# --------------------------------------------------------------------------- dense / faiss


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> str:
    """A 1-layer, 16-wide random BERT with a 12-word vocab (plain HF folder, no download)."""
    require_package("faiss", "pip install faiss-cpu")
    require_package("sentence_transformers", "pip install sentence-transformers")
    words = [
        "river",
        "city",
        "number",
        "with",
        "bridge",
        "tower",
        "mountain",
        "lake",
        "forest",
        "title",
        "other",
    ]
    return tiny_bert_folder(tmp_path_factory.mktemp("tiny-bert"), words, max_positions=32)


def dense_index(folder: Path, passages: list[Passage], encoder: str) -> Path:
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    retriever = DenseRetriever(encoder=encoder, device="cpu")
    retriever.build(passages)
    retriever.save(folder)
    return folder


def test_faiss_truncated_or_of_another_corpus(tiny_encoder, tmp_path):
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    idx = dense_index(tmp_path / "idx", A, tiny_encoder)
    other = dense_index(tmp_path / "other", B, tiny_encoder)
    shutil.copy(idx / "index.faiss", tmp_path / "good.faiss")
    cut(idx / "index.faiss")
    with pytest.raises(IndexCorruptError, match=r"index.faiss: \d+ bytes, but .* records \d+"):
        DenseRetriever.load(idx, encoder=tiny_encoder)
    drop_files_record(idx)
    with pytest.raises(
        IndexCorruptError,
        match=r"index.faiss: not a readable faiss index \(.*\); "
        "the file is truncated or damaged",
    ):
        DenseRetriever.load(idx, encoder=tiny_encoder)
    shutil.copy(other / "index.faiss", idx / "index.faiss")
    with pytest.raises(
        IndexCorruptError,
        match=r"index.faiss: the faiss index has 5 rows but "
        r"the manifest records passage_count=6",
    ):
        DenseRetriever.load(idx, encoder=tiny_encoder)
    shutil.copy(tmp_path / "good.faiss", idx / "index.faiss")  # and the intact file loads
    assert len(DenseRetriever.load(idx, encoder=tiny_encoder).passages) == 6


def test_dense_passages_of_another_corpus(tiny_encoder, tmp_path):
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    idx = dense_index(tmp_path / "idx", A, tiny_encoder)
    (idx / "passages.jsonl").write_text(
        "".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in A2)
    )
    with pytest.raises(IndexCorruptError, match="passages.jsonl: corpus fingerprint"):
        DenseRetriever(index=str(idx), encoder=tiny_encoder).search(["river"], 1)


# --------------------------------------------------------------------------- planted imports


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on sys.path that writes a marker file when imported; returns the marker."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "planted_ran"
    (site / "planted_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "class Evil:\n    @classmethod\n    def load(cls, directory, **kw):\n        return cls()\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "planted_module", raising=False)
    return marker


def planted_hybrid(folder: Path) -> Path:
    hybrid = HybridRetriever([BM25Retriever(stemmer=None), BM25Retriever(stemmer=None)])
    hybrid.build(A)
    hybrid.save(folder)
    # the parent names the child by a dotted path (kind and 0.1.0's class); so does the child
    data = json.loads((folder / "manifest.json").read_text())
    data["settings"]["children"][1].update(
        kind="planted_module.Evil", **{"class": "planted_module.Evil"}
    )
    (folder / "manifest.json").write_text(json.dumps(data))
    child = json.loads((folder / "1-bm25" / "manifest.json").read_text())
    (folder / "1-bm25" / "manifest.json").write_text(
        json.dumps({**child, "retriever": "planted_module.Evil"})
    )
    return folder


def test_planted_manifests_import_nothing(planted, idx, tmp_path, capsys):
    hybrid = planted_hybrid(tmp_path / "hyb")
    with pytest.raises(
        IndexCorruptError,
        match=r"1-bm25/manifest.json: retriever "
        r"'planted_module.Evil' is not an installed "
        r"retriever; installed: bm25, dense, http, hybrid",
    ):
        HybridRetriever.load(hybrid)
    # the top-level retriever named by a dotted path: looked up among registered names only
    data = json.loads((idx / "manifest.json").read_text())
    (idx / "manifest.json").write_text(json.dumps({**data, "retriever": "planted_module.Evil"}))
    with pytest.raises(
        IndexCorruptError,
        match="retriever 'planted_module.Evil' is not an "
        "installed retriever; installed: bm25, dense, "
        "http, hybrid",
    ):
        open_index(idx)
    line = one_line_error(["index", "search", str(idx), "river"], capsys)
    assert "not an installed retriever" in line
    line = one_line_error(["index", "search", str(hybrid), "river"], capsys)
    assert "1-bm25/manifest.json: retriever 'planted_module.Evil' is not an installed" in line
    assert not planted.exists() and "planted_module" not in sys.modules


@pytest.mark.subprocess
def test_planted_hybrid_through_the_real_command(planted, tmp_path):
    hybrid = planted_hybrid(tmp_path / "hyb")
    site = str(planted.parent / "site")
    run = subprocess.run(
        [sys.executable, "-m", "lit_rag", "index", "search", str(hybrid), "river"],
        check=False,
        capture_output=True,
        text=True,
        env={**_env(), "PYTHONPATH": site},
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("lit-rag: error: ") and "planted" in lines[0]
    assert not planted.exists()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# --------------------------------------------------------------------------- command line


def test_corrupt_indexes_are_one_line_on_the_command_line(idx, other, capsys):
    # (damage, the file the line names)
    cases = [
        (lambda: shutil.copy(other / "passages.jsonl", idx / "passages.jsonl"), "passages.jsonl"),
        (lambda: cut(idx / "passages.jsonl"), "passages.jsonl:4"),
        (lambda: shutil.copy(other / "manifest.json", idx / "manifest.json"), "passage_count=5"),
        (lambda: cut(idx / "manifest.json"), "manifest.json:"),
        (lambda: cut(idx / "bm25s" / "indptr.csc.index.npy"), "indptr.csc.index.npy"),
    ]
    pristine = idx.parent / "pristine"
    shutil.copytree(idx, pristine)
    for damage, named in cases:
        shutil.rmtree(idx)
        shutil.copytree(pristine, idx)
        damage()
        line = one_line_error(["index", "search", str(idx), "river"], capsys)
        assert named in line, line


def test_bad_k_batch_size_and_query(idx, tmp_path, capsys):
    for args, message in [
        (["search", str(idx), "river", "-k", "0"], "-k: got 0; expected an integer >= 1"),
        (["search", str(idx), "river", "-k", "-1"], "-k: got -1; expected an integer >= 1"),
        (["eval", str(idx), "--data", "x.jsonl", "-k", "5", "0"], "-k: got 0"),
        (["eval", str(idx), "--data", "x.jsonl", "--batch-size", "0"], "--batch-size: got 0"),
        (["search", str(idx), "river \udcff"], r"query 'river \udcff' holds '\udcff'"),
    ]:
        line = one_line_error(["index", *args], capsys)
        assert message in line, line


@pytest.mark.subprocess
def test_invalid_utf8_bytes_on_the_real_command_line(idx):
    # Python decodes argv with surrogateescape: b"\xff" arrives as "\udcff"
    run = subprocess.run(
        [sys.executable, "-m", "lit_rag", "index", "search", str(idx), b"river \xff"],
        check=False,
        capture_output=True,
        timeout=120,
    )
    err = run.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert run.returncode == 2 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("lit-rag: error: query 'river \\udcff'"), err
