"""Every repository path the documentation names exists: in the comments of each recipe, in
README.md, recipes/README.md and docs/**/*.md, and in the relative markdown links of the two
READMEs. A renamed or deleted file then fails here, naming the document and line that cite it.

Only paths that start with one of the top-level folders in ``PREFIXES`` are checked (``data/``
and ``indexes/`` hold what ``lit-rag data`` and ``lit-rag index build`` write, ``runs/`` what a
run writes). A path with a placeholder (``runs/<name>/...``, ``recipes/*.yaml``,
``docs/{a,b}.md``) is a pattern, not a file, and is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREFIXES = ("lit_rag", "recipes", "benchmarks", "scripts", "docs", "tests", "plugins")
#: a path starts after a space, quote, bracket or backtick, never inside a longer path or a URL
#: (``github.com/org/repo/scripts/x.sh``, ``my-scripts/x``); ``:12`` and ``#anchor`` end it
PATH = re.compile(r"(?<![\w/.\-])(?:\./)?((?:" + "|".join(PREFIXES) + r")/[\w./<>*{}$+=@~\-]*)")
PLACEHOLDERS = ("<", "*", "{", "$", "...")
#: a markdown link or image, ``[text](target)`` or ``![alt](target "title")``: the target is a
#: path from the document's folder, so the repository-path scan leaves it to ``broken_links``
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TARGET = re.compile(r"\]\([^)]*\)")
#: files of other projects' repositories that the docs cite, with the project beside them
OTHER_PROJECTS = {
    "scripts/nq_hotpotqa/v0.2/train_grpo.sh": "Search-R1",
    "scripts/run_grpo.sh": "ARENA's release",
    "tests/test_config_hub.py": "litgpt",
    "tests/test_lora.py": "litgpt",
    "tests/test_engine.py": "nanochat",
    "scripts/chat_rl.py": "nanochat",
    "tests/torchtune/rlhf/loss/test_dpo_loss.py": "torchtune",
}

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
READMES = [REPO / "README.md", REPO / "recipes" / "README.md"]
MARKDOWN = READMES + sorted((REPO / "docs").rglob("*.md"))


def named_paths(text: str) -> list[tuple[int, str]]:
    """``(line number, path)`` for each repository path written in ``text``.

    >>> named_paths("see lit_rag/trainer/kl.py:42, and recipes/<name>.yaml.")
    [(1, 'lit_rag/trainer/kl.py')]
    """
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in PATH.finditer(TARGET.sub("]()", line)):
            if any(mark in match.group(1) for mark in PLACEHOLDERS):
                continue
            path = match.group(1).rstrip(".,;:!?'\"")
            if path not in OTHER_PROJECTS:
                found.append((number, path))
    return found


def comment_lines(text: str) -> str:
    """A YAML file's comments, whole-line and trailing (`` # `` after a value), each on its own
    line number; the values are left out."""
    comments = (re.search(r"(?:^|\s)(#.*)", line) for line in text.splitlines())
    return "\n".join(match.group(1) if match else "" for match in comments)


def missing_paths(document: Path, text: str, root: Path = REPO) -> list[str]:
    """``"path (document:line)"`` for each path ``text`` names that is not under ``root``."""
    where = document.relative_to(root)
    return [f"{path} ({where}:{n})" for n, path in named_paths(text) if not (root / path).exists()]


def broken_links(document: Path, root: Path = REPO) -> list[str]:
    """``"target (document:line)"`` for each relative link that resolves to nothing."""
    broken = []
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1):
        for match in LINK.finditer(line):
            target = match.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.\-]*:", target):  # https:, mailto:
                continue
            if not (document.parent / target).exists():
                broken.append(f"{target} ({document.relative_to(root)}:{number})")
    return broken


def test_the_documents_exist() -> None:
    assert RECIPES and all(readme.is_file() for readme in READMES)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_recipe_comments_name_existing_paths(recipe: Path) -> None:
    gone = missing_paths(recipe, comment_lines(recipe.read_text(encoding="utf-8")))
    assert not gone, "paths that do not exist:\n  " + "\n  ".join(gone)


@pytest.mark.parametrize("document", MARKDOWN, ids=[str(d.relative_to(REPO)) for d in MARKDOWN])
def test_markdown_names_existing_paths(document: Path) -> None:
    gone = missing_paths(document, document.read_text(encoding="utf-8"))
    assert not gone, "paths that do not exist:\n  " + "\n  ".join(gone)


@pytest.mark.parametrize("document", READMES, ids=[str(d.relative_to(REPO)) for d in READMES])
def test_relative_links_resolve(document: Path) -> None:
    """A link is relative to the document's folder, as GitHub renders it."""
    gone = broken_links(document)
    assert not gone, "links that do not resolve:\n  " + "\n  ".join(gone)


def test_the_path_reader_skips_patterns_urls_and_link_targets() -> None:
    text = (
        "lit_rag/trainer/kl.py:42, `recipes/tiny.yaml`. [`docs/DESIGN.md`](../DESIGN.md#scale)\n"
        "runs/<name>/x recipes/*.yaml docs/{a,b}.md lit_rag/... github.com/o/r/scripts/x.sh\n"
        "(Search-R1's scripts/nq_hotpotqa/v0.2/train_grpo.sh) my-tests/x ./scripts/install.sh"
    )
    assert named_paths(text) == [
        (1, "lit_rag/trainer/kl.py"),
        (1, "recipes/tiny.yaml"),
        (1, "docs/DESIGN.md"),
        (3, "scripts/install.sh"),
    ]
    assert comment_lines("a: 1  # see b\nc: 'x#y'\n# d") == "# see b\n\n# d"


def test_a_missing_path_and_a_broken_link_name_their_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text("docs/real.md and docs/gone.md\n[a](real.md) [b](gone.md#x) [c](https://x.org)")
    assert missing_paths(page, page.read_text(), root=tmp_path) == ["docs/gone.md (docs/page.md:1)"]
    assert broken_links(page, root=tmp_path) == ["gone.md (docs/page.md:2)"]
