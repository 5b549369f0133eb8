"""A byte that is not UTF-8 is reported with the line it is on, as invalid JSON is: in a data
file, a corpus, a recipe, a run's ``metrics.csv`` and an index's files. Each file below is good
UTF-8 but for one Latin-1 ``é`` (byte ``0xe9``) on line 5; ``0xe9`` opens a three-byte sequence,
and the ``l`` after it is no continuation byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import lightning_logs_to_this_stderr, one_line_error

from lit_rag.cli.commands import main

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
ROW = {"question": "Who founded Orbel Mills?", "answers": ["Ada Orbel"]}


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr():
    """Lightning logs to this test's stderr (:func:`helpers.lightning_logs_to_this_stderr`)."""
    lightning_logs_to_this_stderr()
    yield


def _fifth_line_latin1(path: Path, lines: list[str]) -> str:
    """Write ``lines`` (five or more) with line 5 in Latin-1; returns what the error says of it:
    the reason, the byte and its place on the line (1-based)."""
    assert "é" in lines[4]
    data = b"".join(
        (line + "\n").encode("latin-1" if number == 5 else "utf-8")
        for number, line in enumerate(lines, start=1)
    )
    path.write_bytes(data)
    return f"invalid continuation byte: b'\\xe9' at byte {lines[4].index('é') + 1} of the line"


def test_first_non_utf8_counts_lines_and_bytes() -> None:
    from lit_rag.errors import first_non_utf8

    # line 2: "añ" is fine (ñ is two bytes); line 3: b"ok \xff" fails at its 4th byte
    lines = [b"fine\n", "a\u00f1\n".encode(), b"ok \xff\n", b"\xe9"]
    assert first_non_utf8(lines) == (3, "invalid start byte: b'\\xff' at byte 4 of the line")
    assert first_non_utf8([b"\xe2\x82"]) == (
        1,
        "unexpected end of data: b'\\xe2' at byte 1 of the line",
    )
    assert first_non_utf8([b"\xef\xbb\xbfok\n"]) is None  # a byte-order mark is UTF-8


def test_data_file_names_the_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    rows = [json.dumps({"id": f"q{i}", **ROW}, ensure_ascii=False) for i in range(1, 7)]
    rows[4] = rows[4].replace("Orbel", "Orbél")
    what = _fifth_line_latin1(tmp_path / "train.jsonl", rows)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", TINY, "--trainer.logger=false", "--data.train=train.jsonl"])
    err = capsys.readouterr().err  # Lightning's start-up lines come first
    assert info.value.code == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    assert line == (
        f"lit-rag: error: train.jsonl:5: not UTF-8 text ({what}); "
        "data files must be UTF-8 JSON or JSONL"
    )


def test_json_list_data_file_names_the_line(tmp_path: Path) -> None:
    from lit_rag.data.readers import DatasetFormatError, read_examples

    lines = ["[", '{"id": "q1", "question": "a?", "answers": ["b"]},', '{"id": "q2",']
    lines += ['"question": "c?",', '"answers": ["Orbél"]}', "]"]
    what = _fifth_line_latin1(tmp_path / "train.json", lines)
    with pytest.raises(DatasetFormatError) as info:
        read_examples(tmp_path / "train.json", "litrag")
    assert str(info.value).startswith(f"{tmp_path / 'train.json'}:5: not UTF-8 text ({what})")


def test_corpus_names_the_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    rows = [json.dumps({"id": f"p{i}", "title": "Mills", "text": "Orbel Mills"}) for i in range(6)]
    rows[4] = rows[4].replace("Orbel", "Orbél")
    what = _fifth_line_latin1(tmp_path / "corpus.jsonl", rows)
    line = one_line_error(
        ["index", "build", "--corpus", "corpus.jsonl", "--retriever", "bm25", "--out", "idx"],
        capsys,
    )
    assert line.startswith(f"lit-rag: error: corpus.jsonl:5: not UTF-8 text ({what})")
    assert not (tmp_path / "idx").exists()


def test_recipe_names_the_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = Path(TINY).read_text(encoding="utf-8").splitlines()
    lines = [*recipe[:4], "# café", *recipe[4:]]
    what = _fifth_line_latin1(tmp_path / "recipe.yaml", lines)
    line = one_line_error(["fit", "--config", "recipe.yaml"], capsys)
    assert line.startswith(
        f"lit-rag: error: recipe 'recipe.yaml' line 5 is not UTF-8 text ({what})"
    )


def test_metrics_csv_names_the_line(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run" / "version_0"
    run.mkdir(parents=True)
    lines = ["step,reward/total", "0,0.1", "1,0.2", "2,0.3", "3,0.4 é", "4,0.5"]
    what = _fifth_line_latin1(run / "metrics.csv", lines)
    line = one_line_error(["report", str(tmp_path / "run")], capsys)
    assert line == f"lit-rag: error: {run / 'metrics.csv'}:5: not UTF-8 text ({what})"


def test_index_json_file_names_the_line(tmp_path: Path) -> None:
    from lit_rag.retrieval.manifest import IndexCorruptError, parse_json

    lines = ["{", '"a": 1,', '"b": 2,', '"c": 3,', '"d": "é"', "}"]
    what = _fifth_line_latin1(tmp_path / "manifest.json", lines)
    raw = (tmp_path / "manifest.json").read_bytes()
    with pytest.raises(IndexCorruptError) as info:
        parse_json(raw, tmp_path / "manifest.json", None, "the manifest")
    assert str(info.value).startswith(f"{tmp_path / 'manifest.json'}:5: not UTF-8 text ({what})")


def test_evaluate_record_names_the_line(tmp_path: Path, capsys) -> None:
    lines = ["{", '"suite": "search-r1",', '"metrics": {},', '"model": {"label": "untrained",']
    lines += ['"base": {"path": "é.gguf"}}', "}"]
    what = _fifth_line_latin1(tmp_path / "record.json", lines)
    line = one_line_error(["evaluate", "--records", str(tmp_path / "record.json")], capsys)
    assert line == (
        f"lit-rag: error: evaluate: record '{tmp_path / 'record.json'}:5' is not UTF-8 text "
        f"({what})"
    )
