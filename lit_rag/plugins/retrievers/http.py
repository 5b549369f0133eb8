"""``retriever: http``: search a retrieval server that speaks Search-R1's API.

Search-R1 (``search_r1/search/retrieval_server.py``, PeterGriffinJin/Search-R1) defined the API
that verl, SkyRL, ROLL and rLLM speak, and that ``lit-rag index serve`` serves:

    POST /retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "0", "contents": "\\"Title\\"\\ntext"},
                      "score": 0.83}, ...],
                    [...]]}

one list per query, best first; without ``return_scores`` each entry is the document itself.
A document is a corpus row: FlashRAG / Search-R1 rows carry ``id`` and ``contents``
(``"Title"`` on the first line, the text after it), lit-rag's server adds ``title`` and
``text``. Search-R1's own client (``generation.py::_batch_search``) sends one request per
generation turn holding every active sample's query; so does this retriever: one ``search``
call of an environment is one POST (split into requests of at most ``batch_size`` queries).

Failures: a refused connection, a timeout, HTTP 429 or 5xx are retried ``retries`` times with
exponential backoff; then, and at once for any other HTTP error or a malformed answer, the
search fails with one line naming the URL and what went wrong.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from lit_rag.api import Hit, InputError, Passage, Retriever, check_search_args

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000/retrieve"
#: HTTP statuses worth another try: the server is busy or restarting
RETRY_STATUSES = (429, 500, 502, 503, 504)


class RetrieverUnavailableError(InputError):
    """The retrieval server could not be reached, timed out, or kept failing."""


class RetrieverResponseError(InputError):
    """The retrieval server answered with an error or with something that is not Search-R1's API."""


class HttpRetriever(Retriever):
    """Queries a running retrieval server (Search-R1's ``POST /retrieve`` API).

    Args:
        url: The endpoint, e.g. ``http://127.0.0.1:8000/retrieve`` (``lit-rag index serve``) or
            a Search-R1 / FlashRAG server's.
        timeout: Seconds to wait for one request (connect and read).
        retries: Further tries after a refused connection, a timeout, HTTP 429 or 5xx.
        backoff: Seconds before the first retry; doubled before each next one.
        batch_size: Most queries per request (a longer search is split).
    """

    kind = "http"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 512,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url: got {url!r}; expected http://HOST:PORT/retrieve")
        if timeout <= 0:
            raise ValueError(f"timeout: got {timeout}; expected seconds > 0")
        if retries < 0:
            raise ValueError(f"retries: got {retries}; expected >= 0")
        if backoff < 0:
            raise ValueError(f"backoff: got {backoff}; expected seconds >= 0")
        if batch_size < 1:
            raise ValueError(f"batch_size: got {batch_size}; expected >= 1")
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.batch_size = batch_size
        self._client: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}  # a connection pool does not pickle or copy

    @property
    def client(self) -> Any:
        """An ``httpx.Client`` (a connection pool), opened on first use."""
        if self._client is None:
            import httpx

            self._client = httpx.Client(timeout=self.timeout)
        return self._client

    # -- search ----------------------------------------------------------------------------

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query from the server, best first; an empty query gives no hits
        and is not sent.

        Raises:
            ValueError: ``k < 1``, or a query with a lone surrogate (names the query).
            RetrieverUnavailableError: The server is down, times out, or keeps failing.
            RetrieverResponseError: The server refused the request or answered out of the API.
        """
        check_search_args(queries, k)
        results: list[list[Hit]] = [[] for _ in queries]
        asked = [i for i, q in enumerate(queries) if q.strip()]
        for start in range(0, len(asked), self.batch_size):
            rows = asked[start : start + self.batch_size]
            answer = self._post(
                {"queries": [queries[i] for i in rows], "topk": k, "return_scores": True}
            )
            for i, entries in zip(rows, _result_lists(answer, len(rows), self.url), strict=True):
                results[i] = [_hit(entry, rank, self.url) for rank, entry in enumerate(entries[:k])]
        return results

    def _post(self, payload: dict) -> Any:
        """POST ``payload``, retrying what a busy or restarting server causes; the JSON answer."""
        import httpx

        delay, problem = self.backoff, ""
        for attempt in range(self.retries + 1):
            if attempt:
                log.warning(
                    "retrieval server %s: %s; retry %d of %d in %.1f s",
                    self.url,
                    problem,
                    attempt,
                    self.retries,
                    delay,
                )
                time.sleep(delay)
                delay *= 2
            try:
                response = self.client.post(self.url, json=payload)
            except httpx.TimeoutException:
                problem = f"no answer within {self.timeout:g} s (timeout)"
                continue
            except httpx.TransportError as err:  # refused, reset, DNS: the server is not there
                problem = f"cannot connect ({_reason(err)})"
                continue
            if response.status_code in RETRY_STATUSES:
                problem = f"HTTP {response.status_code}"
                continue
            if response.status_code != 200:
                raise RetrieverResponseError(
                    f"retrieval server {self.url} answered HTTP {response.status_code}: "
                    f"{_detail(response)}"
                )
            try:
                return response.json()
            except ValueError:
                raise RetrieverResponseError(
                    f"retrieval server {self.url} answered with something that is not JSON "
                    f'({response.text[:80]!r}); expected Search-R1\'s {{"result": [...]}}'
                ) from None
        raise RetrieverUnavailableError(
            f"retrieval server {self.url}: {problem} after {self.retries + 1} tries; start it "
            "(lit-rag index serve INDEX --port PORT, or Search-R1's retrieval_server.py) or fix "
            "the retriever's url"
        )


def _reason(err: Exception) -> str:
    """The innermost message of a connection error, e.g. ``[Errno 111] Connection refused``."""
    text = str(err) or type(err).__name__
    return text.rpartition("] ")[2] if "Errno" not in text else text[text.find("[Errno") :]


def _detail(response: Any) -> str:
    """The server's explanation of an error answer (FastAPI's ``detail``), in one line."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return " ".join(str(detail).split())[:200]


