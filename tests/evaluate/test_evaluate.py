"""``lit-rag evaluate``: scores on a suite, the table, the protocol records, the judge.

The engine is scripted (``helpers.AnswerBook`` answers each question from a book), so every
metric below is computed by hand from the book.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from lit_rag.cli import commands as cli
from lit_rag.evaluate.protocol import protocol_differences
from lit_rag.evaluate.records import read_record
from lit_rag.evaluate.suites import SUITES
from lit_rag.evaluate.table import render

ROOT = Path(__file__).resolve().parents[2]

NQ = [
    {"id": "n1", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare"]},
    {"id": "n2", "question": "capital of france", "golden_answers": ["Paris"]},
    {"id": "n3", "question": "largest planet", "golden_answers": ["Jupiter"]},
]
BAMBOOGLE = [
    {"id": "b1", "question": "first man on the moon", "golden_answers": ["Neil Armstrong"]},
    {"id": "b2", "question": "inventor of the telephone", "golden_answers": ["Bell"]},
]
BOOK = {
    "who wrote hamlet": "Shakespeare",  # EM 0, F1 2/3 (1 of 1 predicted, 1 of 2 gold)
    "capital of france": "the Paris",  # EM 1 (articles dropped)
    "largest planet": "Saturn",  # EM 0, F1 0
    "first man on the moon": "Neil Armstrong",  # EM 1
    "inventor of the telephone": "Alexander Graham Bell",  # EM 0, F1 2 * 1/3 * 1 / (4/3)
}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "search_r1"
    folder.mkdir()
    _write_jsonl(folder / "test_nq.jsonl", NQ)
    _write_jsonl(folder / "test_bamboogle.jsonl", BAMBOOGLE)
    return folder


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    config = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    config["model"]["engine"] = {"class_path": "helpers.AnswerBook", "init_args": {"book": BOOK}}
    config["model"]["sampling"]["max_new_tokens"] = 32
    config["trainer"]["logger"] = False
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _evaluate(capsys, *args: str) -> str:
    cli.main(["evaluate", *args])
    return capsys.readouterr().out


def _suite(capsys, suite: str, recipe: Path, data: Path, out: Path, *extra: str) -> str:
    """``lit-rag evaluate --suite SUITE`` on the scripted recipe; returns the table."""
    args = ["--suite", suite, "--config", str(recipe), "--data", str(data), "--out", str(out)]
    return _evaluate(capsys, *args, *extra)


def test_scores_each_dataset_by_hand_and_prints_the_papers_rows(
    capsys, suite_dir, recipe, tmp_path
):
    out_dir = tmp_path / "out"
    table = _suite(capsys, "search-r1", recipe, suite_dir, out_dir)
    record = read_record(out_dir / "untrained" / "record.json")
    assert record["metrics"]["nq"]["EM"] == pytest.approx(1 / 3)
    assert record["metrics"]["bamboogle"]["EM"] == pytest.approx(1 / 2)
    assert record["questions"] == {"nq": 3, "bamboogle": 2}
    rows = [
        json.loads(line)
        for line in (out_dir / "untrained" / "predictions_nq.jsonl").read_text().splitlines()
    ]
    assert [r["prediction"] for r in rows] == ["Shakespeare", "the Paris", "Saturn"]
    assert [r["em"] for r in rows] == [0.0, 1.0, 0.0]
    assert rows[0]["f1"] == pytest.approx(2 / 3)
    # our row, then the published rows, each naming its model and the table they come from
    line = next(x for x in table.splitlines() if x.startswith("untrained"))
    assert line.split()[3:] == [  # "untrained (tiny random)", then the cells
        "0.333",
        "absent",
        "absent",
        "absent",
        "absent",
        "absent",
        "0.500",
        "0.417",
        "(2/7)",
    ]
    assert "published: Eval-RAR Table 1" in table
    assert re.search(r"^Search-R1-Base \(Qwen2.5-3B\) +0.421 ", table, re.MULTILINE)
    # absent datasets are named with the command that writes them, never skipped silently
    assert "absent: 2Wiki, HotpotQA, MuSiQue, PopQA, TriviaQA" in table
    assert "lit-rag data search_r1" in table
    # the protocol: hashes of data, recipe and prompts; decoding; engine; version
    protocol = record["protocol"]
    nq = protocol["datasets"]["nq"]
    assert len(nq["sha256"]) == 64 and nq["limit"] is None
    assert protocol["decoding"]["temperature"] == 0.0
    assert protocol["engine"]["class"] == "helpers.AnswerBook"
    assert protocol["lit_rag"] and protocol["recipe"]["sha256"]
    assert all(len(p["sha256"]) == 64 for p in protocol["prompts"].values())


def test_limit_cuts_each_dataset_and_the_table_says_so(capsys, suite_dir, recipe, tmp_path):
    table = _suite(capsys, "search-r1", recipe, suite_dir, tmp_path / "out", "--limit", "2")
    record = read_record(tmp_path / "out" / "untrained" / "record.json")
    assert record["questions"] == {"nq": 2, "bamboogle": 2}
    assert record["metrics"]["nq"]["EM"] == pytest.approx(1 / 2)
    assert "cut: the first 2 questions of each dataset" in table


def test_records_with_different_protocols_say_what_differs(capsys, suite_dir, recipe, tmp_path):
    _suite(capsys, "search-r1", recipe, suite_dir, tmp_path / "out")
    first = tmp_path / "out" / "untrained" / "record.json"
    record = json.loads(first.read_text())
    record["model"]["label"] = "other"
    record["protocol"]["decoding"]["max_new_tokens"] = 500
    second = tmp_path / "other.json"
    second.write_text(json.dumps(record))
    table = _evaluate(capsys, "--records", str(first), str(second))
    assert "protocol differs in decoding.max_new_tokens: 32 vs 500" in table
    # the same protocol: no difference line
    assert protocol_differences([read_record(first), read_record(first)]) == []


class _Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that says yes when the response names the answer."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        gold, response = prompt.split("correct answer list is:*************\n")[1].split(
            "\n*************Here is the model's response:*************\n"
        )
        response = response.split("\n*************")[0]
        verdict = "yes" if json.loads(gold)[0].split()[-1] in response else "no"
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": verdict},
                    "finish_reason": "stop",
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_arena_lj_asks_the_named_judge(capsys, recipe, tmp_path):
    folder = tmp_path / "arena"
    folder.mkdir()
    _write_jsonl(folder / "test_hotpotqa.jsonl", NQ)  # FlashRAG layout: questions and answers
    server = HTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        table = _evaluate(
            capsys,
            "--suite",
            "arena",
            "--config",
            str(recipe),
            "--data",
            str(folder),
            "--out",
            str(tmp_path / "out"),
            "--judge",
            f"http://127.0.0.1:{server.server_port}/v1",
            "--judge-model",
            "judge",
        )
    finally:
        server.shutdown()
    record = read_record(tmp_path / "out" / "untrained" / "record.json")
    # the judge says yes to "Shakespeare" and "the Paris", no to "Saturn"
    assert record["metrics"]["hotpotqa"]["LJ"] == pytest.approx(2 / 3)
    assert record["protocol"]["judge"]["model"] == "judge"
    line = next(x for x in table.splitlines() if x.startswith("untrained"))
    assert line.split()[3:6] == ["0.333", "0.556", "0.667"]
    assert "ARENA-Qwen-7B" in table


def test_without_a_judge_lj_is_a_dash_and_the_table_says_why():
    record = {
        "suite": "arena",
        "model": {"label": "untrained", "base": {"path": "m.gguf"}},
        "metrics": {"hotpotqa": {"EM": 0.5, "F1": 0.6}},
        "questions": {"hotpotqa": 2},
        "absent": {"2wiki": "d/test_2wiki.jsonl", "musique": "d/test_musique.jsonl"},
    }
    table = render(SUITES["arena"], [record])
    line = next(x for x in table.splitlines() if x.startswith("untrained"))
    assert line.split()[2:5] == ["0.500", "0.600", "–"]
    assert "– under LJ: no judge" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "nope"], "unknown suite 'nope'; suites: search-r1, eval-rar, arena"),
        ([], "name a suite with --suite"),
        (["--suite", "search-r1", "--data", "/nonexistent"], "no test file of suite search-r1"),
        (["--suite", "arena", "--judge", "http://x/v1"], "--judge and --judge-model go together"),
        (["--suite", "search-r1", "--limit", "0"], "--limit must be >= 1"),
        (["--suite", "search-r1", "nothing.ckpt"], "model 'nothing.ckpt' does not exist"),
        (["--records", "/nonexistent.json"], "record '/nonexistent.json' does not exist"),
    ],
)
def test_bad_input_is_one_line(capsys, args, message, suite_dir):
    if "nothing.ckpt" in args:
        args = [*args, "--data", str(suite_dir)]
    with pytest.raises(SystemExit) as stop:
        cli.main(["evaluate", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lit-rag: error: evaluate: ") and message in err
    assert len(err.strip().splitlines()) == 1


def _record(**changes) -> dict:
    """A saved search-r1 record as ``lit-rag evaluate`` writes it (the fields the table reads),
    with ``changes`` applied: ``{"model": ...}`` replaces a field, None removes it."""
    record = {
        "suite": "search-r1",
        "model": {"label": "untrained", "base": {"path": "m.gguf"}, "parameters": 135},
        "metrics": {"nq": {"EM": 0.5}, "bamboogle": {"EM": 0.25}},
        "questions": {"nq": 2, "bamboogle": 4},
        "absent": {},
        "protocol": {"recipe": {"path": "r.yaml"}, "datasets": {"nq": {"limit": None}}},
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"metrics": {"nq": {"EM": "0.5"}}},
            "': field 'metrics.nq.EM' is \"0.5\" (a string); a metric is a number\n",
        ),
        (
            {"model": {"base": {"path": "m.gguf"}}},
            "' lacks field 'model.label' (a model's label is its name: untrained, a .ckpt file "
            "or a model folder)\n",
        ),
        ({"metrics": {"nq": [0.5]}}, "field 'metrics.nq' is [0.5] (a list)"),
        ({"model": {"label": 7}}, "field 'model.label' is 7 (a number)"),
        ({"questions": {"nq": "two"}}, "field 'questions.nq' is \"two\" (a string)"),
        ({"protocol": {"recipe": "r.yaml"}}, "field 'protocol.recipe' is \"r.yaml\" (a string)"),
    ],
    ids=["text_metric", "no_label", "metrics_list", "label_number", "questions", "protocol"],
)
def test_a_malformed_record_is_one_line_naming_file_and_field(
    capsys, tmp_path, changes, message
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_record()))
    bad.write_text(json.dumps(_record(**changes)))
    assert "untrained (m.gguf)" in _evaluate(capsys, "--records", str(good))
    with pytest.raises(SystemExit) as stop:
        cli.main(["evaluate", "--records", str(good), str(bad)])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert err.startswith(f"lit-rag: error: evaluate: record '{bad}'") and message in err, err
    assert len(err.splitlines()) == 1, err


def test_a_tool_agent_runs_the_search_r1_suite(capsys, suite_dir, tmp_path):
    """``--suite search-r1`` with the tool agent: the same answers (written in a message's
    <answer> tag, no tool call) score the same as the tag protocol's."""
    config = yaml.safe_load((ROOT / "recipes" / "tiny_tool_agent.yaml").read_text())
    config["model"]["engine"] = {"class_path": "helpers.AnswerBook", "init_args": {"book": BOOK}}
    config["model"]["environment"]["init_args"].update(answer_tag="answer", assistant_prefix="")
    config["model"]["sampling"]["max_new_tokens"] = 32
    config["trainer"]["logger"] = False
    recipe = tmp_path / "tools.yaml"
    recipe.write_text(yaml.safe_dump(config))
    out_dir = tmp_path / "out"
    _suite(capsys, "search-r1", recipe, suite_dir, out_dir)
    record = read_record(out_dir / "untrained" / "record.json")
    assert record["metrics"]["nq"]["EM"] == pytest.approx(1 / 3)
    assert record["metrics"]["bamboogle"]["EM"] == pytest.approx(1 / 2)
    assert record["protocol"]["environment"].endswith("ToolAgentEnvironment")
