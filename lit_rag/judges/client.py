"""An LLM judge behind an OpenAI-compatible chat endpoint: a question, its gold answers and a
model's response in, a score in [0, 1] out.

The endpoint is OpenAI's API or any server that speaks it (``vllm serve MODEL`` ->
``base_url: http://127.0.0.1:8000/v1``). The judge's reply is untrusted text: it is read with
a regular expression (never evaluated), and a failed call or a reply without a score becomes a
:class:`Verdict` with an ``error``, never an exception. Who asks decides what a failure costs:
the ``llm_judge`` reward pays its ``failure_reward``, ``lit-rag evaluate`` stops with one line.

Two ways to read a reply (``score``):

- ``yes_no``: the first ``yes`` / ``no`` word (ARENA's LJ, Appendix C.3): 1.0 / 0.0;
- ``number``: the first number, clipped to ``[0, max_score]`` and divided by ``max_score``
  (``"Score: 8/10"`` with ``max_score=10`` -> 0.8).

Example:
    >>> parse_yes_no("Yes, it names the city."), parse_yes_no("No; yes would be wrong")
    (1.0, 0.0)
    >>> parse_number("Score: 8/10", 10.0), parse_number("-3", 10.0), parse_number("n/a", 10.0)
    (0.8, 0.0, None)

The ``openai`` package (the ``judge`` extra) is imported when a :class:`Judge` is built, not
when this module is.
"""

from __future__ import annotations

import json
import math
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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

_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?")


def parse_yes_no(reply: str) -> float | None:
    """1.0 when the first ``yes`` / ``no`` word of ``reply`` is yes, 0.0 when it is no, ``None``
    when there is neither. Never raises."""
    found = _YES_NO.search(reply or "")
    if found is None:
        return None
    return 1.0 if found.group(1).lower() == "yes" else 0.0


def parse_number(reply: str, max_score: float) -> float | None:
    """The first number of ``reply`` clipped to ``[0, max_score]``, over ``max_score``; ``None``
    without one. Never raises."""
    found = _NUMBER.search(reply or "")
    if found is None:
        return None
    value = float(found.group(0))  # digits only: a float or, past its range, inf (clipped)
    return min(max(value, 0.0), max_score) / max_score


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
        reply: The judge's reply ("" when the call failed).
        error: "" or a one-line reason: ``timeout``, ``http <status>``, ``connection``,
            ``bad response`` (the body was no chat completion), ``unparsable`` (a reply without
            a score), or the exception's class name.
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
        :data:`ANSWER_JUDGE_PROMPT` once; a reply ``"Yes."`` gives ``[Verdict(score=1.0,
        reply="Yes.")]``, and asking again is a cache hit (``cached=True``, no request).

    Args:
        base_url: The endpoint (``.../v1``).
        model: The judge model's name at the endpoint.
        api_key_env: Environment variable holding the key (a local server needs none: unset
            sends ``EMPTY``).
        prompt: Template naming ``{response}`` and any of ``{question}``, ``{answers}`` (the
            gold answers as a JSON list); write a literal brace as ``{{`` / ``}}``.
        score: How a reply becomes a score: ``yes_no`` or ``number`` (module doc).
        max_score: The top of the ``number`` scale (the reply's number is divided by it).
        max_tokens: Reply budget.
        temperature: Sampling temperature (0: greedy).
        timeout_s: Seconds per request.
        retries: Retries per request (the openai client's ``max_retries``, with its back-off).
        max_concurrency: Requests in flight at once.
        cache_size: Verdicts kept, keyed by the rendered prompt (least recently used go first;
            0: none). Only verdicts with a score are kept.
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    prompt: str = ANSWER_JUDGE_PROMPT
    score: str = "yes_no"
    max_score: float = 10.0
    max_tokens: int = 8
    temperature: float = 0.0
    timeout_s: float = 60.0
    retries: int = 2
    max_concurrency: int = 8
    cache_size: int = 4096
    _cache: OrderedDict[str, Verdict] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False)
    _client: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        check_settings(self)
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
        """The score in ``reply`` as ``score`` reads it, ``None`` without one."""
        if self.score == "yes_no":
            return parse_yes_no(reply)
        return parse_number(reply, self.max_score)

    def scores(self, cases: Sequence[JudgeCase]) -> list[Verdict]:
        """One :class:`Verdict` per case, in order; never raises for a failed call or a reply
        without a score. Distinct uncached prompts are asked ``max_concurrency`` at a time."""
        prompts = [self.render(c) for c in cases]
        found = {p: v for p in dict.fromkeys(prompts) if (v := self._cached(p)) is not None}
        todo = [p for p in dict.fromkeys(prompts) if p not in found]
        if todo:
            client = self._openai_client()
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(todo))) as pool:
                asked = list(pool.map(lambda p: self._ask(client, p), todo))
            for p, verdict in zip(todo, asked, strict=True):
                found[p] = verdict
                self._keep(p, verdict)
        out, seen = [], set()
        for p in prompts:
            out.append(replace(found[p], cached=True) if p in seen else found[p])
            seen.add(p)
        return out

    def _ask(self, client: Any, prompt: str) -> Verdict:
        """One request (with the client's retries) as a verdict; never raises."""
        try:
            out = client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
        except Exception as err:  # any failed call is a verdict, never a crash
            return Verdict(score=None, error=failure_reason(err))
        try:
            reply = out.choices[0].message.content or ""
        except (AttributeError, IndexError, TypeError):
            return Verdict(score=None, error="bad response")
        if not isinstance(reply, str):
            return Verdict(score=None, error="bad response")
        score = self.parse(reply)
        return Verdict(score=score, reply=reply, error="" if score is not None else "unparsable")

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

    def _openai_client(self) -> Any:
        """The client, built on first use (thread-safe; shared by the request threads)."""
        with self._lock:
            if self._client is None:
                import os

                self._client = _openai().OpenAI(
                    base_url=self.base_url,
                    api_key=os.environ.get(self.api_key_env) or "EMPTY",
                    timeout=self.timeout_s,
                    max_retries=self.retries,
                )
            return self._client

    def __getstate__(self) -> dict:
        """Settings and cache; the client and the lock are rebuilt (a copy or a pickle works)."""
        state = dict(self.__dict__)
        state["_client"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


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
