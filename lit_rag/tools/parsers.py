"""Tool calls in a model's text, per chat-template family; untrusted text: never raises or evals.

A parser takes one assistant turn's text and gives :class:`Parsed`: the text outside the calls,
the calls, and one :class:`~lit_rag.tools.base.ToolResult` (``malformed``) per call it could not
read, so the model is told what was wrong in the tool turn instead of the call vanishing.

- ``hermes``: Hermes, Qwen2.5 / Qwen3 and the templates derived from them: each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (verl's and vLLM's ``hermes``
  tool parser read the same form).
- ``llama3``: Llama 3.1-3.3's JSON tool calling (the "JSON based tool calling" of Meta's model
  card): the turn is a JSON object ``{"name": ..., "parameters": {...}}``, or several separated
  by ``;``; text that is not such an object is a plain message, not a malformed call.

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

    @property
    def malformed(self) -> int:
        return sum(isinstance(c, ToolResult) for c in self.calls)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


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
    """``<tool_call>{...}</tool_call>`` blocks (an unclosed last block is read to the end).

    Example:
        >>> p = hermes('Let me look.<tool_call>{"name": "search", "arguments": {"query": "x"}}'
        ...            '</tool_call>')
        >>> p.content, p.calls[0].name, p.calls[0].arguments
        ('Let me look.', 'search', {'query': 'x'})
    """
    try:
        calls: list[ToolCall | ToolResult] = []
        for index, match in enumerate(_HERMES.finditer(text)):
            obj, why = _loads(match.group(1).strip())
            calls.append(_malformed(why) if why else _call(obj, "arguments", index))
        return Parsed(_HERMES.sub("", text).strip(), calls)
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


#: parser name (recipes' ``parser``) -> function
PARSERS: dict[str, Callable[[str], Parsed]] = {"hermes": hermes, "llama3": llama3}


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
