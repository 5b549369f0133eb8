"""A `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment (0.4.0,
``verifiers.v1``) as lit-rag data, tools and reward, sampled by lit-rag's own engine.

verifiers' environment is a taskset package: an installed package (``vf-corpus-env`` imports
as ``vf_corpus_env``) exporting a :class:`verifiers.v1.Taskset` subclass through ``__all__``;
``vf.load_environment(vf.resolve_env_config({"taskset": {"id": ID, **args}}))`` builds it
(``args`` are its taskset config's fields). What lit-rag takes from it:

- the tasks: iterating the taskset gives :class:`verifiers.v1.Task` objects whose ``data``
  (:class:`verifiers.v1.TaskData`) holds ``prompt`` (a string or messages), ``system_prompt``
  and the env's own fields (an answer, info); each becomes an :class:`~lit_rag.types.Example`
  with the task's data (JSON) and its first messages in ``meta``;
- the tools: ``Taskset.toolsets(config)`` (one server for every task) and
  ``Task.toolsets(config.task)`` (one per rollout in verifiers) are :class:`verifiers.v1.Toolset`
  objects, MCP servers whose ``@vf.tool`` methods are the tools. verifiers runs each in a
  subprocess and reaches it over HTTP; here the toolset registers its tools on an in-process
  ``MCPServer`` (the ``mcp`` package's, the one verifiers serves) and calls go through that
  server's ``call_tool``: the same schemas (named ``<server>_<tool>`` as verifiers' harnesses
  name them, bare for a toolset with ``TOOL_PREFIX = None``) and the same argument checks, no
  process, no port;
- the scoring: the task's ``@vf.reward`` methods and the rewards plugged through
  ``config.task.rewards`` (:meth:`verifiers.v1.Task.hooks`), weighted as they say, and its
  judges, each called on a :class:`verifiers.v1.Trace` built from the finished conversation
  (a chain of message nodes, the assistant ones ``sampled``) as verifiers' ``Task.score`` calls
  them, one function at a time so that one that raises costs only its own score.

Not reused: verifiers' rollout (its harness programs and model client: lit-rag samples the
tokens), per-rollout tool servers (a task-scoped toolset serves every episode from one
instance and its ``setup_task`` is not called), the state channel of stateful toolsets (a call
sees a fresh state), and rewards that need the rollout's runtime (a sandbox): they are skipped,
said once.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_rag.errors import InputError
from lit_rag.tools.base import Tool, ToolCall, ToolError, ToolResult
from lit_rag.types import Example

#: ``data.train: verifiers:<env-id>`` names a verifiers environment's tasks as a data source.
SOURCE_PREFIX = "verifiers:"

#: Keys of ``Example.meta`` for a verifiers task.
META_ENV = "verifiers_env"
META_ARGS = "verifiers_env_args"
META_KEY = "verifiers_key"
META_TASK = "verifiers_task"
META_MESSAGES = "verifiers_messages"
#: Key of ``Trajectory.meta`` for the conversation as OpenAI-style messages (structured
#: ``tool_calls``), which the environment writes and the rubric scores.
META_CONVERSATION = "verifiers_conversation"

_LOADED: dict[str, VerifiersEnv] = {}
_LOCK = threading.Lock()


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise InputError(
            f"verifiers environments need the verifiers package (pip install 'verifiers>=0.4'): "
            f"{exc}"
        ) from None
    return vf


def _args_key(environment: str, env_args: Mapping | None) -> str:
    return f"{environment}|{json.dumps(dict(env_args or {}), sort_keys=True, default=str)}"


def _text(content: Any) -> str:
    """A message's content as text (typed parts or OpenAI dict parts; images dropped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            if part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        elif getattr(part, "type", None) == "text":
            parts.append(part.text)
    return "\n".join(parts)


class _Server:
    """One toolset's tools on an in-process MCP server, set up once on the tools' loop."""

    def __init__(self, toolset: Any) -> None:
        from mcp.server.mcpserver import MCPServer

        self.toolset = toolset
        self.mcp = MCPServer(toolset.server_name or type(toolset).__name__)
        toolset.register(self.mcp)
        self._ready: asyncio.Future | None = None

    def listed(self) -> list[Any]:
        return _await(self.mcp.list_tools())

    async def ready(self) -> None:
        if self._ready is None:
            self._ready = asyncio.ensure_future(self.toolset.setup())
        await asyncio.shield(self._ready)


