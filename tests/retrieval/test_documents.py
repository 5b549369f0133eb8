"""A folder of .txt / .md documents as a corpus (``lit_rag.retrieval.documents``), and
``lit-rag index build --corpus FOLDER`` indexing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import one_line_error

from lit_rag.cli.commands import main
from lit_rag.errors import InputError
from lit_rag.retrieval.base import open_index
from lit_rag.retrieval.documents import read_documents, split_passages, title_and_body

EXAMPLE_DOCS = Path(__file__).resolve().parents[2] / "examples" / "own-data" / "docs"


def test_paragraphs_are_packed_while_they_fit():
    # 3 + 2 words fit in 5; adding the 4-word paragraph would make 9, so it starts a passage
    text = "One two three.\n\nFour five.\n\n  Six seven\neight nine.  "
    assert split_passages(text, 5) == ["One two three. Four five.", "Six seven eight nine."]


def test_a_long_paragraph_is_cut_into_windows():
    # 7 words at 3 a passage: 3 + 3 + 1; the next short paragraph joins the last window
    words = "a b c d e f g"
    assert split_passages(words + "\n\nh", 3) == ["a b c", "d e f", "g h"]
    assert split_passages("", 3) == [] and split_passages("\n\n \n", 3) == []


def test_titles_come_from_a_markdown_heading_or_the_file_name():
    md = "\n# Vask Light\n\nBuilt in 1861.\n\n## Keepers ##\n\nTobias Venn."
    assert title_and_body(Path("vask-light.md"), md) == (
        "Vask Light",
        "\nBuilt in 1861.\n\nKeepers\n\nTobias Venn.",
    )
    # no heading on its first line, and a .txt file's '#' is text
    assert title_and_body(Path("salt_works.md"), "Salt.\n# Later")[0] == "salt works"
    assert title_and_body(Path("sel.txt"), "# not a heading") == ("sel", "# not a heading")


def test_a_folder_reads_in_path_order_with_ids_per_document(tmp_path):
    (tmp_path / "b.md").write_text("# Bee\n\none two three\n\nfour five six", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a-note.TXT").write_text("seven eight", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")  # not a document
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD.txt").write_text("hidden", encoding="utf-8")
    passages = read_documents(tmp_path, passage_words=3)
    assert [(p.id, p.title, p.text) for p in passages] == [
        ("b.md#1", "Bee", "one two three"),
        ("b.md#2", "Bee", "four five six"),
        ("sub/a-note.TXT#1", "a note", "seven eight"),
    ]


def test_a_folder_without_documents_or_with_bad_text_is_one_line(tmp_path):
    with pytest.raises(InputError, match="no document in it; a corpus folder holds .txt or .md"):
        read_documents(tmp_path)
    (tmp_path / "empty.md").write_text("# Only a title\n", encoding="utf-8")
    with pytest.raises(InputError, match="every document in it is empty"):
        read_documents(tmp_path)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.txt: not UTF-8 text \(byte 3\)"):
        read_documents(tmp_path)
    with pytest.raises(InputError, match="--passage-words: got 0"):
        read_documents(tmp_path, passage_words=0)


def test_index_build_indexes_a_folder_of_documents(tmp_path, capsys):
    out = tmp_path / "index"
    main(
        ["index", "build", "--corpus", str(EXAMPLE_DOCS), "--retriever", "bm25", "--out", str(out)]
    )
    assert "with bm25 in" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "passages.jsonl").open(encoding="utf-8")]
    documents = sorted(p.name for p in EXAMPLE_DOCS.iterdir())
    assert {row["id"].split("#")[0] for row in rows} == set(documents)  # every document
    assert all(len(row["text"].split()) <= 100 for row in rows)
    ((hit, *_),) = open_index(str(out)).search(["who designed Vask Light"], 3)
    assert hit.passage.id == "vask-light.md#1" and hit.passage.title == "Vask Light"
    main(
        ["index", "build", "--corpus", str(EXAMPLE_DOCS), "--passage-words", "40"]
        + ["--out", str(tmp_path / "small")]
    )
    assert len(open_index(str(tmp_path / "small")).passages) > len(rows)


def test_index_build_refuses_a_format_for_a_folder_and_an_empty_folder(tmp_path, capsys):
    args = ["index", "build", "--corpus", str(tmp_path), "--out", str(tmp_path / "i")]
    line = one_line_error([*args, "--format", "flashrag"], capsys)
    assert "--format flashrag: a corpus folder is read as documents (.txt, .md)" in line
    line = one_line_error(args, capsys)
    assert f"corpus folder {tmp_path}: no document in it" in line
    assert not (tmp_path / "i").exists()
