"""A third-party retriever package, written against ``lit_rag.api`` alone, builds, searches and
serves through lit-rag's own commands (``plugins/lit-rag-tfidf``, entry point ``tfidf``).

Skipped when the package is not installed, except in CI (``CI`` set), which installs it.
"""

from __future__ import annotations

import ast
import json
import signal
from pathlib import Path

import pytest
from helpers import one_line_error, require_package, start_index_server, stop_index_server

from lit_rag import registry
from lit_rag.cli.commands import main
from lit_rag.plugins.retrievers.http import HttpRetriever

require_package("lit_rag_tfidf", "pip install --no-deps -e plugins/lit-rag-tfidf")
import lit_rag_tfidf  # noqa: E402

QUERY = "which region is Zedale in"


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    registry.clear_cache()
    out = tmp_path_factory.mktemp("tfidf") / "synthetic-tfidf"
    main(
        [
            "index",
            "build",
            "--corpus",
            "synthetic",
            "--retriever",
            "tfidf",
            "--out",
            str(out),
            "--min-df",
            "1",
            "--sublinear-tf=false",
        ]
    )
    return out


def test_the_package_imports_only_the_public_api():
    tree = ast.parse(Path(lit_rag_tfidf.__file__).read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert sorted(m for m in modules if m.split(".")[0] == "lit_rag") == ["lit_rag.api"]
    assert registry.available("retriever")["tfidf"].package == "lit-rag-tfidf"


def test_index_build_passes_the_constructors_options(index):
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["retriever"] == "tfidf"
    assert manifest["settings"] == {"lowercase": True, "sublinear_tf": False, "min_df": 1}
    assert manifest["passage_count"] > 1000
    words = json.loads((index / "vocabulary.json").read_text())["words"]
    assert "zedale" in words


def test_index_search_finds_the_passage(index, capsys):
    main(["index", "search", str(index), QUERY, "-k", "3"])
    lines = capsys.readouterr().out.strip().splitlines()
    hits = [line for line in lines if line.lstrip()[:1].isdigit()]
    assert len(hits) == 3
    assert "w1  Zedale: Zedale is a city in the region of Branbosora" in hits[0]


@pytest.mark.subprocess
def test_served_index_answers_as_the_index_does(index):
    process, url = start_index_server([str(index), "--topk", "2"])
    try:
        served = HttpRetriever(url=url, retries=0).search([QUERY, "Tamar Vesk born"], k=3)
    finally:
        code, _, _ = stop_index_server(process, signal.SIGTERM)
    local = lit_rag_tfidf.TfidfRetriever.load(index).search([QUERY, "Tamar Vesk born"], k=3)
    assert code == 0
    assert [[h.passage.id for h in hits] for hits in served] == [
        [h.passage.id for h in hits] for hits in local
    ]
    assert served[0][0].score == pytest.approx(local[0][0].score, rel=1e-5)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--min-df", "0"], "index build --retriever tfidf: min_df: got 0; expected >= 1"),
        (["--min-df", "two"], 'index build: Parser key "min_df"'),
        (
            ["--k1", "1.2"],
            "index build --retriever tfidf: unknown option --k1; its options: "
            "--lowercase, --min-df, --sublinear-tf",
        ),
    ],
)
def test_bad_options_are_one_line(args, expected, tmp_path, capsys):
    line = one_line_error(
        [
            "index",
            "build",
            "--corpus",
            "synthetic",
            "--retriever",
            "tfidf",
            "--out",
            str(tmp_path / "x"),
            *args,
        ],
        capsys,
    )
    assert line.startswith(f"lit-rag: error: {expected}")
    assert not (tmp_path / "x").exists()