class VerifiersTool(Tool):
    """One tool of a verifiers toolset, called on its in-process MCP server.

    Args:
        server: The toolset's server.
        listed: The tool as the server lists it (name, description, input schema).
        name: The name the model sees (``<server>_<tool>``, or bare).
        settings: :class:`~lit_rag.tools.Tool`'s (timeout, concurrency, cache).
    """

    def __init__(self, server: _Server, listed: Any, name: str, **settings: Any) -> None:
        self.server, self.raw = server, listed.name
        self.name = name
        self.description = listed.description or ""
        self.parameters = dict(listed.input_schema or {"type": "object", "properties": {}})
        super().__init__(**settings)

    async def run(self, **arguments: Any) -> str:
        await self.server.ready()
        result = await self.server.mcp.call_tool(self.raw, arguments)
        text = _mcp_text(getattr(result, "content", None) or [])
        if getattr(result, "is_error", False) or getattr(result, "isError", False):
            raise ToolError(text or "the tool failed")
        return text


def _mcp_text(blocks: Sequence[Any]) -> str:
    """MCP content blocks as the tool message's text (verifiers' own conversion, images as
    their description)."""
    parts = []
    for block in blocks:
        parts.append(block.text if getattr(block, "type", None) == "text" else str(block))
    return "\n".join(parts)


