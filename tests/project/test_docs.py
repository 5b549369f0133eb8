"""The documentation a user reads: a short README, pages without our working notes, a site whose
navigation holds every page, and release notes with a dated section for the version we ship.

``mkdocs build --strict`` (in ``.ci/run``) checks links and anchors; these tests check what a
build cannot: length, working notes left in user pages, and the release section.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: pages written for users: README, the recipe index and every page of the site
USER_PAGES = [
    ROOT / "README.md",
    ROOT / "recipes" / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if p.name != "STYLE.md"),
]
#: notes about how the code was made, which belong in issues and commits, not in user pages
WORKING_NOTES = {
    "an issue number": re.compile(r"\bissue[- #]?\d+", re.IGNORECASE),
    "a date of our work": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a session": re.compile(r"\bsession\b", re.IGNORECASE),
    "the papers' copies outside the repository": re.compile(r"shared/seeds|\.\./shared"),
}
#: dates that are not ours: model and API versions a user passes on the command line; and when a
#: figure was measured, which the performance page gives each table with its commit
NOT_OURS = re.compile(
    r"gpt-4o-\d{4}-\d\d-\d\d|[Mm]easured\*?:? \d{4}-\d\d-\d\d, commit `[0-9a-f]+`"
)


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the site holds the details"


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.DOTALL)
    assert blocks[0].endswith("lit-rag fit --config recipes/quickstart.yaml"), blocks[0]
    assert blocks[1].endswith("bash scripts/install.sh dev && python -m pytest -q"), blocks[1]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_hold_no_working_notes(page):
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        line = NOT_OURS.sub("", line)
        found += [
            f"line {number}: {what}"
            for what, pattern in WORKING_NOTES.items()
            if pattern.search(line)
        ]
    assert not found, f"{page.relative_to(ROOT)}: " + "; ".join(found)


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def test_the_site_navigation_holds_every_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_pages(config["nav"]))
    pages = {
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if p.name != "STYLE.md" and "hooks" not in p.parts
    }
    assert not pages - nav, f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert not nav - pages, f"nav entries without a page: {sorted(nav - pages)}"


def test_the_changelog_has_a_dated_section_for_this_version():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d\d-\d\d))?$", text, re.MULTILINE)
    assert headings[0] == ("Unreleased", ""), headings[:2]
    assert (version, headings[1][1]) == headings[1] and headings[1][1], headings[:2]


def test_changelog_entries_are_short():
    entries = [
        line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line[:2] == "- "
    ]
    long = [line[:80] for line in entries if len(line) > 300]
    assert not long, f"entries over 300 characters (one or two lines each): {long}"
