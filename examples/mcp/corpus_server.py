"""An MCP server over lit-rag's bundled synthetic corpus: ``search`` and ``fetch``.

A real Model Context Protocol server (https://modelcontextprotocol.io/specification), built
with the official Python SDK's ``MCPServer`` (``mcp>=2``; ``FastMCP`` in mcp 1.x), to try an
agent's MCP tools without a search service:

- ``search(query, k=3)``: BM25 (k1 = 1.5, b = 0.75, bm25s' defaults) over the passages of
  :class:`lit_rag.data.synthetic.SyntheticWorld`, one ``Doc i(Title: t, id: x) text`` line per
  passage, as lit-rag's search agent shows documents, with the id ``fetch`` takes.
- ``fetch(id)``: one passage by id (``w0``, ``w1``, ...); an unknown id is an error result.

Run it over stdio (what a recipe's ``command:`` starts) or streamable HTTP::

    python examples/mcp/corpus_server.py [--seed 0]
    python examples/mcp/corpus_server.py --http 8765   # http://127.0.0.1:8765/mcp

``--exit-after N`` makes the process exit at its (N+1)-th call, before answering it: a server
that dies mid-episode, for trying (and testing) what a run does then.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections import Counter
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from lit_rag.data.synthetic import SyntheticWorld
from lit_rag.types import Passage

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class BM25:
    """Okapi BM25 over a few thousand passages, in plain Python (built in milliseconds)."""

    def __init__(self, passages: list[Passage], k1: float = 1.5, b: float = 0.75) -> None:
        self.passages, self.k1, self.b = passages, k1, b
        self.counts = [Counter(words(f"{p.title} {p.text}")) for p in passages]
        self.lengths = [sum(c.values()) for c in self.counts]
        self.mean_length = sum(self.lengths) / max(len(passages), 1)
        df = Counter(term for counts in self.counts for term in counts)
        n = len(passages)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def top(self, query: str, k: int) -> list[Passage]:
        terms = [t for t in set(words(query)) if t in self.idf]
        scored = []
        for index, (counts, length) in enumerate(zip(self.counts, self.lengths, strict=True)):
            norm = self.k1 * (1 - self.b + self.b * length / self.mean_length)
            score = sum(
                self.idf[t] * counts[t] * (self.k1 + 1) / (counts[t] + norm)
                for t in terms
                if t in counts
            )
            if score > 0:
                scored.append((-score, index))  # ties in corpus order
        return [self.passages[i] for _, i in sorted(scored)[:k]]


def build_server(seed: int = 0, exit_after: int | None = None) -> MCPServer:
    passages = SyntheticWorld(seed=seed).corpus()
    calls = [0]

    def count() -> None:
        calls[0] += 1
        if exit_after is not None and calls[0] > exit_after:
            os._exit(3)  # a crash: no reply, no clean shutdown

    by_id = {p.id: p for p in passages}
    index = BM25(passages)
    server = MCPServer(
        "lit-rag-corpus", instructions="Search lit-rag's synthetic corpus.", log_level="WARNING"
    )

    @server.tool()
    def search(
        query: Annotated[str, Field(description="What to look for.")],
        k: Annotated[int, Field(description="How many passages (1-20).")] = 3,
    ) -> str:
        """Search the corpus with BM25: one line per passage, best first."""
        count()
        hits = index.top(query, max(1, min(k, 20)))
        return "\n".join(
            f"Doc {i}(Title: {p.title}, id: {p.id}) {p.text}" for i, p in enumerate(hits, 1)
        )

    @server.tool()
    def fetch(id: Annotated[str, Field(description="The passage id, e.g. w12.")]) -> str:
        """One passage by the id search shows."""
        count()
        passage = by_id.get(id)
        if passage is None:
            raise ToolError(f"unknown passage id {id!r}; ids are w0 to w{len(passages) - 1}")
        return f"(Title: {passage.title}) {passage.text}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the synthetic world's seed")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--host", default="127.0.0.1", help="with --http: the address")
    parser.add_argument("--exit-after", type=int, metavar="N", help="exit at call N + 1")
    args = parser.parse_args()
    server = build_server(args.seed, args.exit_after)
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host=args.host, port=args.http)


if __name__ == "__main__":
    main()
