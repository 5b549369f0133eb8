"""MkDocs hook: pages kept beside what they describe, shown in the site.

``recipes/README.md`` (the recipe index, read on GitHub next to the recipes) is the body of
``docs/recipes.md``: its links to recipe files, which lie outside the site, become code spans.
"""

from __future__ import annotations

import re
from pathlib import Path

INCLUDES = {"recipes.md": Path("recipes/README.md")}
#: a markdown link whose target is not a page of the site (a .yaml file, a folder, ...)
REPO_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)]+)\)")


def _code_span(match: re.Match) -> str:
    text, target = match.group(1), match.group(2)
    if target.endswith(".md") or ".md#" in target:
        if "docs/" in target:  # recipes/README.md links ../docs/PAGE.md: the site's PAGE.md
            return f"[{text}]({target.split('docs/', 1)[1]})"
        return match.group(0)
    return text if text.startswith("`") else f"`{text}`"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001
    source = INCLUDES.get(page.file.src_uri)
    if source is None:
        return markdown
    root = Path(config["config_file_path"]).parent
    text = (root / source).read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n", "", text)  # the page has its own title
    body = REPO_LINK.sub(_code_span, text)
    return markdown.replace("<!-- include recipes/README.md -->", body)