def _await(coroutine) -> Any:
    """Run ``coroutine`` to its end from sync code, in a thread when a loop is running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
            box["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class Scores:
    """One conversation's scores: reward name -> score (unweighted) and weight, and what
    failed (name -> ``Type: message``)."""

    scores: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.weights.get(k, 1.0) * v for k, v in self.scores.items())


class VerifiersEnv:
    """A loaded verifiers environment (module doc): its tasks, tools and scoring.

    Args:
        environment: The environment's id (its package: ``vf-corpus-env``, ``owner/name``).
        env_args: Its taskset config's fields (``{"num_tasks": 8}``; ``task: {...}`` for the
            task config, e.g. plugged ``rewards``).

    Raises:
        InputError: verifiers is missing, or the environment does not load (one line).
    """

    #: ``Example.meta`` / ``Trajectory.meta`` keys (module constants)
    SOURCE_PREFIX = SOURCE_PREFIX
    META_ENV, META_ARGS, META_KEY, META_TASK = META_ENV, META_ARGS, META_KEY, META_TASK
    META_MESSAGES, META_CONVERSATION = META_MESSAGES, META_CONVERSATION

    def __init__(self, environment: str, env_args: Mapping | None = None) -> None:
        vf = _vf()
        self.environment, self.env_args = environment, dict(env_args or {})
        try:
            config = vf.resolve_env_config({"taskset": {**self.env_args, "id": environment}})
            self.env = vf.load_environment(config)
        except (ImportError, TypeError, ValueError, AttributeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(
                f"verifiers environment {environment!r} does not load: {message}"
            ) from None
        self.taskset = self.env.taskset
        self.task_cls = type(self.taskset).task_type()
        self._tasks: dict[str, Any] = {}
        self._skipped_warned: set[str] = set()

    @classmethod
    def load(cls, environment: str, env_args: Mapping | None = None) -> VerifiersEnv:
        """The environment, loaded once per process for each ``(environment, env_args)``."""
        key = _args_key(environment, env_args)
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = cls(environment, env_args)
            return _LOADED[key]

    # ---- tasks ---------------------------------------------------------------------------
    def tasks(self, limit: int | None = None) -> list[Any]:
        """The taskset's tasks in order (the first ``limit``)."""
        view = self.taskset if limit is None else self.taskset.take(limit)
        if not view.bounded:
            raise InputError(
                f"verifiers environment {self.environment!r} has an infinite taskset; give a "
                "number of examples (data.num_train)"
            )
        tasks = list(view)
        for task in tasks:
            self._tasks[task.key] = task
        return tasks

    def prompt_messages(self, task: Any) -> list[dict[str, Any]]:
        """The task's first messages as verifiers' rollout writes them: the system prompt,
        then the prompt (a string is one user message), OpenAI-style, content as text."""
        data = task.data
        messages: list[dict[str, Any]] = []
        if data.system_prompt is not None:
            messages.append({"role": "system", "content": data.system_prompt})
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            for message in data.prompt or []:
                row = message.model_dump(mode="json", exclude_none=True)
                row["content"] = _text(getattr(message, "content", None))
                messages.append(row)
        return messages

    def example(self, task: Any) -> Example:
        """One task as an example: its prompt's text as the question, its ``answer`` /
        ``answers`` field (if any) as the answers, its data and first messages in ``meta``."""
        data = task.data
        extra = data.model_dump(mode="json", exclude_defaults=True)
        answers = extra.get("answers", extra.get("answer", []))
        answers = [str(a) for a in (answers if isinstance(answers, list) else [answers])]
        return Example(
            id=str(data.id if data.id is not None else f"{self.environment}-{data.idx}"),
            question=data.prompt_text,
            answers=answers,
            meta={
                META_ENV: self.environment,
                META_ARGS: dict(self.env_args),
                META_KEY: task.key,
                META_TASK: extra,
                META_MESSAGES: self.prompt_messages(task),
            },
        )

    def examples(self, limit: int | None = None) -> list[Example]:
        """Every task (the first ``limit``) as an :meth:`example`."""
        return [self.example(task) for task in self.tasks(limit)]

    def task_for(self, example: Example) -> Any:
        """The task an example came from (rebuilt from its data when this process did not
        load it)."""
        key = example.meta.get(META_KEY)
        if key in self._tasks:
            return self._tasks[key]
        if META_TASK not in example.meta:
            raise InputError(
                f"example {example.id!r} is not a verifiers task (no meta[{META_TASK!r}]); train "
                f"on data.train: {SOURCE_PREFIX}{self.environment}"
            )
        data = self.task_cls.data_type().model_validate(example.meta[META_TASK])
        task = self.task_cls(data, self.taskset.config.task)
        self._tasks[task.key] = task
        return task

    # ---- tools ---------------------------------------------------------------------------
    def tools(self, **settings: Any) -> list[VerifiersTool]:
        """The environment's tools (the taskset's toolsets, then the task type's), each a
        :class:`VerifiersTool` with ``settings`` (timeout, concurrency, cache)."""
        toolsets = list(type(self.taskset).toolsets(self.taskset.config)) + list(
            self.task_cls.toolsets(self.taskset.config.task)
        )
        tools: list[VerifiersTool] = []
        for toolset in toolsets:
            server = _Server(toolset)
            prefix = toolset.server_name
            for listed in server.listed():
                name = f"{prefix}_{listed.name}" if prefix else listed.name
                tools.append(VerifiersTool(server, listed, name, **settings))
        return tools

    # ---- scoring -------------------------------------------------------------------------
    def trace(self, task: Any, messages: Sequence[Mapping[str, Any]]) -> Any:
        """A finished verifiers trace of ``messages`` (OpenAI-style; assistant ``tool_calls``
        with JSON-string or object arguments): one node per message, each the previous one's
        child, the assistant ones ``sampled``."""
        vf = _vf()
        from pydantic import TypeAdapter
        from verifiers.v1.trace import AgentInfo, TraceTask

        adapter = TypeAdapter(vf.Message)
        nodes = []
        for i, message in enumerate(messages):
            row = dict(message)
            if row.get("role") == "assistant" and row.get("tool_calls"):
                row["tool_calls"] = [
                    {
                        "id": str(c.get("id") or f"call_{i}_{j}"),
                        "name": str(c.get("name") or c.get("function", {}).get("name", "")),
                        "arguments": _arguments(
                            c["arguments"] if "arguments" in c else c.get("function", {})
                        ),
                    }
                    for j, c in enumerate(row["tool_calls"])
                ]
            if row.get("role") == "tool":
                row["tool_call_id"] = str(row.get("tool_call_id") or f"call_{i}")
            nodes.append(
                vf.MessageNode(
                    parent=i - 1 if i else None,
                    message=adapter.validate_python(row),
                    sampled=row.get("role") == "assistant",
                )
            )
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=nodes,
            is_completed=True,
            ok=True,
            stop_condition="agent_completed",
        )
        return trace

    def scorers(self, task: Any) -> list[tuple[str, Callable, float]]:
        """The task's rewards and judges as ``(name, function, weight)``, in verifiers'
        order; those that need the rollout's runtime are left out (said once)."""

        def needs_runtime(fn: Callable) -> bool:
            param = inspect.signature(fn).parameters.get("runtime")
            return param is not None and param.default is inspect.Parameter.empty

        found = [
            (fn.__name__, fn, float(getattr(fn, "_vf_weight", 1.0))) for fn in task.hooks("reward")
        ]
        found += [
            (judge.reward_name, judge.score, float(judge.config.weight))
            for judge in task.plugged_judges()
        ]
        kept = []
        for name, fn, weight in found:
            if needs_runtime(fn):
                if name not in self._skipped_warned:
                    self._skipped_warned.add(name)
                    print(
                        f"verifiers environment {self.environment}: reward {name!r} needs the "
                        "rollout's runtime (a sandbox) and is skipped",
                        file=sys.stderr,
                    )
                continue
            kept.append((name, fn, weight))
        return kept

    async def _score(self, task: Any, messages: Sequence[Mapping[str, Any]]) -> Scores:
        from verifiers.v1.utils.decorators import invoke

        out = Scores()
        try:
            trace = self.trace(task, messages)
        except Exception as exc:  # noqa: BLE001 (model text never fails the step)
            out.errors["trace"] = f"{type(exc).__name__}: {exc}"
            for name, _, weight in self.scorers(task):
                out.scores[name], out.weights[name] = 0.0, weight
            return out
        available = {"task": task.data, "trace": trace}
        for name, fn, weight in self.scorers(task):
            try:
                value = invoke(fn, available)
                if inspect.isawaitable(value):
                    value = await value
                items = value.items() if isinstance(value, Mapping) else [(name, value)]
                for key, score in items:
                    score = float(score)
                    if score != score or score in (float("inf"), float("-inf")):
                        raise ValueError(f"{key} is not a finite number: {score}")
                    out.scores[key], out.weights[key] = score, weight
            except Exception as exc:  # noqa: BLE001 (a reward's failure is a 0, counted)
                out.scores[name], out.weights[name] = 0.0, weight
                out.errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return out

    def score_conversations(
        self, items: Sequence[tuple[Any, Sequence[Mapping[str, Any]]]]
    ) -> list[Scores]:
        """Score each ``(task, messages)`` (concurrently; never raises on model text)."""

        async def every() -> list[Scores]:
            return list(await asyncio.gather(*(self._score(t, m) for t, m in items)))

        return _await(every()) if items else []


