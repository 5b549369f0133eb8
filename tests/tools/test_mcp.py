"""MCP servers as tools, against the real example server (examples/mcp/corpus_server.py) in a
child process: over stdio, and over streamable HTTP; a server killed mid-run is opened again."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import require_package

require_package("mcp", 'pip install "mcp>=2"')

import psutil

from lit_rag.tools import ToolBox, ToolCall
from lit_rag.tools.mcp import McpServer, close_servers, connect, content_text

SERVER = str(Path(__file__).resolve().parents[2] / "examples" / "mcp" / "corpus_server.py")
# the synthetic world of seed 0 (lit_rag.data.synthetic): passage w0 is the first fact
W0 = "The city of Drosstead lies in Vosmoland, surrounded by green hills."


def stdio(name: str = "corpus", **settings) -> McpServer:
    return McpServer(name, command=[sys.executable, SERVER], **settings)


def call(box: ToolBox, name: str, **arguments):
    return box.call_all([ToolCall(name, arguments)])[0]


@pytest.fixture(scope="module")
def corpus():
    """One stdio server for the read-only tests (a start costs about a second)."""
    box = ToolBox([])
    box.add(connect([stdio()], box))
    yield box
    box.close()


def test_lists_the_servers_tools_with_their_schemas(corpus):
    assert list(corpus.tools) == ["search", "fetch"]
    search = corpus.tools["search"]
    assert search.description.startswith("Search the corpus with BM25")
    assert search.parameters["required"] == ["query"]
    assert search.parameters["properties"]["k"]["type"] == "integer"
    assert search.cache_size == 0 and search.timeout_s == 30.0


def test_search_returns_search_agent_documents(corpus):
    result = call(corpus, "search", query="Drosstead region", k=2)
    lines = result.text.splitlines()
    assert not result.error and len(lines) == 2
    assert lines[0] == f"Doc 1(Title: Drosstead, id: w0) {W0}"
    assert lines[1].startswith("Doc 2(Title: ")


def test_fetch_a_known_id(corpus):
    result = call(corpus, "fetch", id="w0")
    assert (result.error, result.text) == ("", f"(Title: Drosstead) {W0}")


def test_an_error_result_is_a_tool_error_with_the_servers_message(corpus):
    result = call(corpus, "fetch", id="w999999")
    assert result.error == "tool_error"
    assert "unknown passage id 'w999999'" in result.text


def test_arguments_are_checked_before_the_server_sees_them(corpus):
    assert call(corpus, "search", query=3).error == "bad_arguments"


def test_a_killed_server_gives_server_died_at_once_and_closes():
    box = ToolBox([])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    box.add(connect([stdio("doomed", timeout_s=20)], box))
    (server,) = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert call(box, "fetch", id="w0").error == ""

    server.kill()
    server.wait(5)
    started = time.monotonic()
    result = call(box, "search", query="Drosstead")
    assert result.error == "server_died"  # not "timeout": the call did not wait 20 s
    assert "mcp server 'doomed' is gone" in result.text
    assert call(box, "fetch", id="w0").error == "server_died"
    box.close()
    assert time.monotonic() - started < 5


def started_since(before: set[int]) -> list[psutil.Process]:
    """This process's children (and theirs) started since ``before`` (their pids)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def until_answered(box: ToolBox, seconds: float = 20):
    """Call ``fetch w0`` until it answers; every call meanwhile must fail as ``server_died``."""
    deadline = time.monotonic() + seconds
    while (result := call(box, "fetch", id="w0")).error:
        assert result.error == "server_died", result.text
        assert time.monotonic() < deadline, "the server did not come back"
        time.sleep(0.05)
    return result


def test_a_killed_stdio_server_is_started_again_and_its_calls_answer(capsys):
    box = ToolBox([])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    box.add(connect([stdio("phoenix", reconnect_s=0.2)], box))
    try:
        (server,) = started_since(before)
        assert call(box, "fetch", id="w0").error == ""
        server.kill()
        server.wait(5)
        assert call(box, "search", query="Drosstead").error == "server_died"
        assert call(box, "fetch", id="w0").error == "server_died"  # down: at once, no wait
        assert until_answered(box).text == f"(Title: Drosstead) {W0}"
        assert not call(box, "search", query="Drosstead region", k=1).error
        assert [p.pid for p in started_since(before)] != [server.pid]  # a new process
    finally:
        box.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines  # one when it went down, one when it was back
    assert lines[0].startswith("lit-rag: mcp server 'phoenix' went down (")
    assert "reconnecting (after 0.2 s, doubling to 30 s)" in lines[0]
    assert lines[1].startswith("lit-rag: mcp server 'phoenix' is back after ")


