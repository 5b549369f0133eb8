"""Tool calls in a model's text, per chat-template family; untrusted text: never raises or evals.

A parser takes one assistant turn's text and gives :class:`Parsed`: the text outside the calls,
the calls, and one :class:`~lit_rag.tools.base.ToolResult` (``malformed``) per call it could not
read, so the model is told what was wrong in the tool turn instead of the call vanishing.

- ``hermes``: Hermes, Qwen2.5 / Qwen3 and the templates derived from them: each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (verl's and vLLM's ``hermes``
  tool parser read the same form).
  A reasoning block (``<think>...</think>``, Qwen3 and the reasoning models built on Qwen) is
  not part of the turn's answer: calls written inside it are the model thinking aloud and are
  not run, and :attr:`Parsed.content` leaves it out (:attr:`Parsed.reasoning` keeps it).
- ``llama3``: Llama 3.1-3.3's JSON tool calling (the "JSON based tool calling" of Meta's model
  card): the turn is a JSON object ``{"name": ..., "parameters": {...}}``, or several separated
  by ``;``; text that is not such an object is a plain message, not a malformed call.
- ``mistral``: Mistral's ``[TOOL_CALLS]`` control token followed by a JSON list of calls
  (``[{"name": ..., "arguments": {...}, "id": ...}]``, Mistral 7B v0.3 and NeMo), or by
  ``name[ARGS]{...}`` (the tokenizers of 2025's models); the text before it is the message.

A recipe may name its own parser: a dotted path to a function ``(text) -> Parsed``
(``parser: my_package.parsers.mine``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lit_rag.tools.base import ToolCall, ToolResult


@dataclass
class Parsed:
    """One assistant turn, read.

    Args:
        content: The text outside the calls (stripped).
        calls: The calls in order; a call that could not be read is a ``malformed``
            :class:`ToolResult` in its place.
    """

    content: str
    calls: list[ToolCall | ToolResult] = field(default_factory=list)
    reasoning: str = ""
    #: a ``<think>`` block was opened and never closed (the turn ended while reasoning)
    unfinished: bool = False

    @property
    def malformed(self) -> int:
        return sum(isinstance(c, ToolResult) for c in self.calls)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
THINK, END_THINK = "<think>", "</think>"
#: the id Mistral's templates accept: nine letters or digits
_MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")


def split_reasoning(text: str) -> tuple[str, str, bool]:
    """``(reasoning, rest, unfinished)`` of a turn: the ``<think>`` block (its text without
    the tags) and the text after it; a block opened and never closed takes the rest of the
    turn (``unfinished``). A ``</think>`` without an opening tag closes reasoning that began in
    the prompt (Qwen3's generation prompt may open the block).

    Example:
        >>> split_reasoning("<think>\\nlook it up\\n</think>\\n\\nParis")
        ('look it up', 'Paris', False)
    """
    close = text.rfind(END_THINK)
    if close >= 0:
        head, rest = text[:close], text[close + len(END_THINK) :]
        return head.split(THINK)[-1].strip(), rest.strip(), False
    opened = text.find(THINK)
    if opened >= 0:
        return text[opened + len(THINK) :].strip(), text[:opened].strip(), True
    return "", text, False


def _call(obj: Any, arguments_key: str, index: int) -> ToolCall | ToolResult:
    """``{"name": str, <arguments_key>: object}`` as a call, else a malformed result naming
    what was wrong."""
    if not isinstance(obj, dict):
        return _malformed(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return _malformed('a tool call needs a "name" string')
    arguments = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return _malformed(f'the "{arguments_key}" of {name} are not valid JSON')
    if not isinstance(arguments, dict):
        return _malformed(f'the "{arguments_key}" of {name} must be a JSON object')
    given = obj.get("id")
    if isinstance(given, str) and _MISTRAL_ID.match(given):
        return ToolCall(name, arguments, id=given)  # the model's own id (Mistral NeMo writes one)
    return ToolCall(name, arguments, id=f"call_{index}")


def _malformed(why: str) -> ToolResult:
    return ToolResult(None, f"Error: malformed tool call: {why}", "malformed")


def _loads(text: str) -> tuple[Any, str]:
    """``(object, "")`` or ``(None, why)``; a deeply nested text is refused, not recursed."""
    try:
        return json.loads(text), ""
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos})"


def hermes(text: str) -> Parsed:
    """``<tool_call>{...}</tool_call>`` blocks after any reasoning block (an unclosed last
    block is read to the end); calls inside ``<think>`` are not calls.

    Example:
        >>> p = hermes('Let me look.<tool_call>{"name": "search", "arguments": {"query": "x"}}'
        ...            '</tool_call>')
        >>> p.content, p.calls[0].name, p.calls[0].arguments
        ('Let me look.', 'search', {'query': 'x'})
        >>> hermes('<think>maybe <tool_call>{"name": "search"}</tool_call></think>No.').calls
        []
    """
    try:
        reasoning, rest, unfinished = split_reasoning(text)
        calls: list[ToolCall | ToolResult] = []
        for index, match in enumerate(_HERMES.finditer(rest)):
            obj, why = _loads(match.group(1).strip())
            calls.append(_malformed(why) if why else _call(obj, "arguments", index))
        return Parsed(_HERMES.sub("", rest).strip(), calls, reasoning, unfinished)
    except Exception as exc:  # noqa: BLE001 (untrusted text never fails the rollout)
        return Parsed(text.strip(), [_malformed(f"unreadable ({type(exc).__name__})")])


def llama3(text: str) -> Parsed:
    """Llama 3's JSON calls: the turn (after an optional ``<|python_tag|>``) is one object
    with ``name`` and ``parameters``, or several joined by ``;``. A turn that does not start
    with ``{`` is a message; one that starts with ``{`` and does not parse is malformed.

    Example:
        >>> llama3('{"name": "search", "parameters": {"query": "x"}}').calls[0].arguments
        {'query': 'x'}
        >>> llama3("Paris.").calls
        []
    """
    try:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return Parsed(text.strip(), [])
        objects = _split_objects(body)
        if objects is None:
            obj, why = _loads(body)
            return Parsed("", [_malformed(why) if why else _call(obj, "parameters", 0)])
        return Parsed("", [_call(obj, "parameters", i) for i, obj in enumerate(objects)])
    except Exception as exc:  # noqa: BLE001 (untrusted text never fails the rollout)
        return Parsed(text.strip(), [_malformed(f"unreadable ({type(exc).__name__})")])


def _split_objects(body: str) -> list[Any] | None:
    """``{...}; {...}`` as objects, or None when the body is not a ``;``-joined list of them."""
    decoder = json.JSONDecoder()
    objects, at = [], 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except (ValueError, RecursionError):
            return None
        objects.append(obj)
        at = end
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return objects


MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


def mistral(text: str) -> Parsed:
    """Mistral's calls: ``[TOOL_CALLS]`` then a JSON list (or object) of calls with
    ``arguments``, or one or more ``[TOOL_CALLS]name[ARGS]{...}``; the text before the first
    ``[TOOL_CALLS]`` is the message. A model's own nine-character id is kept.

    Example:
        >>> mistral('[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}}]').calls[0].name
        'search'
        >>> mistral('[TOOL_CALLS]search[ARGS]{"query": "x"}').calls[0].arguments
        {'query': 'x'}
    """
    try:
        head, found, body = text.partition(MISTRAL_CALLS)
        if not found:
            return Parsed(text.strip(), [])
        body = body.strip()
        if body.startswith(("[", "{")):
            obj, why = _loads(body.removesuffix("</s>").strip())
            if why:
                return Parsed(head.strip(), [_malformed(why)])
            objects = obj if isinstance(obj, list) else [obj]
            return Parsed(head.strip(), [_call(o, "arguments", i) for i, o in enumerate(objects)])
        calls = []
        for index, part in enumerate(body.split(MISTRAL_CALLS)):
            name, has_args, arguments = part.partition(MISTRAL_ARGS)
            obj, why = _loads(arguments.strip()) if has_args else (None, "no [ARGS]")
            if why:
                calls.append(_malformed(f"{name.strip() or 'a call'}: {why}"))
            else:
                calls.append(_call({"name": name.strip(), "arguments": obj}, "arguments", index))
        return Parsed(head.strip(), calls)
    except Exception as exc:  # noqa: BLE001 (untrusted text never fails the rollout)
        return Parsed(text.strip(), [_malformed(f"unreadable ({type(exc).__name__})")])


#: parser name (recipes' ``parser``) -> function
PARSERS: dict[str, Callable[[str], Parsed]] = {
    "hermes": hermes,
    "llama3": llama3,
    "mistral": mistral,
}


def parser(name: str | Callable[[str], Parsed]) -> Callable[[str], Parsed]:
    """A parser by name (:data:`PARSERS`), a dotted path to a function, or the function."""
    if callable(name):
        return name
    if name in PARSERS:
        return PARSERS[name]
    if "." in name:
        import importlib

        module, _, attr = name.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except Exception as exc:  # noqa: BLE001 (one line naming the path)
            raise ValueError(
                f"environment parser {name!r} could not be imported: {type(exc).__name__}: {exc}"
            ) from exc
    raise ValueError(
        f"environment parser: got {name!r}; allowed: {', '.join(PARSERS)} or a dotted path to "
        "a function (text) -> Parsed"
    )
