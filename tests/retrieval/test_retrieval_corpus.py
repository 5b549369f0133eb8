"""Corpus readers (flashrag, litrag, pooled QA files), fingerprint and manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rag.data.readers import DatasetFormatError, read_examples
from lit_rag.retrieval.corpus import (
    corpus_fingerprint,
    corpus_ids,
    detect_corpus_format,
    pool_examples,
    pooled_gold_ids,
    read_corpus,
    write_corpus,
)
from lit_rag.retrieval.manifest import (
    IndexMismatchError,
    IndexNotFoundError,
    Manifest,
)
from lit_rag.types import Passage


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


# --------------------------------------------------------------------------- flashrag / litrag


def test_flashrag_contents_split_at_first_newline(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": 0, "contents": '"Paris"\nParis is the capital.\nSecond line.'},
            {"id": "b", "contents": "Kyoto (京都)\nCity in Japan."},  # unquoted title, unicode
            {"id": "c", "contents": "no newline at all"},
        ],
    )
    passages = read_corpus(path)
    assert passages == [
        Passage("0", "Paris", "Paris is the capital.\nSecond line."),
        Passage("b", "Kyoto (京都)", "City in Japan."),
        Passage("c", "", "no newline at all"),
    ]


def test_litrag_write_read_round_trip(tmp_path: Path) -> None:
    passages = [Passage("p1", "Zürich", "Stadt am See."), Passage("p2", "", "untitled")]
    path = write_corpus(passages, tmp_path / "sub" / "corpus.jsonl")
    assert detect_corpus_format(path) == "litrag"
    assert read_corpus(path) == passages
    assert read_corpus(path, format="litrag") == passages


@pytest.mark.parametrize(
    ("rows", "fmt", "message"),
    [
        ([{"id": "a", "contents": "x"}, {"contents": "y"}], "flashrag", ":2: missing field 'id'"),
        ([{"id": "a", "title": "t"}], "litrag", ":1: missing field 'text'"),
        ([{"id": "a", "text": ["x"]}], "litrag", ":1: field 'text' must be a string, got list"),
        (
            [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}],
            "litrag",
            ":2: duplicate passage id 'a'",
        ),
    ],
)
def test_bad_rows_name_file_line_and_field(
    tmp_path: Path, rows: list[dict], fmt: str, message: str
) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetFormatError, match=message) as info:
        read_corpus(path, format=fmt)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("fmt", "rows"),
    [
        ("flashrag", [{"id": "0", "contents": '"Paris"\nParis is the capital.'}]),
        ("litrag", [{"id": "p1", "title": "Paris", "text": "Paris is the capital."}]),
        (
            "hotpotqa",
            [
                {
                    "_id": "h1",
                    "question": "Where?",
                    "answer": "Paris",
                    "supporting_facts": [["Paris", 0]],
                    "context": [["Paris", ["Paris is the capital."]]],
                }
            ],
        ),
    ],
)
def test_bom_and_crlf_corpus_reads_as_the_plain_file(tmp_path: Path, fmt: str, rows) -> None:
    """A corpus saved by a Windows editor: UTF-8 byte-order mark, CRLF line ends."""
    plain = _jsonl(tmp_path / "plain.jsonl", rows)
    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    assert read_corpus(windows, fmt) == read_corpus(plain, fmt)
    assert read_corpus(windows) == read_corpus(plain)  # format detected through the BOM
    assert len(read_corpus(plain)) == 1


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown corpus format 'csv'; allowed: auto, flashrag"):
        read_corpus(tmp_path / "x.jsonl", format="csv")
    with pytest.raises(FileNotFoundError):
        read_corpus(tmp_path / "missing.jsonl")


def test_qa_file_without_paragraphs_is_not_a_corpus(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [{"id": "1", "question": "q?", "golden_answers": ["a"]}])
    with pytest.raises(DatasetFormatError, match="'flashrag' QA file has no paragraphs"):
        read_corpus(path)


# --------------------------------------------------------------------------- pooled QA files


def test_hotpotqa_pooled_one_passage_per_distinct_text(tmp_path: Path) -> None:
    # Two examples share the title "B" with different texts: the second is "B (2)".
    rows = [
        {
            "_id": "1",
            "question": "q1",
            "answer": "a",
            "supporting_facts": [["A", 0]],
            "context": [["A", ["a one."]], ["B", ["b one."]]],
        },
        {
            "_id": "2",
            "question": "q2",
            "answer": "a",
            "supporting_facts": [["B", 0]],
            "context": [["B", ["b two."]], ["C", ["c one."]]],
        },
    ]
    path = _jsonl(tmp_path / "hotpot.jsonl", rows)
    assert detect_corpus_format(path) == "hotpotqa"
    assert read_corpus(path) == [
        Passage("A", "A", "a one."),
        Passage("B", "B", "b one."),
        Passage("B (2)", "B", "b two."),
        Passage("C", "C", "c one."),
    ]


@pytest.mark.parametrize(
    ("name", "fmt", "count", "first_id"),
    [
        # counts: hotpot 10 x 10 paragraphs, all titles distinct; 2wiki 100 paragraphs with one
        # shared by two examples; musique 10 x 20 paragraphs, all distinct texts under 188
        # distinct titles (a title-keyed pool lost 12 of them)
        ("hotpotqa_dev10.jsonl", "hotpotqa", 100, "MLS Cup 2005"),
        ("2wikimultihopqa_dev10.jsonl", "2wiki", 99, "Hold on Me (Grinspoon song)"),
        ("musique_dev10.jsonl", "musique", 200, "Inky Mark"),
    ],
)
def test_real_multihop_files_pool_into_corpora(
    shared_data: Path, name: str, fmt: str, count: int, first_id: str
) -> None:
    path = shared_data / name
    passages = read_corpus(path)
    assert detect_corpus_format(path) == fmt
    assert len(passages) == count
    assert passages[0].id == passages[0].title == first_id
    ids = {p.id for p in passages}
    assert len(ids) == count
    # every gold reference of every example is the corpus passage with its text
    texts = {p.id: p.text for p in passages}
    for example in read_examples(path):
        gold = pooled_gold_ids(example, corpus_ids(passages))
        by_id = {ref.id: ref.text for ref in example.references}
        assert [texts[g] for g in gold] == [by_id[g] for g in example.gold_ids]


def test_pooled_gold_ids_maps_repeated_title_suffix() -> None:
    from lit_rag.types import Example

    example = Example(
        id="e",
        question="q",
        answers=["a"],
        references=[Passage("X", "X", "first"), Passage("X (2)", "X", "second")],
        gold_ids=["X (2)"],
    )
    assert pooled_gold_ids(example) == ["X"]


def test_pooled_gold_ids_find_a_repeated_title_by_its_text() -> None:
    from lit_rag.types import Example

    second = Example(
        "2", "q2", ["a"], [Passage("X", "X", "two"), Passage("X (2)", "X", "one")], ["X"]
    )
    passages = [Passage("X", "X", "one"), Passage("X (2)", "X", "two")]
    # the reader's "X" of the second question is the corpus's "X (2)"
    assert pooled_gold_ids(second, corpus_ids(passages)) == ["X (2)"]
    # index eval maps only the gold texts it needs
    assert corpus_ids(passages, {("X", "two")}) == {("X", "two"): "X (2)"}


def test_pool_examples_keeps_every_text_and_renames_gold_to_corpus_ids() -> None:
    from lit_rag.types import Example

    examples = [
        Example("1", "q1", ["a"], [Passage("X", "X", "one"), Passage("Y", "Y", "y")], ["X"]),
        # a real title "X (2)" forces the second text of "X" to "X (3)"
        Example(
            "2",
            "q2",
            ["a"],
            [Passage("X", "X", "two"), Passage("X (2)", "X (2)", "real"), Passage("Y", "Y", "y")],
            ["X", "Y"],
        ),
    ]
    passages, renamed = pool_examples(examples)
    assert passages == [
        Passage("X", "X", "one"),
        Passage("Y", "Y", "y"),
        Passage("X (3)", "X", "two"),
        Passage("X (2)", "X (2)", "real"),
    ]
    assert renamed[0].gold_ids == ["X"]
    assert renamed[1].gold_ids == ["X (3)", "Y"]
    assert [r.id for r in renamed[1].references] == ["X (3)", "X (2)", "Y"]
    assert examples[1].gold_ids == ["X", "Y"]  # the input is not changed


def test_real_flashrag_corpus_sample(shared_data: Path) -> None:
    passages = read_corpus(shared_data / "wiki_corpus1000_flashrag.jsonl")
    assert len(passages) == 1000
    first = passages[0]
    assert (first.id, first.title) == ("0", "Evan Morris")
    assert first.text.startswith("Evan Morris Evan L. Morris (January 26, 1977 – July 9, 2015)")
    assert passages[-1].title == "Andrew Carnegie"


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable_and_sensitive() -> None:
    corpus = [Passage("1", "A", "alpha"), Passage("2", "B", "beta")]
    fp = corpus_fingerprint(corpus)
    assert len(fp) == 64 and fp == corpus_fingerprint(list(corpus))
    assert corpus_fingerprint([Passage("1", "A", "alpha!"), corpus[1]]) != fp  # text changed
    assert corpus_fingerprint(corpus[::-1]) != fp  # order changed
    assert corpus_fingerprint([Passage("1", "Ab", "c")]) != corpus_fingerprint(
        [Passage("1", "A", "bc")]
    )  # field boundaries count
    # pinned value: guards against an accidental change of the hashing scheme
    assert corpus_fingerprint([]) == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256(b"")
    )


# --------------------------------------------------------------------------- manifest


def _manifest() -> Manifest:
    return Manifest(
        retriever="dense",
        encoder="e5-small",
        corpus_fingerprint="f" * 64,
        passage_count=3,
        settings={"normalize": True},
    )


def test_manifest_round_trip(tmp_path: Path) -> None:
    manifest = _manifest()
    manifest.write(tmp_path / "idx")
    back = Manifest.read(tmp_path / "idx")
    assert back == manifest
    assert back.lit_rag_version and back.created


def test_manifest_missing_dir_or_file(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="index folder not found"):
        Manifest.read(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="has no manifest.json"):
        Manifest.read(tmp_path)


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        (
            {"encoder": "bge-base"},
            "has encoder='e5-small' but the recipe expects encoder='bge-base'",
        ),
        ({"corpus_fingerprint": "0" * 64}, "has corpus_fingerprint='ffff"),
        ({"retriever": "bm25"}, "has retriever='dense' but the recipe expects retriever='bm25'"),
        ({"normalize": False}, "has normalize=True but the recipe expects normalize=False"),
    ],
)
def test_manifest_mismatch_is_one_line(expected: dict, message: str) -> None:
    with pytest.raises(IndexMismatchError, match=message) as info:
        _manifest().check(expected, where="idx")
    assert "\n" not in str(info.value)


def test_manifest_check_passes_and_skips_none() -> None:
    _manifest().check({"retriever": "dense", "encoder": "e5-small", "corpus_fingerprint": None})
