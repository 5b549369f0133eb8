"""The metrics glossary (``docs/metrics.md``) as the tests read it: the names in the first
column of its metric tables, and which columns of a run's ``metrics.csv`` it does not name.

A table whose header starts with ``| metric |`` lists one or more names per row, each in
backticks; a name with ``<placeholder>`` parts is a pattern, each placeholder one segment of a
name (no ``/``): ``reward/<component>`` matches ``reward/format``, not ``reward/a/b``. As the
page says, validation logs the rollout's metrics under ``val/``: ``val/turns`` is documented by
``rollout/turns``, ``val/reward/format`` by ``reward/format``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

_NAME = re.compile(r"`([^`]+)`")
_PLACEHOLDER = re.compile(r"<[a-z_]+>")


def documented(page: Path = PAGE) -> list[str]:
    """Every name and pattern in the first column of the page's metric tables, in page order."""
    names: list[str] = []
    in_table = False
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line else []
        if not line.startswith("|"):
            in_table = False
        elif cells[0] == "metric":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            names += _NAME.findall(cells[0])
    return names


def is_pattern(name: str) -> bool:
    return bool(_PLACEHOLDER.search(name))


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """``reward/<component>`` -> a regex matching ``reward/`` and one name segment."""
    parts = _PLACEHOLDER.split(pattern)
    return re.compile(r"[A-Za-z0-9_.]+".join(re.escape(p) for p in parts))


def as_training(column: str) -> str:
    """The training name of a validation column (``val/turns`` -> ``rollout/turns``,
    ``val/reward/format`` -> ``reward/format``); any other column as it is."""
    if not column.startswith("val/"):
        return column
    rest = column.removeprefix("val/")
    return rest if rest.startswith("reward/") else f"rollout/{rest}"


def undocumented(columns: Iterable[str], page: Path = PAGE) -> list[str]:
    """The ``columns`` that the page neither names nor matches with one of its patterns, as
    they are or as their training name."""
    names = documented(page)
    concrete = {n for n in names if not is_pattern(n)}
    patterns = [pattern_regex(n) for n in names if is_pattern(n)]

    def known(name: str) -> bool:
        return name in concrete or any(p.fullmatch(name) for p in patterns)

    return [c for c in columns if not known(c) and not known(as_training(c))]
