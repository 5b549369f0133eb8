"""Figures and claims a user reads carry where they came from.

Every table of figures on the performance page has a *Measured* line above it with the date,
the commit that recorded it and a named machine; the pages that offer a paper's run say what
has run where (README, the reproduction guide, each method's reproduction section).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = ROOT / "docs" / "performance.md"
MACHINES = (
    "AMD EPYC Zen 4",
    "Intel Xeon AMX",
    "H100",
    "AMD EPYC, 2 cores",
    "CPU model was not recorded",
)
MEASURED = re.compile(r"^\*Measured\*: (\d{4}-\d{2}-\d{2}), commit `([0-9a-f]{7,40})`, (.+)$")
WHAT_RAN = "reproduce.md#what-has-run-and-on-what"


def tables(lines: list[str]) -> list[int]:
    """The line index where each markdown table starts."""
    return [
        i
        for i, line in enumerate(lines)
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
    ]


def measured_line(lines: list[str], start: int) -> re.Match | None:
    """The *Measured* line between the previous table or heading and the table at ``start``."""
    for line in reversed(lines[:start]):
        if line.startswith("|") or line.startswith("#"):
            return None
        found = MEASURED.match(line)
        if found:
            return found
    return None


def known_commit(commit: str) -> bool:
    shallow = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        return True  # a source archive or a shallow clone cannot tell
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    return found.returncode == 0


def test_every_table_of_figures_says_when_on_what_code_and_machine():
    lines = PERFORMANCE.read_text(encoding="utf-8").splitlines()
    starts = tables(lines)
    assert lines[starts[0]].startswith("| benchmark | what it measures |")
    missing, unknown = [], []
    for start in starts[1:]:
        found = measured_line(lines, start)
        if found is None or not any(m in found.group(3) for m in MACHINES):
            missing.append(lines[start][:60])
        elif not known_commit(found.group(2)):
            unknown.append(found.group(2))
    assert not missing, f"tables without a *Measured* line naming a machine: {missing}"
    assert not unknown, f"*Measured* lines name commits this repository lacks: {unknown}"


def test_the_machines_are_described_once():
    text = PERFORMANCE.read_text(encoding="utf-8")
    for name in MACHINES[:3]:
        assert f"- **{name}**:" in text


@pytest.mark.parametrize(
    "page",
    [
        "README.md",
        "docs/methods/arena.md",
        "docs/methods/eval_rar.md",
        "docs/methods/r2ag.md",
        "docs/methods/evo_rag.md",
    ],
)
def test_pages_offering_a_paper_run_say_what_has_run(page):
    assert WHAT_RAN in (ROOT / page).read_text(encoding="utf-8")


def test_the_reproduction_guide_says_what_has_run():
    text = (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8")
    section = text.split("## What has run, and on what", 1)[1]
    assert "| part of a paper run | has run | not yet run |" in section
    for part in ("vLLM", "NCCL", "several training processes"):
        assert part in section


def test_user_pages_do_not_describe_how_the_code_was_made():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    words = re.compile(r"\blent\b|\bsession\b|the machine the code|issue \d+|issue-\d+", re.I)
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in pages
        if p.name not in ("STYLE.md", "agents-with-tools.md")  # MCP "sessions" are the protocol's
        for m in words.finditer(p.read_text(encoding="utf-8"))
    ]
    assert not found, found
