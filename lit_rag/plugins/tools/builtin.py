"""The tool agent's built-in tools: ``search`` over any lit-rag retriever, ``fetch`` a passage by
id, and the final ``answer`` (docs/agents-with-tools.md).

``search`` and ``fetch`` take the environment's retriever (the same indexes, the same HTTP
retriever as every other environment), so a recipe that trains a tag-protocol search agent
trains a tool agent over the same corpus by changing its environment. Results are written as
Search-R1 writes its documents (``Doc i(Title: t) text``), so the two protocols read the same
text; ``answer`` ends the episode and its argument is the episode's answer. ``search`` is a
batched tool: the searches of every episode that reached a tool turn together are one
retriever call, as the tag-protocol search agent's are.
"""

from __future__ import annotations

from lit_rag.api import Hit, Passage, Retriever, Tool, ToolError

DOCUMENT_TEMPLATE = "Doc {index}(Title: {title}) {text}"


def documents(hits: list[Hit], template: str = DOCUMENT_TEMPLATE) -> str:
    """Hits as the tool message's text, one document per line."""
    return "\n".join(
        template.format(index=i + 1, title=h.passage.title, text=h.passage.text, id=h.passage.id)
        for i, h in enumerate(hits)
    )


class SearchTool(Tool):
    """``search(query)``: the top ``top_k`` passages of the retriever for ``query``.

    Args:
        retriever: The retriever (the environment gives its own).
        top_k: Passages per search.
        document_template: One passage, with ``{index}`` (from 1), ``{title}``, ``{text}`` and
            ``{id}`` (the id ``fetch`` takes).
        **settings: :class:`~lit_rag.api.Tool`'s ``timeout_s``, ``max_concurrency``,
            ``cache_size``.
    """

    name = "search"
    description = "Search the knowledge base and return the most relevant passages."
    parameters = {  # noqa: RUF012 (read only)
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to search for."}},
        "required": ["query"],
    }

    def __init__(
        self,
        retriever: Retriever,
        top_k: int = 3,
        document_template: str = DOCUMENT_TEMPLATE,
        **settings,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"tool search top_k must be >= 1, got {top_k}")
        super().__init__(**settings)
        self.retriever, self.top_k, self.document_template = retriever, top_k, document_template
        self.seen: dict[
            str, Passage
        ] = {}  # what fetch may return from a retriever without passages

    def run(self, query: str) -> str:
        (result,) = self.run_batch([{"query": query}])
        if isinstance(result, Exception):
            raise result
        return result

    def run_batch(self, arguments: list[dict]) -> list[str | Exception]:
        """Many searches as one retriever call (identical queries searched once), each
        result written as :meth:`run` writes it; an empty query is that call's error."""
        queries = [str(a["query"]) for a in arguments]
        found = self._search(list(dict.fromkeys(q for q in queries if q.strip())))
        results: list[str | Exception] = []
        for query in queries:
            hits = found.get(query, ToolError("the query is empty"))
            if isinstance(hits, Exception):
                results.append(hits)
                continue
            for hit in hits:
                self.seen.setdefault(hit.passage.id, hit.passage)
            results.append(documents(hits, self.document_template) or "No results.")
        return results

    def _search(self, queries: list[str]) -> dict[str, list[Hit] | Exception]:
        """Each query's hits from one retriever call. Where the retriever refuses the batch
        for a query (a ``ValueError``: text that is not valid Unicode), each query on its own,
        so only that query's call fails; any other failure (the retriever is down) fails
        every call of the batch at once."""
        if not queries:
            return {}
        try:
            return dict(zip(queries, self.retriever.search(queries, self.top_k), strict=True))
        except ValueError:
            if len(queries) == 1:
                raise
        found: dict[str, list[Hit] | Exception] = {}
        for query in queries:
            try:
                (found[query],) = self.retriever.search([query], self.top_k)
            except Exception as exc:  # noqa: BLE001 (that call's failure, for the model)
                found[query] = exc
        return found


class FetchTool(Tool):
    """``fetch(id)``: a passage's whole text by its id (the retriever's passages, or one a
    search of this run returned).

    Args:
        retriever: The retriever (the environment gives its own).
        search: The agent's search tool, whose results ``fetch`` can always return (a remote
            retriever keeps no passages here).
    """

    name = "fetch"
    description = "Return the full text of a passage, given its id."
    parameters = {  # noqa: RUF012 (read only)
        "type": "object",
        "properties": {"id": {"type": "string", "description": "The passage id."}},
        "required": ["id"],
    }

    def __init__(self, retriever: Retriever, search: SearchTool | None = None, **settings) -> None:
        super().__init__(**settings)
        self.retriever, self.search = retriever, search
        self._by_id: dict[str, Passage] | None = None

    def _passages(self) -> dict[str, Passage]:
        if self._by_id is None:
            by_id: dict[str, Passage] = {}
            for part in self.retriever.parts():
                ensure = getattr(part, "ensure_loaded", None)
                if ensure is not None and getattr(part, "stores_passages", False):
                    ensure()
                    by_id.update((p.id, p) for p in part.passages)
            self._by_id = by_id
        return self._by_id

    def run(self, id: str) -> str:  # noqa: A002 (the argument's name is the model's)
        passage = self._passages().get(id) or (self.search.seen.get(id) if self.search else None)
        if passage is None:
            raise ToolError(f"no passage has id {id!r}")
        return f"(Title: {passage.title}) {passage.text}"


class AnswerTool(Tool):
    """``answer(answer)``: the final answer; the episode ends after this turn."""

    name = "answer"
    description = "Give the final answer to the question. Call it once, at the end."
    parameters = {  # noqa: RUF012 (read only)
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "The short final answer."}},
        "required": ["answer"],
    }
    final = True

    def __init__(self, **settings) -> None:
        settings.setdefault("cache_size", 0)
        super().__init__(**settings)

    def run(self, answer: str) -> str:
        return "Answer recorded."
