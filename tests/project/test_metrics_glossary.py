"""The metrics glossary (docs/metrics.md) against what runs log and what the code can log.

Two ways the page could rot, each held here: a run logs a column the page does not name (the
tiny recipes' fits below; the real quickstart's in ``tests/recipes/test_quickstart.py``), or
the page names a metric no code produces any more (a grep-level reading of ``lit_rag/``).
"""

from __future__ import annotations

import ast
import csv
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from glossary import PAGE, documented, is_pattern, undocumented
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lit_rag"
#: columns Lightning's CSVLogger writes itself
FROM_LIGHTNING = {"step", "epoch"}
#: validation once, after the second of the recipes' 2 steps
WITH_VALIDATION = ["--trainer.val_check_interval=2"]


def header(recipe: str, root: Path) -> list[str]:
    """The columns of the metrics.csv a ``lit-rag fit`` of ``recipe`` writes."""
    main(
        [
            "fit", "--config", str(ROOT / "recipes" / recipe), *WITH_VALIDATION,
            "--trainer.default_root_dir", str(root),
            "--trainer.logger.init_args.save_dir", str(root),
        ]
    )  # fmt: skip
    (path,) = root.rglob("metrics.csv")
    with path.open(newline="") as f:
        return next(csv.reader(f))


@pytest.mark.parametrize("recipe", ["tiny.yaml", "tiny_search_agent.yaml", "tiny_tool_agent.yaml"])
def test_every_column_of_a_tiny_run_is_in_the_glossary(recipe: str, tmp_path: Path) -> None:
    if recipe == "tiny_search_agent.yaml":  # its index, in the test's own folder
        main(["index", "build", "--corpus", "synthetic", "--retriever", "bm25",
              "--out", "indexes/synthetic-bm25"])  # fmt: skip
    columns = header(recipe, tmp_path / "run")
    assert "reward/total" in columns and "val/em" in columns  # trained and validated
    assert undocumented(columns) == []
    # a reward component is named on the page, not only matched by reward/<component>
    names = set(documented())
    assert [c for c in columns if c.startswith("reward/") and c not in names] == []


# ---- every name the page gives is one the code can log ---------------------------------------
def _strings(root: Path) -> tuple[set[str], list[list[str | None]]]:
    """The string literals of the package's code (docstrings left out) and its f-strings, each
    as its pieces: text, or ``None`` for a ``{...}`` hole."""
    literals: set[str] = set()
    templates: list[list[str | None]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                templates.append(
                    [v.value if isinstance(v, ast.Constant) else None for v in node.values]
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) not in docstrings:
                    literals.add(node.value)
    return literals, templates


def _fills(pieces: list[str | None], text: str) -> Iterator[list[str]]:
    """Every way ``text`` fills the holes of an f-string's ``pieces`` (the holes' values)."""
    if not pieces:
        if not text:
            yield []
        return
    head, rest = pieces[0], pieces[1:]
    if head is not None:
        if text.startswith(head):
            yield from _fills(rest, text[len(head) :])
        return
    for cut in range(1, len(text) + 1):
        for tail in _fills(rest, text[cut:]):
            yield [text[:cut], *tail]


class Code:
    """What ``lit_rag/`` can log, read from its source: a name is a literal, or an f-string
    (``f"{head}/{name}"``, ``f"time/{phase}_s"``) whose holes are names of their own."""

    def __init__(self, root: Path = PACKAGE) -> None:
        literals, templates = _strings(root)
        # "train/loss" logged as "reward_model/train_loss" (key.replace("/", "_"))
        self.literals = literals | {s.replace("/", "_") for s in literals}
        self.templates = [t for t in templates if any(t) and None in t]
        self.pieces = literals | {p for t in templates for p in t if p}

    def logs(self, name: str, depth: int = 3) -> bool:
        if name in self.literals:
            return True
        if depth == 0:
            return False
        return any(
            all(self.logs(value, depth - 1) for value in fill)
            for pieces in self.templates
            for fill in _fills(pieces, name)
        )

    def logs_pattern(self, pattern: str) -> bool:
        """Each fixed part of ``reward/<component>`` occurs in the code's strings."""
        parts = [p for p in re.split(r"<[a-z_]+>", pattern) if p]
        return all(any(p in s for s in self.pieces) for p in parts)


@pytest.fixture(scope="module")
def code() -> Code:
    return Code()


def test_every_name_in_the_glossary_is_logged_by_the_code(code: Code) -> None:
    names = [n for n in documented() if n not in FROM_LIGHTNING]
    assert len(names) > 100  # the page was read
    assert [n for n in names if not is_pattern(n) and not code.logs(n)] == []
    assert [n for n in names if is_pattern(n) and not code.logs_pattern(n)] == []


def test_the_code_check_tells_a_logged_name_from_an_invented_one(code: Code) -> None:
    for logged in ("reward/total", "val/reward/format", "time/rollout_s", "rollout/judge/failures",
                   "rollout/tool_errors/malformed", "reward_model/val_pair_accuracy"):  # fmt: skip
        assert code.logs(logged), logged
    for invented in ("rollout/made_up_rate", "time/nothing_here_s", "kl/global_median"):
        assert not code.logs(invented), invented


def test_the_recipe_section_names_only_glossary_metrics() -> None:
    """Every name in "The columns of each recipe" is one the metric tables list, or a family
    of them (``kl/*``, ``rollout/pairs*``)."""
    section = PAGE.read_text().split("## The columns of each recipe")[1]
    names = documented()
    wrong = []
    for name in set(re.findall(r"`([^`]*/[^`]*)`", section)):
        family = re.compile(re.escape(name).replace(r"\*", ".+"))
        if name not in names and not any(family.fullmatch(n) for n in names):
            wrong.append(name)
    assert wrong == []
