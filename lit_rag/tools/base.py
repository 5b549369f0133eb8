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

What a call costs is kept to what it must:

- identical calls share one run: a call whose tool and arguments match one already running
  awaits that one's result (a GRPO group's eight samples of one question mostly search the
  same words first), and a finished success is kept in the cache (tools with
  ``cache_size: 0`` never share);
- a batched tool (one that defines :meth:`Tool.run_batch`, as ``search`` does: one retriever
  call for many queries) gets every call of the episodes that reached a tool turn together in
  one ``run_batch`` call;
- a sync tool runs on a worker thread of its own tool, started when none is idle: the timeout
  counts the call's own run time, never time queued behind other calls, and a call that hangs
  past it keeps its thread without taking one another call needs. A tool with
  ``max_concurrency`` calls still hung fails the next ones at once (``timeout``) rather than
  piling up threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import queue
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: ``ToolResult.error`` values: the call could not be parsed, named no tool the agent has,
#: had arguments its schema refuses, raised, ran past its timeout, or the tool's server is gone.
ERRORS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout", "server_died")
#: The ``ToolResult.error`` kinds that are the environment's fault rather than the policy's: a
#: tool too slow to answer, a server that went away. The call the model wrote was fine.
ENVIRONMENT_ERRORS = ("timeout", "server_died")
#: the kinds of :data:`ERRORS` that are the environment's fault, not the policy's: an episode
#: with one is failed by the environment and leaves the loss (``model.environment_failures``)
ENVIRONMENT_ERRORS = ("timeout", "server_died")


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
        timeout_s: A call that runs longer fails with ``timeout``: its own run time, never
            time queued behind other calls. The call is abandoned (a sync one keeps its thread
            until it returns: hung); with ``max_concurrency`` calls hung, the next ones fail
            at once.
        max_concurrency: At most this many calls of this tool run at once (a rate limit for a
            server the rollout would flood).
        cache_size: Results kept by ``(name, arguments)``, and identical calls made while one
            runs wait for its result; 0: neither (a tool whose result changes between calls).
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

    def run_batch(self, arguments: list[dict[str, Any]]) -> list[Any]:
        """Many calls at once, for a tool that is cheaper that way (a retriever searches many
        queries in one pass); optional. A tool that defines it is batched: the
        :class:`ToolBox` runs the calls of this tool that reach it together, every episode's,
        as one ``run_batch`` (sync, on a worker thread, or a coroutine function) under the
        tool's ``timeout_s``.

        Args:
            arguments: Each call's arguments, checked against :attr:`parameters`.

        Returns:
            One entry per call, in order: its result (as :meth:`run` returns it), or the
            exception that call failed with (a :class:`ToolError` for one the model reads).
        """
        raise NotImplementedError

    def is_batched(self) -> bool:
        """The tool defines :meth:`run_batch`."""
        return type(self).run_batch is not Tool.run_batch

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


