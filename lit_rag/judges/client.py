"""An LLM judge behind an OpenAI-compatible chat endpoint: a question, its gold answers and a
model's response in, a score in [0, 1] out.

The endpoint is OpenAI's API or any server that speaks it (``vllm serve MODEL`` ->
``base_url: http://127.0.0.1:8000/v1``). The judge's reply is untrusted text: it is read with
a regular expression (never evaluated), and a failed call or a reply without a score becomes a
:class:`Verdict` with an ``error``, never an exception. Who asks decides what a failure costs:
the ``llm_judge`` reward marks the sample failed (it leaves the loss) and pays its
``failure_reward``, ``lit-rag evaluate`` stops with one line.

Two ways to read a reply (``score``):

- ``yes_no``: the first ``yes`` / ``no`` word (ARENA's LJ, Appendix C.3): 1.0 / 0.0;
- ``number``: the first number, clipped to ``[0, max_score]`` and divided by ``max_score``
  (``"Score: 8/10"`` with ``max_score=10`` -> 0.8).

A thinking judge (Qwen3, QwQ, DeepSeek-R1) reasons before its verdict. The score is read from
what follows the reasoning block (:func:`strip_reasoning`: the text after the last
``</think>``); a reply still inside its reasoning (a ``<think>`` left open, or no
``</think>`` when the chat template opens the block in the prompt: ``template_opens_think``)
has no verdict yet and fails with ``reasoning not finished within max_tokens``. A server-side
reasoning field (vLLM's ``reasoning`` / ``reasoning_content``) is never read for a score.
Hence the default ``max_tokens`` of 1024: room to reason; a non-thinking judge stops after a
word. ``chat_template_kwargs: {enable_thinking: false}`` turns a Qwen3 judge's reasoning off.

Example:
    >>> parse_yes_no("Yes, it names the city."), parse_yes_no("No; yes would be wrong")
    (1.0, 0.0)
    >>> parse_number("Score: 8/10", 10.0), parse_number("-3", 10.0), parse_number("n/a", 10.0)
    (0.8, 0.0, None)
    >>> strip_reasoning("<think>no? It says Paris.</think>Yes."), strip_reasoning("<think>hm")
    ('Yes.', None)

Requests go through ``openai.AsyncOpenAI`` on an event loop of the judge's own (a daemon thread
per process), ``max_concurrency`` at a time; :meth:`Judge.scores` waits for them from any
thread, an event loop's included, and :meth:`Judge.ascores` awaits them from any loop.

The ``openai`` package (the ``judge`` extra) is imported when a :class:`Judge` is built, not
when this module is.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lit_rag.errors import InputError

#: how a reply becomes a score (module doc)
JUDGE_SCORES = ("yes_no", "number")

#: the fields a judge prompt may name
PROMPT_FIELDS = ("question", "answers", "response")

#: the default question to the judge: ARENA's LJ criterion (any gold answer or a synonym counts),
#: with the question, for ``score: yes_no``
ANSWER_JUDGE_PROMPT = (
    "Question: {question}\n"
    "Correct answers (matching any one is enough): {answers}\n"
    "Model's answer: {response}\n"
    "Is the model's answer correct? It is correct when it names any item of the correct answers "
    'or a synonym of one. Reply with only "yes" or "no".'
)

#: a reasoning block's tags (Qwen3, QwQ, DeepSeek-R1)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: the error of a reply cut off by ``max_tokens`` inside its reasoning
UNFINISHED = "reasoning not finished within max_tokens"

#: request keys the judge sets itself, which ``extra_body`` may not override
OWN_KEYS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "n")

_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?")


def parse_yes_no(reply: str) -> float | None:
    """1.0 when the first ``yes`` / ``no`` word of ``reply`` is yes, 0.0 when it is no, ``None``
    when there is neither. Never raises."""
    found = _YES_NO.search(reply if isinstance(reply, str) else "")
    if found is None:
        return None
    return 1.0 if found.group(1).lower() == "yes" else 0.0


def parse_number(reply: str, max_score: float) -> float | None:
    """The first number of ``reply`` clipped to ``[0, max_score]``, over ``max_score``; ``None``
    without one. Never raises."""
    found = _NUMBER.search(reply if isinstance(reply, str) else "")
    if found is None:
        return None
    value = float(found.group(0))  # digits only: a float or, past its range, inf (clipped)
    return min(max(value, 0.0), max_score) / max_score


def strip_reasoning(reply: str, opened: bool = False) -> str | None:
    """What ``reply`` says after its reasoning block: the text after its last ``</think>`` (an
    opening ``<think>`` may be in the reply or in the prompt); the whole reply when it has no
    block. ``None`` while the reasoning is unfinished: a ``<think>`` left open, or no
    ``</think>`` at all when ``opened`` (the chat template opened the block in the prompt).
    Never raises.

    The last ``</think>``, not the first: reasoning that quotes the judged answer may quote one.

    Example:
        ``"<think>no? It says Paris.</think>Yes."`` -> ``"Yes."``; ``"It says Paris.</think>No"``
        -> ``"No"``; ``"<think>It says"`` -> ``None``; ``"Yes."`` -> ``"Yes."``, but ``None``
        with ``opened=True``.
    """
    text = reply if isinstance(reply, str) else ""
    _, closed, tail = text.rpartition(THINK_CLOSE)
    if not closed:
        return None if opened or THINK_OPEN in text else text
    return None if THINK_OPEN in tail else tail


def read_reply(
    content: Any,
    reasoning: Any,
    finish_reason: Any,
    parse: Callable[[str], float | None],
    opened: bool = False,
) -> Verdict:
    """The :class:`Verdict` in one chat reply: ``content`` after its reasoning block
    (:func:`strip_reasoning`) read by ``parse``. ``reasoning`` (a server's separate reasoning
    field) is never read for a score; with empty ``content`` and a ``length`` finish it says
    the reply was cut inside the reasoning. Never raises.

    Example:
        ``read_reply("<think>is it no?</think>yes", None, "stop", parse_yes_no)`` -> score 1.0;
        ``read_reply("<think>is it", None, "length", parse_yes_no)`` -> no score, error
        ``reasoning not finished within max_tokens``; so is ``read_reply(None, "is it",
        "length", parse_yes_no)`` (vLLM's ``--reasoning-parser`` split the reasoning off).
    """
    if content is not None and not isinstance(content, str):
        return Verdict(score=None, error="bad response")
    content = content or ""
    verdict = strip_reasoning(content, opened)
    cut = finish_reason == "length"
    if verdict is None or (cut and not verdict.strip() and reasoning):
        error = UNFINISHED if cut else "reasoning not finished (the reply ends before </think>)"
        return Verdict(score=None, reply=content, error=error)
    score = parse(verdict)
    return Verdict(score=score, reply=content, error="" if score is not None else "unparsable")


@dataclass(frozen=True)
class JudgeCase:
    """What the judge reads about one answer.

    Args:
        question: The question asked.
        answers: The gold answers (the prompt gets them as a JSON list).
        response: The answer to judge (untrusted text).
    """

    question: str
    answers: Sequence[str]
    response: str


@dataclass(frozen=True)
class Verdict:
    """The judge's word on one :class:`JudgeCase`.

    Args:
        score: In [0, 1]; ``None`` when the call failed or the reply held no score.
        reply: The judge's reply, its reasoning block included ("" when the call failed).
        error: "" or a one-line reason: ``timeout``, ``http <status>``, ``connection``,
            ``bad response`` (the body was no chat completion), ``unparsable`` (a reply without
            a score), ``reasoning not finished within max_tokens`` (cut inside its reasoning),
            or the exception's class name.
        cached: Answered without a request of its own (the cache, or the same prompt earlier in
            the same call).
    """

    score: float | None
    reply: str = ""
    error: str = ""
    cached: bool = False


@dataclass(eq=False)
class Judge:
    """Scores answers with an LLM behind an OpenAI-compatible chat endpoint (module doc).

    Example:
        ``Judge(base_url="http://127.0.0.1:8000/v1", model="judge").scores([JudgeCase(
        "Capital of France?", ["Paris"], "Paris")])`` asks the rendered
        :data:`ANSWER_JUDGE_PROMPT` once; a reply ``"Yes."`` (or ``"<think>..</think>Yes."``)
        gives ``[Verdict(score=1.0, reply="Yes.")]``, and asking again is a cache hit
        (``cached=True``, no request).

    Args:
        base_url: The endpoint (``.../v1``).
        model: The judge model's name at the endpoint.
        api_key_env: Environment variable holding the key (a local server needs none: unset
            sends ``EMPTY``).
        prompt: Template naming ``{response}`` and any of ``{question}``, ``{answers}`` (the
            gold answers as a JSON list); write a literal brace as ``{{`` / ``}}``.
        score: How a reply becomes a score: ``yes_no`` or ``number`` (module doc).
        max_score: The top of the ``number`` scale (the reply's number is divided by it).
        max_tokens: Reply budget, reasoning included: a thinking judge cut off inside its
            reasoning gives no verdict (1024 leaves it room; a non-thinking judge stops after a
            word whatever the budget).
        temperature: Sampling temperature (0: greedy).
        timeout_s: Seconds per request.
        retries: Retries per request (the openai client's ``max_retries``, with its back-off).
        max_concurrency: Requests in flight at once.
        cache_size: Verdicts kept, keyed by the rendered prompt (least recently used go first;
            0: none). Only verdicts with a score are kept.
        chat_template_kwargs: Keyword arguments for the judge's chat template, sent as vLLM and
            SGLang take them (``extra_body={"chat_template_kwargs": ...}``): ``{enable_thinking:
            false}`` turns a Qwen3 judge's reasoning off. OpenAI's API refuses the key.
        extra_body: More fields for the request body, merged into it (``top_p``, vLLM's
            ``structured_outputs``); not the ones the judge sets (:data:`OWN_KEYS`).
        template_opens_think: The judge's chat template ends the prompt inside an open
            ``<think>`` block (QwQ, DeepSeek-R1, Qwen3's Thinking-2507 models), so a reply
            without ``</think>`` is unfinished reasoning, never a verdict.
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    prompt: str = ANSWER_JUDGE_PROMPT
    score: str = "yes_no"
    max_score: float = 10.0
    max_tokens: int = 1024
    temperature: float = 0.0
    timeout_s: float = 60.0
    retries: int = 2
    max_concurrency: int = 8
    cache_size: int = 4096
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    template_opens_think: bool = False
    _cache: OrderedDict[str, Verdict] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False)
    # (loop, client, semaphore): the AsyncOpenAI client and the concurrency bound on that loop
    _on_loop: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        check_settings(self)
        check_body(self)
        check_prompt(self.prompt)
        _openai()  # fail at construction, not at the first step, when the extra is missing

    def render(self, case: JudgeCase) -> str:
        """The prompt for ``case`` (the response is a value, never a template)."""
        return self.prompt.format(
            question=case.question,
            answers=json.dumps(list(case.answers), ensure_ascii=False),
            response=case.response,
        )

    def parse(self, reply: str) -> float | None:
        """The score in ``reply`` (its verdict, reasoning removed) as ``score`` reads it,
        ``None`` without one."""
        if self.score == "yes_no":
            return parse_yes_no(reply)
        return parse_number(reply, self.max_score)

    def request_body(self) -> dict[str, Any]:
        """The request's fields beside model, messages, max_tokens and temperature:
        ``extra_body`` with ``chat_template_kwargs`` merged into its own (this setting wins)."""
        body = dict(self.extra_body or {})
        if self.chat_template_kwargs:
            merged = {**(body.get("chat_template_kwargs") or {}), **self.chat_template_kwargs}
            body["chat_template_kwargs"] = merged
        return body

    def scores(self, cases: Sequence[JudgeCase]) -> list[Verdict]:
        """One :class:`Verdict` per case, in order; never raises for a failed call or a reply
        without a score. Distinct uncached prompts are asked ``max_concurrency`` at a time, on
        the judge's own event loop; this waits for them (from any thread but that loop's)."""
        loop = judge_loop()
        if _running_loop() is loop:
            raise RuntimeError("Judge.scores would wait on its own loop; await ascores there")
        return asyncio.run_coroutine_threadsafe(self._scores(list(cases)), loop).result()

    async def ascores(self, cases: Sequence[JudgeCase]) -> list[Verdict]:
        """:meth:`scores`, awaited from any event loop (the requests run on the judge's)."""
        future = asyncio.run_coroutine_threadsafe(self._scores(list(cases)), judge_loop())
        return await asyncio.wrap_future(future)

    async def _scores(self, cases: list[JudgeCase]) -> list[Verdict]:
        """:meth:`scores` on the judge's loop: the cache, then the rest asked concurrently."""
        prompts = [self.render(c) for c in cases]
        found = {p: v for p in dict.fromkeys(prompts) if (v := self._cached(p)) is not None}
        todo = [p for p in dict.fromkeys(prompts) if p not in found]
        if todo:
            client, limit = self._client_here()

            async def ask(prompt: str) -> Verdict:
                async with limit:
                    return await self._ask(client, prompt)

            asked = await asyncio.gather(*(ask(p) for p in todo))
            for p, verdict in zip(todo, asked, strict=True):
                found[p] = verdict
                self._keep(p, verdict)
        out, seen = [], set()
        for p in prompts:
            out.append(replace(found[p], cached=True) if p in seen else found[p])
            seen.add(p)
        return out

    async def _ask(self, client: Any, prompt: str) -> Verdict:
        """One request (with the client's retries and time-out) as a verdict; never raises."""
        try:
            out = await client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                extra_body=self.request_body() or None,
            )
        except Exception as err:  # any failed call is a verdict, never a crash
            return Verdict(score=None, error=failure_reason(err))
        try:
            choice = out.choices[0]
            message = choice.message
            content = message.content
        except (AttributeError, IndexError, TypeError):
            return Verdict(score=None, error="bad response")
        # vLLM's separate reasoning (``reasoning`` since 0.10, ``reasoning_content`` before)
        reasoning = getattr(message, "reasoning", None) or getattr(
            message, "reasoning_content", None
        )
        finish = getattr(choice, "finish_reason", None)
        return read_reply(content, reasoning, finish, self.parse, self.template_opens_think)

    def _cached(self, prompt: str) -> Verdict | None:
        with self._lock:
            verdict = self._cache.get(prompt)
            if verdict is None:
                return None
            self._cache.move_to_end(prompt)
            return replace(verdict, cached=True)

    def _keep(self, prompt: str, verdict: Verdict) -> None:
        if self.cache_size == 0 or verdict.score is None:
            return
        with self._lock:
            self._cache[prompt] = verdict
            self._cache.move_to_end(prompt)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _client_here(self) -> tuple[Any, asyncio.Semaphore]:
        """The ``AsyncOpenAI`` client and the concurrency bound of the running loop (the
        judge's), built on first use there (both belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._on_loop is None or self._on_loop[0] is not loop:
            client = _openai().AsyncOpenAI(
                base_url=self.base_url,
                api_key=os.environ.get(self.api_key_env) or "EMPTY",
                timeout=self.timeout_s,
                max_retries=self.retries,
            )
            self._on_loop = (loop, client, asyncio.Semaphore(self.max_concurrency))
        return self._on_loop[1], self._on_loop[2]

    def __getstate__(self) -> dict:
        """Settings and cache; the client and the lock are rebuilt (a copy or a pickle works)."""
        state = dict(self.__dict__)
        state["_on_loop"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def judge_loop() -> asyncio.AbstractEventLoop:
    """The process's judge event loop, running in a daemon thread of its own (started on first
    use, and again in a forked child, where the parent's thread does not exist)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="lit-rag-judge", daemon=True)
            thread.start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread
        return None


def check_settings(judge: Judge) -> None:
    """Every numeric and named setting at once; the first bad one is one line naming its key."""
    if judge.score not in JUDGE_SCORES:
        raise InputError(
            f"judge score '{judge.score}' is not known; allowed: {', '.join(JUDGE_SCORES)}"
        )
    rules = (
        ("max_score", judge.max_score > 0, "> 0"),
        ("max_tokens", judge.max_tokens >= 1, ">= 1"),
        ("temperature", judge.temperature >= 0, ">= 0"),
        ("timeout_s", judge.timeout_s > 0, "> 0"),
        ("retries", judge.retries >= 0, ">= 0"),
        ("max_concurrency", judge.max_concurrency >= 1, ">= 1"),
        ("cache_size", judge.cache_size >= 0, ">= 0 (0: no cache)"),
    )
    for key, ok, allowed in rules:
        if not ok:
            raise InputError(f"judge {key} must be {allowed}; got {getattr(judge, key)}")
    for key in ("base_url", "model"):
        if not getattr(judge, key):
            raise InputError(f"judge {key} is empty; name the endpoint and its model")


def check_body(judge: Judge) -> None:
    """``chat_template_kwargs`` and ``extra_body``: JSON mappings that leave the judge's own
    request keys alone, and no thinking switched off under ``template_opens_think``; else one
    line naming the key."""
    for key in ("chat_template_kwargs", "extra_body"):
        value = getattr(judge, key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise InputError(f"judge {key} must be a mapping of names to values; got {value!r}")
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            raise InputError(f"judge {key} must be JSON (it is sent as is): {err}") from None
    extra = judge.extra_body or {}
    taken = [k for k in OWN_KEYS if k in extra]
    if taken:
        raise InputError(
            f"judge extra_body sets {', '.join(taken)}, which the judge sets itself; use the "
            "judge's own settings (model, max_tokens, temperature)"
        )
    if not isinstance(extra.get("chat_template_kwargs", {}), dict):
        raise InputError(
            "judge extra_body.chat_template_kwargs must be a mapping; got "
            f"{extra['chat_template_kwargs']!r} (or use the chat_template_kwargs setting)"
        )
    thinking = judge.request_body().get("chat_template_kwargs", {}).get("enable_thinking")
    if judge.template_opens_think and thinking is False:
        raise InputError(
            "judge template_opens_think is true but chat_template_kwargs.enable_thinking is "
            "false: with thinking off no reasoning block is open; drop one of them"
        )


def check_prompt(prompt: str) -> None:
    """A template naming ``{response}`` and only :data:`PROMPT_FIELDS`; else one line."""
    allowed = ", ".join("{" + f + "}" for f in PROMPT_FIELDS)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(prompt) if name is not None]
    except ValueError as err:
        raise InputError(
            f"judge prompt is not a valid template ({err}); fields: {allowed}, "
            "a literal brace as {{ or }}"
        ) from None
    unknown = sorted({n for n in names if n not in PROMPT_FIELDS})
    if unknown:
        raise InputError(
            f"judge prompt names unknown field(s) {unknown}; allowed: {allowed} "
            "(a literal brace as {{ or }})"
        )
    if "response" not in names:
        raise InputError(f"judge prompt must name {{response}} (the answer to judge); {allowed}")


def failure_reason(err: BaseException) -> str:
    """A failed call's one-line reason (:attr:`Verdict.error`)."""
    openai = _openai()
    if isinstance(err, openai.APITimeoutError):  # before APIConnectionError, its base class
        return "timeout"
    if isinstance(err, openai.APIStatusError):
        return f"http {err.status_code}"
    if isinstance(err, openai.APIConnectionError):
        return "connection"
    if isinstance(err, (openai.APIResponseValidationError, json.JSONDecodeError)):
        return "bad response"
    return type(err).__name__


def judge_signals(verdicts: Sequence[Verdict]) -> dict[str, float]:
    """A step's judge health: ``failures`` (how many verdicts have no score) and, over the
    scored ones, ``score_mean``, ``score_std`` (population), ``score_at_0`` and ``score_at_1``
    (the shares scored exactly 0 and 1); 0.0 where nothing was scored.

    Example:
        Scores ``[1.0, 0.0, 1.0]`` and one failure: failures 1, mean 2/3,
        std sqrt((1/9 + 4/9 + 1/9) / 3) = 0.471, at 0: 1/3, at 1: 2/3.
    """
    scores = [v.score for v in verdicts if v.score is not None]
    n = len(scores)
    mean = sum(scores) / n if n else 0.0
    return {
        "failures": float(len(verdicts) - n),
        "score_mean": mean,
        "score_std": math.sqrt(sum((s - mean) ** 2 for s in scores) / n) if n else 0.0,
        "score_at_0": sum(s == 0.0 for s in scores) / n if n else 0.0,
        "score_at_1": sum(s == 1.0 for s in scores) / n if n else 0.0,
    }


def _openai() -> Any:
    """The ``openai`` module, or one line naming the extra that installs it."""
    try:
        import openai
    except ImportError:
        raise InputError(
            "the LLM judge needs the openai package: pip install 'lit-rag[judge]'"
        ) from None
    return openai
