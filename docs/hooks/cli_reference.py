"""MkDocs hook: the CLI reference page shows what ``lit-rag ... --help`` prints at build time.

``docs/cli.md`` holds a marker ``<!-- lit-rag-help: ARGS -->`` per command; each is replaced by
the help text the installed command prints, so the help strings in the code are the one place
an option is described.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

MARKER = re.compile(r"^( *)<!-- lit-rag-help:([a-z -]*?) ?-->", re.MULTILINE)


def _help(args: str) -> str:
    env = dict(os.environ, COLUMNS="100", LIT_RAG_VERBOSE="0")
    done = subprocess.run(
        [sys.executable, "-m", "lit_rag", *args.split(), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"lit-rag {args} --help exited {done.returncode}: {done.stderr[-2000:]}")
    return "```text\n" + done.stdout.rstrip() + "\n```"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001
    if page.file.src_uri != "cli.md":
        return markdown

    def replace(match: re.Match) -> str:
        indent = match.group(1)
        text = _help(match.group(2).strip())
        return "\n".join(indent + line if line else line for line in text.splitlines())

    return MARKER.sub(replace, markdown)
