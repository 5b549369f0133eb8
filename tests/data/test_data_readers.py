"""Dataset readers on the real samples in ../shared/data and on small malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rag.data import (
    DatasetFormatError,
    detect_format,
    read_2wiki,
    read_examples,
    read_flashrag,
    read_hotpotqa,
    read_litrag,
    read_musique,
    write_litrag,
)
from lit_rag.types import Example, Passage

# file -> (format, count, first id, first question, first answers)
SAMPLES = {
    "hotpotqa_dev10.jsonl": (
        "hotpotqa",
        10,
        "5ade063d5542995b365fabcd",
        "Donnie Smith who plays as a left back for New England Revolution "
        "belongs to what league featuring 22 teams?",
        ["Major League Soccer"],
    ),
    "hotpotqa_train100.json": (
        "hotpotqa",
        100,
        "5a77ec115542992a6e59dff7",
        "If Gallu is a demon Lilu is what?",
        ["a spirit"],
    ),
    "2wikimultihopqa_dev10.jsonl": (
        "2wiki",
        10,
        "f3e6c20309ab11ebbdb0ac1f6bf848b6",
        "Which song was released more recently, Come With Me (Pure "
        "Imagination) or Hold On Me (Grinspoon Song)?",
        ["Come With Me (Pure Imagination)"],
    ),
    "musique_dev10.jsonl": (
        "musique",
        10,
        "2hop__227791_75487",
        "Who is the federal leader of the political party Ken Epp belongs to?",
        ["Andrew Scheer"],
    ),
    "musique_train100.json": (
        "musique",
        100,
        "2hop__150763_14904",
        "Who was the first president of the association which published "
        "Journal of Psychotherapy Integration?",
        ["G. Stanley Hall", "Stanley Hall"],
    ),
    "bamboogle_flashrag.jsonl": (
        "flashrag",
        125,
        "test_0",
        "Who was president of the United States in the year that Citibank was founded?",
        ["james madison"],
    ),
    # README says 16, the file holds test_0 .. test_16 (its last line has no newline)
    "nq_test16_flashrag.jsonl": (
        "flashrag",
        17,
        "test_0",
        "who got the first nobel prize in physics",
        ["Wilhelm Conrad Röntgen"],
    ),
}


def _raw_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_real_sample(shared_data: Path, name: str) -> None:
    fmt, count, first_id, question, answers = SAMPLES[name]
    path = shared_data / name
    assert detect_format(path) == fmt
    examples = read_examples(path)
    assert examples == read_examples(path, format=fmt)
    assert len(examples) == count
    first = examples[0]
    assert (first.id, first.question, first.answers) == (first_id, question, answers)
    for ex in examples:
        assert ex.answers and all(isinstance(a, str) and a for a in ex.answers)
        ref_ids = [p.id for p in ex.references]
        assert len(set(ref_ids)) == len(ref_ids)
        assert set(ex.gold_ids) <= set(ref_ids)
        if fmt == "flashrag":
            assert ex.references == [] and ex.gold_ids == []
        else:
            assert ex.gold_ids, ex.id


@pytest.mark.parametrize(
    "name", ["hotpotqa_dev10.jsonl", "hotpotqa_train100.json", "2wikimultihopqa_dev10.jsonl"]
)
def test_context_references_in_original_order(shared_data: Path, name: str) -> None:
    path = shared_data / name
    for raw, ex in zip(_raw_records(path), read_examples(path), strict=True):
        assert [p.title for p in ex.references] == [title for title, _ in raw["context"]]
        # gold ids follow reference order
        positions = [[p.id for p in ex.references].index(g) for g in ex.gold_ids]
        assert positions == sorted(positions)


def test_hotpotqa_first_row_by_hand(shared_data: Path) -> None:
    ex = read_hotpotqa(shared_data / "hotpotqa_dev10.jsonl")[0]
    # supporting_facts: [["Donnie Smith", 0], ["Major League Soccer", 0],
    #                    ["Major League Soccer", 2]]
    # context titles: MLS Cup 2005, Donnie Smith, ..., Major League Soccer (6th), ...
    assert ex.gold_ids == ["Donnie Smith", "Major League Soccer"]
    assert [p.id for p in ex.references][:3] == [
        "MLS Cup 2005",
        "Donnie Smith",
        "Midnight Riders (MLS supporters association)",
    ]
    assert len(ex.references) == 10
    assert ex.references[1].text.startswith('Donald W. "Donnie" Smith (born December 7, 1990')
    assert "  " not in ex.references[0].text
    assert ex.meta == {"type": "bridge", "level": "hard"}


def test_2wiki_meta_and_gold(shared_data: Path) -> None:
    ex = read_2wiki(shared_data / "2wikimultihopqa_dev10.jsonl")[0]
    # supporting facts name "Come with Me (Pure Imagination)" (4th) and
    # "Hold on Me (Grinspoon song)" (1st): gold in reference order
    assert ex.gold_ids == ["Hold on Me (Grinspoon song)", "Come with Me (Pure Imagination)"]
    assert ex.meta["type"] == "comparison"
    assert ex.meta["evidences"][1] == ["Hold on Me (Grinspoon song)", "publication date", "2005"]


def test_musique_paragraphs_gold_and_duplicate_titles(shared_data: Path) -> None:
    path = shared_data / "musique_dev10.jsonl"
    raw = {r["id"]: r for r in _raw_records(path)}
    examples = {ex.id: ex for ex in read_musique(path)}
    for ex_id, ex in examples.items():
        paragraphs = raw[ex_id]["paragraphs"]
        assert [p.title for p in ex.references] == [p["title"] for p in paragraphs]
        supporting = [i for i, p in enumerate(paragraphs) if p["is_supporting"]]
        assert ex.gold_ids == [ex.references[i].id for i in supporting]
        assert ex.meta["hops"] == len(raw[ex_id]["question_decomposition"])
    # this row holds "European Central Bank" three times; the 2nd copy is gold
    ex = examples["2hop__27650_27628"]
    ecb = [p.id for p in ex.references if p.title == "European Central Bank"]
    assert ecb == [
        "European Central Bank",
        "European Central Bank (2)",
        "European Central Bank (3)",
    ]
    assert ex.gold_ids == ["European Central Bank", "European Central Bank (2)"]


def test_musique_answers_merge_aliases(tmp_path: Path) -> None:
    row = {
        "id": "m1",
        "question": "Q?",
        "answer": "Paris",
        "answer_aliases": ["paris", "Paris", "City of Light"],
        "answerable": False,
        "question_decomposition": [{}, {}, {}],
        "paragraphs": [{"idx": 0, "title": "A", "paragraph_text": "x", "is_supporting": True}],
    }
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    ex = read_musique(path)[0]
    assert ex.answers == ["Paris", "paris", "City of Light"]
    assert ex.meta == {"hops": 3, "answerable": False}


# --------------------------------------------------------------------------- small files


def _hotpot_row(**overrides: object) -> dict:
    row = {
        "_id": "h1",
        "question": "Where?",
        "answer": 1999,
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["B", 0], ["A", 1], ["B", 0]],
        "context": [["A", ["One.", " Two."]], ["B", ["Three."]], ["A", ["Four."]]],
    }
    row.update(overrides)
    return row


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_hotpotqa_repeated_titles_numeric_answer_json_list(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps([_hotpot_row()], indent=2))
    (ex,) = read_hotpotqa(path)
    assert [p.id for p in ex.references] == ["A", "B", "A (2)"]
    assert [p.title for p in ex.references] == ["A", "B", "A"]
    assert ex.references[0].text == "One. Two."
    assert ex.gold_ids == ["A", "B"]  # reference order, deduplicated
    assert ex.answers == ["1999"]


def test_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "h.jsonl", ["", _hotpot_row(), "   ", _hotpot_row(_id="h2")])
    assert [ex.id for ex in read_examples(path)] == ["h1", "h2"]


def test_missing_question_names_file_line_and_field(tmp_path: Path) -> None:
    row = _hotpot_row()
    del row["question"]
    path = _write_jsonl(tmp_path / "bad.jsonl", [_hotpot_row(), "", row])
    with pytest.raises(DatasetFormatError) as err:
        read_hotpotqa(path)
    assert str(err.value) == (
        f"{path}:3: missing field 'question' "
        "(the hotpotqa reader needs: _id, question, answer, context, supporting_facts)"
    )


def test_invalid_json_line(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [_hotpot_row(), '{"_id": "x", "question": '])
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl:2: invalid JSON") as err:
        read_examples(path, format="hotpotqa")
    assert "\n" not in str(err.value)


def test_missing_context_in_json_list_names_item(tmp_path: Path) -> None:
    row = _hotpot_row()
    del row["context"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([_hotpot_row(), row]))
    with pytest.raises(DatasetFormatError) as err:
        read_hotpotqa(path)
    assert str(err.value) == (
        f"{path}: item 2: missing field 'context' "
        "(the hotpotqa reader needs: _id, question, answer, context, supporting_facts)"
    )


def test_wrongly_shaped_field_is_a_format_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [_hotpot_row(context="not a list")])
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl:1: field 'context' must be a list"):
        read_hotpotqa(path)


def test_empty_answer_is_rejected(tmp_path: Path) -> None:
    row = {"id": "1", "question": "q", "golden_answers": ["", " "]}
    path = _write_jsonl(tmp_path / "f.jsonl", [row])
    with pytest.raises(DatasetFormatError, match=r"f\.jsonl:1: field 'golden_answers' holds no"):
        read_flashrag(path)


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError, match="dataset file not found: /no/such/file.jsonl"):
        read_examples("/no/such/file.jsonl")


def test_unknown_format_lists_allowed_names(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "h.jsonl", [_hotpot_row()])
    with pytest.raises(ValueError) as err:
        read_examples(path, format="hotpot")
    assert str(err.value) == (
        "unknown dataset format 'hotpot'; allowed: auto, hotpotqa, 2wiki, musique, flashrag, litrag"
    )


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        (_hotpot_row(), "hotpotqa"),
        (_hotpot_row(evidences=[["A", "r", "B"]]), "2wiki"),
        ({"id": "m", "question": "q", "answer": "a", "paragraphs": []}, "musique"),
        ({"id": "f", "question": "q", "golden_answers": ["a"]}, "flashrag"),
        ({"id": "l", "question": "q", "answers": ["a"]}, "litrag"),
    ],
)
def test_auto_detection(tmp_path: Path, row: dict, fmt: str) -> None:
    path = _write_jsonl(tmp_path / "x.jsonl", [row])
    assert detect_format(path) == fmt
    assert read_examples(path)[0].id == row.get("_id", row.get("id"))


def test_auto_detection_failure_names_keys(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "x.jsonl", [{"id": "1", "text": "t"}])
    with pytest.raises(DatasetFormatError, match=r"x\.jsonl:1: cannot detect the format from keys"):
        read_examples(path)


def test_flashrag_metadata_goes_to_meta(tmp_path: Path) -> None:
    row = {"id": "f", "question": "q", "golden_answers": ["a", "b", "a"], "metadata": {"src": "nq"}}
    (ex,) = read_flashrag(_write_jsonl(tmp_path / "f.jsonl", [row]))
    assert (ex.answers, ex.references, ex.meta) == (["a", "b"], [], {"src": "nq"})


def test_litrag_round_trip(tmp_path: Path) -> None:
    examples = [
        Example(
            id="e1",
            question='Who? "quoted" ünïcode',
            answers=["A", "B"],
            references=[Passage("p1", "T1", "Text one."), Passage("p2", "", "Two.")],
            gold_ids=["p2"],
            meta={"hops": 2, "chain": ["a", "b"], "nested": {"x": [1, 2]}},
        ),
        Example(id="e2", question="Q2", answers=["x"]),
    ]
    path = write_litrag(examples, tmp_path / "sub" / "out.jsonl")
    assert read_litrag(path) == examples
    assert read_examples(path) == examples


def test_litrag_round_trip_of_real_reader_output(shared_data: Path, tmp_path: Path) -> None:
    examples = read_musique(shared_data / "musique_dev10.jsonl")
    assert read_litrag(write_litrag(examples, tmp_path / "m.jsonl")) == examples


def test_litrag_gold_must_be_a_reference(tmp_path: Path) -> None:
    row = {
        "id": "l",
        "question": "q",
        "answers": ["a"],
        "references": [{"id": "p1", "title": "", "text": "t"}],
        "gold_ids": ["p9"],
    }
    with pytest.raises(DatasetFormatError, match=r"l\.jsonl:1: gold_ids \['p9'\] are not ids"):
        read_litrag(_write_jsonl(tmp_path / "l.jsonl", [row]))


# --------------------------------------------------------------------------- BOM, CRLF, question

#: format -> two well-formed records of it
ROWS = {
    "hotpotqa": [_hotpot_row(), _hotpot_row(_id="h2", question="When?")],
    "2wiki": [_hotpot_row(evidences=[["A", "r", "B"]]), _hotpot_row(_id="w2", evidences=[])],
    "musique": [
        {
            "id": f"m{i}",
            "question": f"Who {i}?",
            "answer": "a",
            "paragraphs": [
                {"idx": 0, "title": "T", "paragraph_text": "Text.", "is_supporting": True}
            ],
        }
        for i in (1, 2)
    ],
    "flashrag": [{"id": f"f{i}", "question": f"Who {i}?", "golden_answers": ["a"]} for i in (1, 2)],
    "litrag": [
        {
            "id": f"l{i}",
            "question": f"Who {i}?",
            "answers": ["a"],
            "references": [{"id": "p1", "title": "T", "text": "Text."}],
            "gold_ids": ["p1"],
        }
        for i in (1, 2)
    ],
}


def _windows(path: Path, text: str) -> Path:
    """``text`` saved as a Windows editor saves it: a UTF-8 byte-order mark, CRLF line ends."""
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    return path


@pytest.mark.parametrize("layout", ["jsonl", "json"])
@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_bom_and_crlf_read_as_the_plain_file(tmp_path: Path, fmt: str, layout: str) -> None:
    if layout == "jsonl":
        text = "".join(json.dumps(row) + "\n" for row in ROWS[fmt])
    else:
        text = json.dumps(ROWS[fmt], indent=2) + "\n"
    plain = tmp_path / f"plain.{layout}"
    plain.write_text(text, encoding="utf-8")
    windows = _windows(tmp_path / f"windows.{layout}", text)
    assert len(read_examples(plain, fmt)) == 2
    assert read_examples(windows, fmt) == read_examples(plain, fmt)
    assert read_examples(windows) == read_examples(plain)  # format detected through the BOM


@pytest.mark.parametrize("question", ["", " \t ", None])
@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_empty_question_names_file_and_line(tmp_path: Path, fmt: str, question) -> None:
    bad = {**ROWS[fmt][1], "question": question}
    path = _write_jsonl(tmp_path / "q.jsonl", [ROWS[fmt][0], "", bad])
    with pytest.raises(DatasetFormatError) as err:
        read_examples(path, fmt)
    got = "null" if question is None else repr(question)
    assert str(err.value) == (
        f"{path}:3: field 'question' is empty (got {got}); every example needs a question"
    )


def test_empty_question_in_a_json_list_names_the_item(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps([_hotpot_row(), _hotpot_row(question="  ")]))
    with pytest.raises(DatasetFormatError) as err:
        read_hotpotqa(path)
    assert str(err.value) == (
        f"{path}: item 2: field 'question' is empty (got '  '); every example needs a question"
    )
