"""Tools an agent calls (docs/agents-with-tools.md): a schema the chat template shows the model,
and a call that never raises into the rollout.

A tool is a :class:`Tool`: a name, a description and a JSON schema of its arguments (what
``tokenizer.apply_chat_template(messages, tools=[...])`` renders), and :meth:`Tool.run`, sync or
async. A typed Python function with a Google-style docstring is one through
:class:`FunctionTool`: its schema is transformers' ``get_json_schema`` of the function, as the
chat templates of Qwen, Llama and Hermes models expect it.

Every call goes through :class:`ToolBox`, which owns what the agent loops of verl
(``verl/tools``), TRL (``tools=``) and SkyRL leave to each tool: arguments checked against the
schema (``jsonschema``), a timeout, a concurrency limit per tool, a result cache, and every
failure turned into a :class:`ToolResult` whose ``error`` names the kind
(:data:`ERRORS`): the model reads the message, the run counts the signal, the rollout goes on.
Calls run on one event loop in a background thread, so the calls of one turn (and of every
episode that reached a tool turn together) run concurrently, and long-lived clients (an MCP
session) stay bound to the loop they were opened on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: ``ToolResult.error`` values: the call could not be parsed, named no tool the agent has,
#: had arguments its schema refuses, raised, ran past its timeout, or the tool's server is gone.
ERRORS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout", "server_died")


class ToolError(Exception):
    """A tool's own failure, shown to the model as the call's result (``tool_error``)."""


class ServerDied(ToolError):
    """The process or server behind a tool is gone (``server_died``): the episode fails."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class ToolResult:
    """What a call gave back: the text the model reads, and the failure's kind if it failed.

    Args:
        call: The call (None for text that parsed as no call).
        text: The tool message's content.
        error: One of :data:`ERRORS`, or "" for a success.
        cached: The result came from the cache.
        seconds: Wall time of the call (0 when cached or refused before it ran).
    """

    call: ToolCall | None
    text: str
    error: str = ""
    cached: bool = False
    seconds: float = 0.0