def test_a_server_that_stays_down_is_tried_with_backoff_until_it_is_back(tmp_path, capsys):
    """The HTTP server is killed, and started again on its port a second later: the tries
    that fail meanwhile (waits 0.1, 0.2, 0.4, 0.4 s ...) are not reported, its calls fail as
    ``server_died``, and the calls answer once it is back."""
    port, log = free_port(), tmp_path / "server.log"

    def serve() -> subprocess.Popen:
        with log.open("a") as out:
            process = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stderr=out)
        wait_for_port(port, process, log)
        return process

    process = serve()
    url = f"http://127.0.0.1:{port}/mcp"
    server = McpServer("web", url=url, reconnect_s=0.1, reconnect_max_s=0.4)
    box = ToolBox([])
    try:
        box.add(connect([server], box))
        process.kill()
        process.wait(5)
        assert call(box, "fetch", id="w0").error == "server_died"
        time.sleep(1.0)  # several tries fail
        assert call(box, "fetch", id="w0").error == "server_died"
        process = serve()
        assert until_answered(box).text == f"(Title: Drosstead) {W0}"
    finally:
        box.close()
        process.kill()
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" (")[0].split(" after ")[0] for line in lines] == [
        "lit-rag: mcp server 'web' went down",
        "lit-rag: mcp server 'web' is back",
    ], lines
    assert lines[1].endswith(" tries)"), lines[1]  # the first tries failed


def test_a_server_that_does_not_start_names_itself():
    box = ToolBox([])
    with pytest.raises(RuntimeError, match=r"mcp server 'gone' \(command: no-such-mcp-server\)"):
        connect([McpServer("gone", command=["no-such-mcp-server"])], box)
    quits = McpServer("quits", command=[sys.executable, "-c", "pass"])
    with pytest.raises(RuntimeError, match="closed the connection before listing its tools"):
        connect([quits], box)
    box.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, "give exactly one of command"),
        ({"command": ["x"], "url": "http://h/mcp"}, "give exactly one of command"),
        ({"command": []}, "command must be a non-empty list"),
        ({"url": "http://h/mcp", "on_death": "retry"}, "allowed: fail_episode, stop"),
        ({"url": "http://h/mcp", "timeout_s": 0}, "timeout_s and start_timeout_s must be > 0"),
        ({"url": "http://h/mcp", "reconnect_s": 60}, "reconnect_s must be > 0 and at most"),
    ],
)
def test_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=f"mcp server 's': .*{message}"):
        McpServer("s", **settings)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the server did not listen on {port}:\n{log.read_text()}")


def test_streamable_http_with_prefixed_names(tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stderr=out)
    try:
        wait_for_port(port, process, log)
        box = ToolBox([])
        tools = connect([McpServer("web", url=f"http://127.0.0.1:{port}/mcp", prefix=True)], box)
        box.add(tools)
        assert list(box.tools) == ["web_search", "web_fetch"]
        assert call(box, "web_fetch", id="w0").text == f"(Title: Drosstead) {W0}"

        process.kill()
        process.wait(5)
        assert call(box, "web_search", query="Drosstead").error == "server_died"
        close_servers(tools)
        box.close()
    finally:
        process.kill()


def test_two_servers_with_one_tool_name_need_a_prefix():
    box = ToolBox([])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="'a' and 'b' both have a tool named 'search'"):
        connect([stdio("a"), stdio("b")], box)
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    box.close()


def test_content_other_than_text_is_a_placeholder():
    from mcp.types import CallToolResult, ImageContent, TextContent

    result = CallToolResult(
        content=[
            TextContent(type="text", text="a chart:"),
            ImageContent(type="image", data="AAAA", mime_type="image/png"),
        ]
    )
    assert content_text(result) == "a chart:\n[image]"
    assert content_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