def _result_lists(answer: Any, count: int, url: str) -> list[list]:
    """``answer["result"]``, checked to hold one list per query sent."""
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list) or not all(isinstance(r, list) for r in result):
        raise RetrieverResponseError(
            f"retrieval server {url} answered {str(answer)[:80]!r}; expected Search-R1's "
            '{"result": [[document, ...] per query]}'
        )
    if len(result) != count:
        raise RetrieverResponseError(
            f"retrieval server {url} returned {len(result)} result lists for {count} queries"
        )
    return result


def _hit(entry: Any, rank: int, url: str) -> Hit:
    """One result entry (``{"document", "score"}``, or the bare document) as a :class:`Hit`.

    Without a score the hit scores ``1 / (rank + 1)``, so the server's order is kept.
    """
    document, score = entry, 1.0 / (rank + 1)
    if isinstance(entry, dict) and isinstance(entry.get("document"), dict):
        document = entry["document"]
        if isinstance(entry.get("score"), (int, float)) and not isinstance(entry["score"], bool):
            score = float(entry["score"])
    if not isinstance(document, dict):
        raise RetrieverResponseError(
            f"retrieval server {url} returned a document that is not a JSON object: "
            f"{str(entry)[:80]!r}"
        )
    return Hit(passage=_passage(document, url), score=score, rank=rank)


def _passage(document: dict, url: str) -> Passage:
    """A corpus row as a :class:`Passage`: ``title`` and ``text`` when the row has them, else
    ``contents`` split as Search-R1 splits it (title on the first line, quotes stripped)."""
    from lit_rag.api import split_contents

    title, text = document.get("title"), document.get("text")
    if not (isinstance(title, str) and isinstance(text, str)):
        contents = document.get("contents")
        if not isinstance(contents, str):
            raise RetrieverResponseError(
                f"retrieval server {url} returned a document without 'contents' (or 'title' and "
                f"'text'): {str(document)[:80]!r}"
            )
        title, text = split_contents(contents)
    pid = document.get("id")
    if isinstance(pid, (str, int)) and not isinstance(pid, bool):
        pid = str(pid)
    else:  # a server whose corpus rows carry no id: name the passage by its content
        pid = "sha1:" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
    return Passage(id=pid, title=title, text=text)