class _Threads:
    """A sync tool's worker threads: an idle one takes the next call, a new one starts when
    none is idle. A call the loop gave up on (its timeout) is hung: its thread is busy until
    the function returns, and :attr:`hung` counts it meanwhile."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hung = 0  # read and written on the tools' loop only
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = self._count = 0

    def run(self, work: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Start ``work()`` on a worker thread now (never queued behind another call); its
        result or exception as a future of ``loop`` (cancel it to give up on the call)."""
        future = loop.create_future()
        future.add_done_callback(self._given_up)
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._count += 1
                name = f"lit-rag-tool-{self.name}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            self._jobs.put((work, future, loop))
        return future

    def _given_up(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self.hung += 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            work, future, loop = job
            value = error = None
            try:
                value = work()
            except BaseException as exc:  # noqa: BLE001 (handed to the call that waits)
                error = exc
            with self._lock:  # idle before the caller hears: its next call can come here
                self._idle += 1
            try:
                loop.call_soon_threadsafe(self._finish, future, value, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _finish(self, future: asyncio.Future, value: Any, error: BaseException | None) -> None:
        if future.cancelled():  # the call timed out: its thread is free again
            self.hung -= 1
        elif error is None:
            future.set_result(value)
        elif isinstance(error, Exception) and not isinstance(error, StopIteration):
            future.set_exception(error)
        else:  # what a future cannot carry (StopIteration, SystemExit): its text
            future.set_exception(RuntimeError(f"{type(error).__name__}: {error}"))

    def stop(self) -> None:
        """Each thread ends after its current call (a hung one once its call returns)."""
        with self._lock:
            for _ in range(self._count):
                self._jobs.put(None)
            self._count = self._idle = 0


@dataclass
class _State:
    """One tool's calls on the loop: its concurrency limit, its worker threads, its cache,
    and the calls running by arguments (for identical calls to share)."""

    semaphore: asyncio.Semaphore
    threads: _Threads
    cache: OrderedDict = field(default_factory=OrderedDict)
    running: dict[str, asyncio.Future] = field(default_factory=dict)


class ToolBox:
    """The agent's tools by name, and the loop their calls run on.

    Args:
        tools: The tools; two with one name are refused.
        batch: Run the calls of a batched tool (:meth:`Tool.run_batch`) that arrive together
            as one batch; False: one :meth:`Tool.run` per call.
        overlap: Whether an :class:`~lit_rag.contracts.episodes.EpisodeLoop` keeps generating
            other episodes' segments while these tools run (its ``overlap``); None: where the
            engine batches continuously.
    """

    def __init__(
        self, tools: Sequence[Tool], batch: bool = True, overlap: bool | None = None
    ) -> None:
        self.tools: dict[str, Tool] = {}
        self.add(tools)
        self.batch, self.overlap = batch, overlap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._states: dict[str, _State] = {}
        self._tasks: set[asyncio.Future] = set()

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
            if not tool.name:
                raise ValueError(f"a tool has no name: {tool!r}")
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must differ")
            self.tools[tool.name] = tool

    def call_all(self, calls: Sequence[ToolCall | ToolResult]) -> list[ToolResult]:
        """Run every call concurrently; a :class:`ToolResult` given in place of a call (a call
        that did not parse) is passed through. Results come in the calls' order."""
        return self.start([calls])[0].result()

    def start(
        self, groups: Sequence[Sequence[ToolCall | ToolResult]]
    ) -> list[concurrent.futures.Future]:
        """Start every group's calls together and return at once: one future per group (an
        episode's turn), done when all its calls are, with their results in order. A batched
        tool's calls of every group are one batch."""
        futures = [concurrent.futures.Future() for _ in groups]
        groups = [list(group) for group in groups]
        self.loop.call_soon_threadsafe(self._start, groups, futures)
        return futures

    def _start(self, groups: list[list], futures: list[concurrent.futures.Future]) -> None:
        try:
            parts = self._begin(groups)
        except BaseException as exc:  # a bug here must not leave the caller waiting
            for future in futures:
                future.set_exception(exc)
            raise
        for part, future in zip(parts, futures, strict=True):
            self._spawn(asyncio.gather(*part)).add_done_callback(
                functools.partial(_hand_over, future)
            )

    async def call(self, call: ToolCall) -> ToolResult:
        """One call, on the tools' loop: checked, limited, shared, cached, timed; never
        raises."""
        (part,) = self._begin([[call]])
        return await part[0]

    def _begin(self, groups: list[list]) -> list[list[Awaitable[ToolResult]]]:
        """Each call's result to await; calls that run are started (batched tools' last)."""
        batches: dict[str, list[tuple[ToolCall, str, asyncio.Future]]] = {}
        parts = [[self._begin_one(call, batches) for call in group] for group in groups]
        for name, items in batches.items():
            self._spawn(self._run_batch(self.tools[name], items))
        return parts

    def _begin_one(self, call: ToolCall | ToolResult, batches: dict) -> Awaitable[ToolResult]:
        """``call``'s result to await: at once when it is refused or cached, that of the
        identical call already running, else of its own run (started, or added to its
        tool's batch)."""
        if isinstance(call, ToolResult):
            return _now(call)
        tool = self.tools.get(call.name)
        refused = self._refused(tool, call)
        if refused is not None:
            return _now(refused)
        state = self._state(tool)
        key = json.dumps(call.arguments, sort_keys=True, default=str)
        if tool.cache_size and key in state.cache:
            state.cache.move_to_end(key)
            return _now(ToolResult(call, state.cache[key], cached=True))
        if tool.cache_size and key in state.running:
            return _shared(state.running[key], call)
        result = asyncio.get_running_loop().create_future()
        if tool.cache_size:
            state.running[key] = result
        if self.batch and tool.is_batched():
            batches.setdefault(tool.name, []).append((call, key, result))
        else:
            self._spawn(self._run_one(tool, call, key, result))
        return _shared(result)

    def _refused(self, tool: Tool | None, call: ToolCall) -> ToolResult | None:
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
        return None

    def _state(self, tool: Tool) -> _State:
        state = self._states.get(tool.name)
        if state is None:
            semaphore = asyncio.Semaphore(tool.max_concurrency)
            state = self._states[tool.name] = _State(semaphore, _Threads(tool.name))
        return state

    def _spawn(self, awaitable: Awaitable) -> asyncio.Future:
        """A task on the loop, kept referenced until it is done."""
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run_one(self, tool: Tool, call: ToolCall, key: str, out: asyncio.Future) -> None:
        """Run one call within its tool's limit; its result goes to ``out`` (and the cache)."""
        state = self._state(tool)
        results = [ToolResult(call, f"Error: {tool.name} was cancelled", "tool_error")]
        try:
            async with state.semaphore:
                started = asyncio.get_running_loop().time()
                results = [_hung(tool, state, call) or await self._run(tool, state, call)]
                results[0].seconds = asyncio.get_running_loop().time() - started
        finally:
            self._settle(tool, state, [(call, key, out)], results)

    async def _run_batch(self, tool: Tool, items: list[tuple[ToolCall, str, asyncio.Future]]):
        """Run a batched tool's calls as one :meth:`Tool.run_batch` within its limit."""
        state = self._state(tool)
        calls = [call for call, _, _ in items]
        results = [ToolResult(c, f"Error: {tool.name} was cancelled", "tool_error") for c in calls]
        try:
            async with state.semaphore:
                started = asyncio.get_running_loop().time()
                refused = _hung(tool, state, None)
                if refused is not None:
                    results = [replace(refused, call=call) for call in calls]
                else:
                    results = await self._run_many(tool, state, calls)
                for result in results:
                    result.seconds = asyncio.get_running_loop().time() - started
        finally:
            self._settle(tool, state, items, results)

    @staticmethod
    def _settle(tool: Tool, state: _State, items: list, results: list[ToolResult]) -> None:
        """Hand each result to its call's future; keep the successes in the cache."""
        for (_, key, out), result in zip(items, results, strict=True):
            if state.running.get(key) is out:
                del state.running[key]
            if not result.error and tool.cache_size:
                state.cache[key] = result.text
                while len(state.cache) > tool.cache_size:
                    state.cache.popitem(last=False)
            if not out.done():
                out.set_result(result)

    async def _run(self, tool: Tool, state: _State, call: ToolCall) -> ToolResult:
        if tool.is_async():
            work = tool.run(**call.arguments)
        else:
            loop = asyncio.get_running_loop()
            work = state.threads.run(functools.partial(tool.run, **call.arguments), loop)
        try:
            value = await asyncio.wait_for(work, tool.timeout_s)
        except asyncio.TimeoutError:
            return _timed_out(tool, call)
        except Exception as exc:  # noqa: BLE001 (a tool's failure is the model's to read)
            return _failed(tool, call, exc)
        return ToolResult(call, as_text(value))

    async def _run_many(self, tool: Tool, state: _State, calls: list[ToolCall]) -> list:
        arguments = [call.arguments for call in calls]
        if inspect.iscoroutinefunction(tool.run_batch):
            work = tool.run_batch(arguments)
        else:
            loop = asyncio.get_running_loop()
            work = state.threads.run(functools.partial(tool.run_batch, arguments), loop)
        try:
            values = await asyncio.wait_for(work, tool.timeout_s)
            if not isinstance(values, list | tuple) or len(values) != len(calls):
                got = len(values) if isinstance(values, list | tuple) else type(values).__name__
                raise ToolError(f"run_batch gave {got} results for {len(calls)} calls")
        except asyncio.TimeoutError:
            return [_timed_out(tool, call) for call in calls]
        except Exception as exc:  # noqa: BLE001 (every call of the batch failed with it)
            return [_failed(tool, call, exc) for call in calls]
        return [
            _failed(tool, call, value)
            if isinstance(value, BaseException)
            else ToolResult(call, as_text(value))
            for call, value in zip(calls, values, strict=True)
        ]

    def close(self) -> None:
        """Close every tool, then stop the loop and the tools' worker threads."""
        for tool in self.tools.values():
            tool.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()
            self._loop = self._thread = None
        for state in self._states.values():
            state.threads.stop()
        self._states, self._tasks = {}, set()


async def _now(result: ToolResult) -> ToolResult:
    return result


async def _shared(running: asyncio.Future, follower: ToolCall | None = None) -> ToolResult:
    """The result of a running call; for ``follower``, an identical call that waited for it,
    the same result as its own (``cached``: it did not run)."""
    result = await asyncio.shield(running)
    if follower is None:
        return result
    return replace(result, call=follower, cached=True, seconds=0.0)


def _hand_over(future: concurrent.futures.Future, gathered: asyncio.Future) -> None:
    """A group's gathered results (or what stopped them) to the caller's future."""
    if future.done():
        return
    if gathered.cancelled():
        future.set_exception(RuntimeError("the tool calls were cancelled (the tools closed)"))
    elif gathered.exception() is not None:
        future.set_exception(gathered.exception())
    else:
        future.set_result(list(gathered.result()))


def _hung(tool: Tool, state: _State, call: ToolCall | None) -> ToolResult | None:
    """A ``timeout`` at once when ``max_concurrency`` calls of ``tool`` still hang."""
    if state.threads.hung < tool.max_concurrency:
        return None
    return ToolResult(
        call,
        f"Error: {tool.name} timed out: {state.threads.hung} calls are still hung past its "
        f"{tool.timeout_s:g} s timeout",
        "timeout",
    )


def _timed_out(tool: Tool, call: ToolCall) -> ToolResult:
    return ToolResult(call, f"Error: {tool.name} timed out after {tool.timeout_s:g} s", "timeout")


def _failed(tool: Tool, call: ToolCall, exc: BaseException) -> ToolResult:
    """What the model reads of a call that raised: a dead server, else the tool's message."""
    if isinstance(exc, ServerDied):
        return ToolResult(call, f"Error: {tool.name} is unavailable: {exc}", "server_died")
    message = str(exc) or type(exc).__name__
    return ToolResult(call, f"Error: {tool.name} failed: {message}", "tool_error")


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