class Tool:
    """A tool: its schema and :meth:`run`.

    Args:
        timeout_s: A call that runs longer fails with ``timeout`` (the call is abandoned).
        max_concurrency: At most this many calls of this tool run at once (a rate limit for a
            server the rollout would flood).
        cache_size: Results kept by ``(name, arguments)``; 0: no cache (a tool whose result
            changes between calls).
    """

    name: str = ""
    description: str = ""
    #: JSON schema of the arguments (``{"type": "object", "properties": ..., "required": ...}``)
    parameters: dict = {"type": "object", "properties": {}}  # noqa: RUF012 (read only)
    #: A successful call of this tool ends the episode (the ``answer`` tool).
    final: bool = False

    def __init__(self, timeout_s: float = 30.0, max_concurrency: int = 8, cache_size: int = 1024):
        if timeout_s <= 0 or max_concurrency < 1 or cache_size < 0:
            raise ValueError(
                f"tool {self.name}: timeout_s must be > 0, max_concurrency >= 1 and cache_size "
                f">= 0; got {timeout_s}, {max_concurrency}, {cache_size}"
            )
        self.timeout_s, self.max_concurrency, self.cache_size = (
            timeout_s,
            max_concurrency,
            cache_size,
        )

    def schema(self) -> dict:
        """The OpenAI function schema the chat template renders."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def run(self, **arguments: Any) -> Any:
        """The call; a coroutine function or a plain one (run in a worker thread). Its result
        becomes text (:func:`as_text`); raise :class:`ToolError` for a failure the model should
        read."""
        raise NotImplementedError

    def is_async(self) -> bool:
        """:meth:`run` returns a coroutine (it runs on the tools' loop, not in a thread)."""
        return inspect.iscoroutinefunction(self.run)

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the tool holds (a connection, a process)."""


class FunctionTool(Tool):
    """A typed, documented Python function as a tool.

    The schema is transformers' ``get_json_schema(function)``: the name is the function's, the
    description its docstring's first paragraph, each argument's type from its annotation and
    its description from the ``Args:`` section. A function without them is refused at once with
    transformers' own message.

    Example:
        >>> def add(a: int, b: int) -> int:
        ...     '''Add two numbers.
        ...
        ...     Args:
        ...         a: The first.
        ...         b: The second.
        ...     '''
        ...     return a + b
        >>> FunctionTool(add).parameters.get("required")
        ['a', 'b']
    """

    def __init__(self, function: Callable, name: str | None = None, **settings: Any) -> None:
        from transformers.utils import get_json_schema

        schema = get_json_schema(function)["function"]
        self.function = function
        self.name = name or schema["name"]
        self.description = schema.get("description", "")
        self.parameters = schema["parameters"]
        super().__init__(**settings)

    def run(self, **arguments: Any) -> Any:
        return self.function(**arguments)

    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def as_text(value: Any) -> str:
    """A tool's return value as the tool message's text: a string as it is, anything else as
    JSON (``default=str`` for what JSON has no type for)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def check_arguments(tool: Tool, arguments: Any) -> str:
    """Why ``arguments`` do not fit ``tool``'s schema ("" when they do), in one line the model
    can act on. An argument the schema does not name is refused unless the schema allows
    ``additionalProperties`` (a function would raise on it)."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    import jsonschema

    known = tool.parameters.get("properties", {})
    if tool.parameters.get("additionalProperties", False) is False and known is not None:
        extra = [key for key in arguments if key not in known]
        if extra:  # a function would raise on them: say so the model can mend the call
            return f"unexpected argument {extra[0]!r}; arguments: {', '.join(known) or 'none'}"
    try:
        jsonschema.validate(arguments, tool.parameters)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        return f"{where + ': ' if where else ''}{exc.message}"
    except jsonschema.SchemaError as exc:  # the tool's own schema is broken: say so
        return f"the tool's schema is invalid: {exc.message}"
    return ""


@dataclass
class _Limits:
    semaphore: asyncio.Semaphore
    cache: OrderedDict = field(default_factory=OrderedDict)


class ToolBox:
    """The agent's tools by name, and the loop their calls run on.

    Args:
        tools: The tools; two with one name are refused.
    """

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if not tool.name:
                raise ValueError(f"a tool has no name: {tool!r}")
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must differ")
            self.tools[tool.name] = tool
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._limits: dict[str, _Limits] = {}

    def schemas(self) -> list[dict]:
        """Every tool's schema, in order (the chat template's ``tools``)."""
        return [tool.schema() for tool in self.tools.values()]

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The background event loop (started on first use)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="lit-rag-tools", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def submit(self, coroutine) -> Any:
        """Run ``coroutine`` on the tools' loop and wait for its result (from any thread but
        the loop's own)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def add(self, tools: Sequence[Tool]) -> None:
        """More tools (an MCP server's, once listed); a taken name is refused."""
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must differ")
            self.tools[tool.name] = tool

    def call_all(self, calls: Sequence[ToolCall | ToolResult]) -> list[ToolResult]:
        """Run every call concurrently; a :class:`ToolResult` given in place of a call (a call
        that did not parse) is passed through. Results come in the calls' order."""
        return self.submit(self._call_all(list(calls)))

    async def _call_all(self, calls: list[ToolCall | ToolResult]) -> list[ToolResult]:
        async def one(call: ToolCall | ToolResult) -> ToolResult:
            return call if isinstance(call, ToolResult) else await self.call(call)

        return list(await asyncio.gather(*(one(c) for c in calls)))

    async def call(self, call: ToolCall) -> ToolResult:
        """One call, on the tools' loop: checked, limited, cached, timed; never raises."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolResult(
                call, f"Error: unknown tool {call.name!r}; tools: {known}", "unknown_tool"
            )
        problem = check_arguments(tool, call.arguments)
        if problem:
            return ToolResult(
                call, f"Error: bad arguments for {tool.name}: {problem}", "bad_arguments"
            )
        limits = self._limits.get(tool.name)
        if limits is None:
            limits = self._limits[tool.name] = _Limits(asyncio.Semaphore(tool.max_concurrency))
        key = json.dumps(call.arguments, sort_keys=True, default=str)
        if tool.cache_size and key in limits.cache:
            limits.cache.move_to_end(key)
            return ToolResult(call, limits.cache[key], cached=True)
        loop = asyncio.get_running_loop()
        async with limits.semaphore:
            started = loop.time()
            result = await self._run(tool, call)
            result.seconds = loop.time() - started
        if not result.error and tool.cache_size:
            limits.cache[key] = result.text
            while len(limits.cache) > tool.cache_size:
                limits.cache.popitem(last=False)
        return result

    @staticmethod
    async def _run(tool: Tool, call: ToolCall) -> ToolResult:
        if tool.is_async():
            work = tool.run(**call.arguments)
        else:
            work = asyncio.to_thread(tool.run, **call.arguments)
        try:
            value = await asyncio.wait_for(work, tool.timeout_s)
        except asyncio.TimeoutError:
            return ToolResult(
                call, f"Error: {tool.name} timed out after {tool.timeout_s:g} s", "timeout"
            )
        except ServerDied as exc:
            return ToolResult(call, f"Error: {tool.name} is unavailable: {exc}", "server_died")
        except Exception as exc:  # noqa: BLE001 (a tool's failure is the model's to read)
            message = str(exc) or type(exc).__name__
            return ToolResult(call, f"Error: {tool.name} failed: {message}", "tool_error")
        return ToolResult(call, as_text(value))

    def close(self) -> None:
        """Close every tool, then stop the loop."""
        for tool in self.tools.values():
            tool.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()
            self._loop = self._thread = None


def build_tools(specs: Sequence[str | dict], **context: Any) -> list[Tool]:
    """The tools a recipe lists: each a registered name or a dotted path (``"search"``,
    ``"my_pkg.tools.lookup"``), or ``{"name": ..., "init_args": {...}}``.

    A registered :class:`Tool` subclass is built with its ``init_args`` plus what it asks for
    by name from ``context`` (the environment's ``retriever``; ``search``, the agent's search
    tool, for ``fetch``); a function becomes a :class:`FunctionTool` (its ``init_args`` are the
    tool settings: ``timeout_s``, ``max_concurrency``, ``cache_size``, ``name``).

    Raises:
        ValueError: A spec of another shape, or a registered object that is neither (one line).
    """
    from lit_rag import registry

    built: list[Tool] = []
    for spec in specs:
        if isinstance(spec, str):
            name, init_args = spec, {}
        elif isinstance(spec, dict) and isinstance(spec.get("name"), str):
            name, init_args = spec["name"], dict(spec.get("init_args") or {})
        else:
            raise ValueError(
                f"environment tools: got {spec!r}; each tool is a name or "
                "{name: NAME, init_args: {...}}"
            )
        target = registry.resolve("tool", name)
        if isinstance(target, type) and issubclass(target, Tool):
            accepted = inspect.signature(target.__init__).parameters
            for key, value in context.items():
                if key in accepted and key not in init_args and value is not None:
                    init_args[key] = value
            tool = target(**init_args)
        elif callable(target) and not isinstance(target, type):
            tool = FunctionTool(target, **init_args)
        else:
            raise ValueError(
                f"environment tools: {name!r} is {target!r}; a tool is a Tool subclass or a "
                "typed, documented function"
            )
        if tool.name == "search":
            context = {**context, "search": tool}
        built.append(tool)
    return built
