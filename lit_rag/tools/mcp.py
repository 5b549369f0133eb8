"""MCP servers as tools: each tool a server lists is a :class:`~lit_rag.tools.base.Tool`.

The Model Context Protocol (https://modelcontextprotocol.io/specification) is JSON-RPC between
a client and a server that lists tools (``tools/list``, paginated) and runs them
(``tools/call``). We speak it through the official Python SDK (``mcp>=2``, its ``Client``),
over either transport the spec defines: stdio (a recipe's ``command:``, a child process) or
streamable HTTP (``url:``). Per the spec, a tool's own failure is a result with ``isError``
(shown to the model, ``tool_error``), while a protocol error or a closed connection is not; we
turn the connection's end (the process died, the HTTP server went away) into ``server_died``.
A server that died is opened again in the background (a stdio server's command started anew),
after 0.5 s and then waits doubling to 30 s (``reconnect_s``, ``reconnect_max_s``) until it
answers; meanwhile its calls fail at once as ``server_died`` (the environment fails those
episodes; by default the trainer leaves them out of the loss). One stderr line says it went
down, one that it is back.

Each server's session is opened on the :class:`~lit_rag.tools.base.ToolBox` loop and held
open by one task there for the whole run (the SDK's context managers are anyio task groups:
entered and exited in one task), so every call reuses it. :func:`close_servers` ends them;
closing is bounded in time even when the server already died.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lit_rag.tools.base import ServerDied, Tool, ToolBox, ToolError

if TYPE_CHECKING:
    from mcp import Client

#: ``McpServer.on_death`` values: the episode whose call met a dead server fails, or the run
#: stops with one line.
ON_DEATH = ("fail_episode", "stop")
#: Seconds a server has to close before its task is cancelled (the SDK's stdio shutdown waits
#: at most 0.5 + 2 + 2 + 2 s: flush, exit after stdin closes, SIGTERM, SIGKILL).
CLOSE_TIMEOUT_S = 10.0
#: ``tools/list`` pages read at most (a server whose cursor never ends cannot hang the start).
MAX_PAGES = 100


@dataclass
class McpServer:
    """One MCP server whose tools the agent gets.

    Args:
        name: The server's name in messages (and the tool prefix).
        command: A stdio server: the process to start (``["python", "server.py"]``).
        url: A streamable-HTTP server (``http://127.0.0.1:8765/mcp``).
        env: With ``command``: environment variables added to the SDK's default environment
            (``HOME``, ``PATH``, ``USER``, ...; the parent's other variables are not passed).
        timeout_s: A call running longer fails with ``timeout``.
        max_concurrency: At most this many calls of one tool at once.
        cache_size: Results kept per tool by arguments; 0: none (a server's answers may change).
        prefix: Tool names become ``<name>_<tool>`` (two servers with one tool name).
        on_death: ``fail_episode``: a call to a dead server fails its episode
            (``server_died``); ``stop``: the run stops with one line.
        start_timeout_s: Seconds the server has to start, initialize and list its tools.
        reconnect: A server that dies is opened again (a stdio server's command started
            anew) until it answers, its calls failing (``server_died``) meanwhile; not with
            ``on_death: stop``.
        reconnect_s: Seconds before the first try; each failed try doubles the wait.
        reconnect_max_s: The longest wait between tries.
    """

    name: str
    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] | None = None
    timeout_s: float = 30.0
    max_concurrency: int = 8
    cache_size: int = 0
    prefix: bool = False
    on_death: str = "fail_episode"
    start_timeout_s: float = 60.0
    reconnect: bool = True
    reconnect_s: float = 0.5
    reconnect_max_s: float = 30.0

    def __post_init__(self) -> None:
        where = f"mcp server {self.name!r}"
        if not self.name:
            raise ValueError("an mcp server needs a name")
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"{where}: give exactly one of command (a stdio server: a list, the program "
                f"then its arguments) or url (a streamable-HTTP server); got "
                f"command={self.command!r}, url={self.url!r}"
            )
        if self.command is not None and (not self.command or not all(self.command)):
            raise ValueError(f"{where}: command must be a non-empty list; got {self.command!r}")
        if self.env is not None and self.url is not None:
            raise ValueError(f"{where}: env is for a command; a url server has its own")
        if self.on_death not in ON_DEATH:
            raise ValueError(
                f"{where}: unknown on_death {self.on_death!r}; allowed: {', '.join(ON_DEATH)}"
            )
        if min(self.timeout_s, self.start_timeout_s) <= 0 or self.max_concurrency < 1:
            raise ValueError(
                f"{where}: timeout_s and start_timeout_s must be > 0 and max_concurrency >= 1; "
                f"got {self.timeout_s}, {self.start_timeout_s}, {self.max_concurrency}"
            )
        if self.cache_size < 0:
            raise ValueError(f"{where}: cache_size must be >= 0; got {self.cache_size}")
        if not 0 < self.reconnect_s <= self.reconnect_max_s:
            raise ValueError(
                f"{where}: reconnect_s must be > 0 and at most reconnect_max_s; got "
                f"{self.reconnect_s}, {self.reconnect_max_s}"
            )

    def describe(self) -> str:
        """``mcp server 'x' (command: python s.py)`` or ``(url: ...)``, for messages."""
        target = f"command: {' '.join(self.command)}" if self.command else f"url: {self.url}"
        return f"mcp server {self.name!r} ({target})"


class McpTool(Tool):
    """One tool of an MCP server (made by :func:`connect`).

    Its ``on_death`` is the server's: what the episode runner does on ``server_died``.

    Args:
        listed: The tool as ``tools/list`` gave it (``name``, ``description``,
            ``input_schema``).
        connection: The server's open session.
    """

    def __init__(self, listed: Any, connection: _Connection) -> None:
        server = connection.server
        self.remote_name = listed.name
        self.name = f"{server.name}_{listed.name}" if server.prefix else listed.name
        self.description = listed.description or ""
        self.parameters = dict(listed.input_schema or {"type": "object", "properties": {}})
        self.server, self.on_death = server, server.on_death
        self._connection = connection
        super().__init__(server.timeout_s, server.max_concurrency, server.cache_size)

    async def run(self, **arguments: Any) -> str:
        result = await self._connection.call(self.remote_name, arguments)
        text = content_text(result)
        if result.is_error:
            raise ToolError(text or f"{self.remote_name} reported an error")
        return text

    def close(self) -> None:
        """Close the server's session (every tool of the server shares it)."""
        close_servers([self])


def content_text(result: Any) -> str:
    """A ``CallToolResult``'s content as one text: text items joined by newlines, other items
    as a short placeholder (``[image]``), the structured content as JSON when there is no
    content."""
    parts = []
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and isinstance(getattr(item.resource, "text", None), str):
            parts.append(item.resource.text)
        elif kind in ("resource", "resource_link"):
            uri = getattr(getattr(item, "resource", item), "uri", "")
            parts.append(f"[resource {uri}]")
        else:
            parts.append(f"[{kind or type(item).__name__}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


@dataclass(eq=False)
class _Session:
    """One opening of a server's session: the task that holds it open, told to end by
    ``stop``; ``dead`` once it ended (or never opened); ``client`` while it is up."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    client: Client | None = None
    task: asyncio.Task | None = None


class _Connection:
    """One server's session, held open by a task on the tools' loop, and opened again (with
    backoff) when it ends unasked."""

    def __init__(self, server: McpServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server, self.loop = server, loop
        self.session: _Session | None = None
        self.reason = ""
        self._holders: set[asyncio.Task] = set()
        self._reconnecting: asyncio.Task | None = None
        self._closing = False

    def _transport(self) -> Any:
        if self.server.url is not None:
            return self.server.url  # the SDK's Client reads a URL as streamable HTTP
        from mcp import StdioServerParameters, stdio_client

        command = self.server.command
        params = StdioServerParameters(command=command[0], args=command[1:], env=self.server.env)
        # a Transport, which mcp 2.0's Client takes (2.3 also takes the parameters)
        return stdio_client(params)

    async def start(self) -> list[Any]:
        """Start, initialize and list the tools; on failure, a one-line ``RuntimeError``."""
        try:
            return await self._open()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, asyncio.TimeoutError):
                why = f"no tool list within start_timeout_s={self.server.start_timeout_s:g} s"
            elif _closed(exc):
                why = "it closed the connection before listing its tools (its stderr is above)"
            elif isinstance(exc, Exception):
                why = _reason(exc)
            else:
                raise
            raise RuntimeError(f"{self.server.describe()} failed to start: {why}") from exc

    async def _open(self) -> list[Any]:
        """Open a new session (the current one from now on); its tools once listed, within
        ``start_timeout_s``."""
        session = self.session = _Session()
        listed: asyncio.Future = self.loop.create_future()
        task = asyncio.create_task(self._hold(session, listed), name=f"mcp-{self.server.name}")
        session.task = task
        self._holders.add(task)
        task.add_done_callback(self._holders.discard)
        return await asyncio.wait_for(asyncio.shield(listed), self.server.start_timeout_s)

    async def _hold(self, session: _Session, listed: asyncio.Future) -> None:
        from mcp import Client

        up, reason = False, "the session ended"
        try:
            async with Client(self._transport()) as client:
                tools = await _list_tools(client)
                session.client, up = client, True
                if not listed.done():
                    listed.set_result(tools)
                await session.stop.wait()
        except Exception as exc:  # noqa: BLE001 (reported to whoever waits)
            reason = _reason(exc)
            if not listed.done():
                listed.set_exception(exc)
        finally:
            session.client = None
            session.dead.set()
            if not listed.done():  # cancelled before listing
                listed.cancel()
        if up:
            self._went_down(session, reason)

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """``tools/call``; a closed connection raises :class:`ServerDied`, a protocol error
        :class:`ToolError`."""
        import anyio
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        session = self.session
        if session is None or session.client is None or session.dead.is_set():
            raise ServerDied(self._gone())
        call = asyncio.ensure_future(session.client.call_tool(name, arguments))
        dead = asyncio.ensure_future(session.dead.wait())
        try:
            await asyncio.wait({call, dead}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dead.cancel()
            if not call.done():
                call.cancel()
        if not call.done():
            raise ServerDied(self._gone())
        try:
            return call.result()
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(exc.message) from exc
            self._went_down(session, exc.message)  # the stdio transport saw the end
            raise ServerDied(self._gone()) from exc
        except (OSError, EOFError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._went_down(session, _reason(exc))
            raise ServerDied(self._gone()) from exc

    def _went_down(self, session: _Session, reason: str) -> None:
        """``session``, the current one, ended unasked: its calls fail (``server_died``) from
        now on, one stderr line says so, and the server is opened again in the background
        (unless the run stops on a death, or ``reconnect`` is off)."""
        if session is not self.session or self._closing or session.stop.is_set():
            return  # an older session, the connection closing, or already reported
        session.stop.set()  # a session whose task still holds it lets it go
        session.dead.set()
        self.reason = reason
        server = self.server
        if server.on_death == "stop":
            return  # the run stops with its own line
        if self._reconnecting is not None and not self._reconnecting.done():
            return  # it died as it came back: the tries under way go on
        again = server.reconnect
        then = (
            f"; reconnecting (after {server.reconnect_s:g} s, doubling to "
            f"{server.reconnect_max_s:g} s)"
            if again
            else ""
        )
        _say(f"mcp server {server.name!r} went down ({reason}); its calls fail{then}")
        if again:
            self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        """Open the server again until it answers: waits of ``reconnect_s`` doubling to
        ``reconnect_max_s`` between tries; one stderr line once it is back."""
        server = self.server
        delay, tries, down = server.reconnect_s, 0, self.loop.time()
        while not self._closing:
            await asyncio.sleep(delay)
            tries += 1
            try:
                await self._open()
            except Exception:  # noqa: BLE001 (it is still down: try again later)
                await self._drop(self.session)
                delay = min(delay * 2, server.reconnect_max_s)
                continue
            if self.session.dead.is_set():  # it went down again at once
                delay = min(delay * 2, server.reconnect_max_s)
                continue
            seconds = self.loop.time() - down
            done = f"{tries} {'try' if tries == 1 else 'tries'}"
            _say(f"mcp server {server.name!r} is back after {seconds:.1f} s ({done})")
            return

    @staticmethod
    async def _drop(session: _Session | None) -> None:
        """End a session that did not open (its task cancelled, bounded in time)."""
        if session is None or session.task is None:
            return
        session.stop.set()
        session.task.cancel()
        await asyncio.wait({session.task}, timeout=CLOSE_TIMEOUT_S)

    def _gone(self) -> str:
        return f"mcp server {self.server.name!r} is gone: {self.reason or 'connection closed'}"

    async def aclose(self) -> None:
        """End the sessions (and a stdio server's process) and any reconnecting; bounded by
        CLOSE_TIMEOUT_S."""
        self._closing = True
        if self._reconnecting is not None and not self._reconnecting.done():
            self._reconnecting.cancel()
            await asyncio.wait({self._reconnecting}, timeout=CLOSE_TIMEOUT_S)
        tasks = {task for task in self._holders if not task.done()}
        if self.session is not None:  # older sessions were told to stop when they went down
            self.session.stop.set()
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        for task in late:  # a timeout, or the task failed: closing never raises
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=CLOSE_TIMEOUT_S)


def _say(line: str) -> None:
    """One ``lit-rag:`` line on stderr."""
    print(f"lit-rag: {line}", file=sys.stderr, flush=True)


async def _list_tools(client: Client) -> list[Any]:
    tools, cursor = [], None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _closed(exc: BaseException) -> bool:
    """``exc`` is the SDK's ``CONNECTION_CLOSED`` error."""
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    exc = _leaf(exc)
    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def _leaf(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio's task groups raise them), else ``exc``."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException) -> str:
    """An exception in one line: ``Type: message``."""
    exc = _leaf(exc)
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def connect(servers: Sequence[McpServer], toolbox: ToolBox) -> list[McpTool]:
    """Open every server's session on ``toolbox``'s loop (together) and list its tools.

    The tools are returned, not added: ``toolbox.add(connect(servers, toolbox))``. Close them
    with :func:`close_servers` (``ToolBox.close`` does, through each tool's ``close``).

    Raises:
        RuntimeError: A server did not start or list its tools (one line naming it and its
            command or url); the servers already open are closed.
        ValueError: Two servers share a name, or two tools a name (``prefix: true`` helps).
    """
    names = [s.name for s in servers]
    if len(set(names)) < len(names):
        raise ValueError(f"mcp server names must differ; got {names}")
    return toolbox.submit(_connect(list(servers), toolbox.loop))


async def _connect(servers: list[McpServer], loop: asyncio.AbstractEventLoop) -> list[McpTool]:
    connections = [_Connection(server, loop) for server in servers]
    opened = await asyncio.gather(*(c.start() for c in connections), return_exceptions=True)
    failed = [r for r in opened if isinstance(r, BaseException)]
    tools: list[McpTool] = []
    if not failed:
        try:
            tools = _tools(connections, opened)
        except ValueError as exc:
            failed.append(exc)
    if failed:
        await asyncio.gather(*(c.aclose() for c in connections))
        raise failed[0]
    return tools


def _tools(connections: list[_Connection], listed: list[list[Any]]) -> list[McpTool]:
    tools: list[McpTool] = []
    owner: dict[str, str] = {}
    for connection, items in zip(connections, listed, strict=True):
        for item in items:
            tool = McpTool(item, connection)
            if tool.name in owner:
                raise ValueError(
                    f"mcp servers {owner[tool.name]!r} and {connection.server.name!r} both have "
                    f"a tool named {tool.name!r}; set prefix: true on one of them"
                )
            owner[tool.name] = connection.server.name
            tools.append(tool)
    return tools


def close_servers(tools: Sequence[Tool]) -> None:
    """Close the sessions behind ``tools`` (other tools are skipped), together; never raises,
    never waits much past ``CLOSE_TIMEOUT_S``. From the tools' loop itself it only asks them
    to close (the loop cannot wait on itself)."""
    connections = {id(t._connection): t._connection for t in tools if isinstance(t, McpTool)}
    by_loop: dict[int, list[_Connection]] = {}
    for connection in connections.values():
        by_loop.setdefault(id(connection.loop), []).append(connection)
    for group in by_loop.values():
        loop = group[0].loop
        if loop.is_closed() or not loop.is_running():
            continue
        future = asyncio.run_coroutine_threadsafe(_close_all(group), loop)
        if _running_loop() is loop:
            continue
        try:
            future.result(timeout=CLOSE_TIMEOUT_S * 2 + 1)
        except Exception:  # noqa: BLE001 (closing never raises)
            future.cancel()


async def _close_all(connections: list[_Connection]) -> None:
    await asyncio.gather(*(c.aclose() for c in connections))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