def _arguments(value: Any) -> str:
    if isinstance(value, Mapping) and "arguments" in value:
        value = value["arguments"]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _following_ids(messages: Sequence[Mapping[str, Any]], at: int) -> list[str]:
    """The ``tool_call_id`` of each tool message right after message ``at`` ("" for none)."""
    ids = []
    for message in messages[at + 1 :]:
        if message.get("role") != "tool":
            break
        ids.append(str(message.get("tool_call_id") or ""))
    return [i for i in ids if i] if all(ids) else []


def conversation(
    messages: Sequence[Mapping[str, Any]], parse: Callable[[str], Any]
) -> list[dict[str, Any]]:
    """lit-rag's tool-agent conversation (assistant messages are the sampled text, calls in
    it) as OpenAI-style messages: each assistant message's calls read by ``parse`` into
    ``tool_calls`` (a call that did not parse is named ``invalid``), each tool message tied to
    its call by ``tool_call_id``, in order."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            parsed = parse(str(message.get("content") or ""))
            given = _following_ids(messages, i)  # the ids the agent gave its results
            calls = []
            for j, call in enumerate(parsed.calls):
                if isinstance(call, ToolResult):
                    call = call.call or ToolCall("invalid", {})
                calls.append(
                    {
                        "id": given[j] if j < len(given) else call.id or f"call_{i}_{j}",
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(
                                call.arguments, ensure_ascii=False, default=str
                            ),
                        },
                    }
                )
            row: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if calls:
                row["tool_calls"] = calls
            pending = [c["id"] for c in calls]
            out.append(row)
        elif role == "tool":
            row = {
                "role": "tool",
                "content": _text(message.get("content")),
                "tool_call_id": message.get("tool_call_id")
                or (pending.pop(0) if pending else f"call_{i}"),
            }
            if message.get("name"):
                row["name"] = message["name"]
            out.append(row)
        else:
            out.append({"role": role, "content": _text(message.get("content"))})
    return out


def load_examples(
    source: str, limit: int | None = None, env_args: Mapping | None = None
) -> list[Example]:
    """The examples of a ``verifiers:<env-id>`` data source (the first ``limit``)."""
    if not source.startswith(SOURCE_PREFIX) or not source[len(SOURCE_PREFIX) :].strip():
        raise InputError(f"a verifiers data source is {SOURCE_PREFIX}<env-id>; got {source!r}")
    environment = source[len(SOURCE_PREFIX) :].strip()
    examples = VerifiersEnv.load(environment, env_args).examples(limit)
    if not examples:
        raise InputError(f"verifiers environment {environment!r} has no tasks")
    return examples
