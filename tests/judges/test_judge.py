"""The LLM judge and the ``llm_judge`` reward against a REAL HTTP server, through the real
``openai`` client.

The server is the standard library's ``http.server`` in a thread: a fake OpenAI-compatible
transport answering ``/v1/chat/completions`` with a canned reply chosen by the answer being
judged (what follows ``A: `` in the test prompt; ``server.forced`` overrides it); a few answers
pick a failure instead: ``sleep`` (answers after the client's timeout), ``http500``,
``garbage`` (a body that is no JSON), ``slow`` (answers after 0.3 s, to see requests in flight
together), and the ``think-*`` / ``opened-*`` / ``split-*`` answers pick a thinking judge's reply
(:data:`THINKING`). It keeps every request body and User-Agent. It stands in for a judge model
only in what it replies; the client, its retries, time-outs and the HTTP in between are the real
ones (a real thinking template on a real vLLM server: ``test_judge_vllm_thinking.py``).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from kit import trajectory

from lit_rag.errors import InputError
from lit_rag.judges import (
    UNFINISHED,
    Judge,
    JudgeCase,
    judge_signals,
    parse_number,
    parse_yes_no,
    read_reply,
    strip_reasoning,
)
from lit_rag.plugins.rewards.judge import LLMJudgeReward

PROMPT = "Q: {question}\nGold: {answers}\nA: {response}"

#: the judge's reply to each answer (anything else: "no")
REPLIES = {
    "Paris": "Yes.",
    "paris, France": "yes, it names the city",
    "Lyon": "No, the capital is Paris.",
    "ramble": "I would rather not say.",
    "good": "Score: 8/10",
    "great": "12 out of 10!",
    "awful": "-2",
    "slow": "yes",
}

#: a thinking judge's replies: (content, the server's separate reasoning field, finish_reason)
THINKING = {
    # the model opens and closes its reasoning; "no" in the reasoning is not the verdict
    "think-done": ("<think>\nIs it no? It names Paris.\n</think>\n\nYes.", None, "stop"),
    # cut by max_tokens inside its reasoning: no verdict, though "yes" is in it
    "think-cut": ("<think>\nIs it yes or", None, "length"),
    "think-stop": ("<think>\nyes", None, "stop"),
    # the reasoning quotes the answer's own "</think>": the verdict follows the last one
    "think-quoted": ("<think>It says '</think> yes'. Wrong.</think>no", None, "stop"),
    # the chat template opened <think> in the prompt: no opening tag in the reply
    "opened-done": ("Maybe yes? No, Lyon is not the capital.</think>\n\nNo", None, "stop"),
    "opened-cut": ("Is it yes? Let me", None, "length"),
    # vLLM's --reasoning-parser put the reasoning in a field of its own (never read)
    "split-done": ("no", "yes yes yes", "stop"),
    "split-cut": (None, "Is it yes? Let", "length"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        server: _JudgeServer = self.server  # type: ignore[assignment]
        answer = server.forced or prompt.rsplit("A: ", 1)[-1]
        with server.lock:
            server.hits[prompt] += 1
            server.keys.append(self.headers.get("Authorization", ""))
            server.bodies.append(body)
            server.agents.add(self.headers.get("User-Agent", "").split("/")[0])
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            self._answer(answer, body["model"])
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
            pass
        finally:
            with server.lock:
                server.in_flight -= 1

    def _answer(self, answer: str, model: str) -> None:
        if answer == "sleep":
            time.sleep(1.0)  # past the client's 0.3 s
        if answer.startswith("slow"):
            time.sleep(0.3)
        if answer == "http500":
            return self._send(500, json.dumps({"error": {"message": "boom"}}).encode())
        if answer == "garbage":
            return self._send(200, b"{not json")
        content, reasoning, finish = THINKING.get(
            answer, (REPLIES.get(answer.split("-")[0], "no"), None, "stop")
        )
        message = {"role": "assistant", "content": content, "reasoning": reasoning}
        completion = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        return self._send(200, json.dumps(completion).encode())

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class _JudgeServer(ThreadingHTTPServer):
    daemon_threads = True  # a sleeping handler never holds the test run

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.keys: list[str] = []
        self.bodies: list[dict] = []
        self.agents: set[str] = set()
        self.forced = ""  # answer every prompt as if this were the answer judged
        self.in_flight = self.max_in_flight = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"

    def requests(self) -> int:
        return sum(self.hits.values())


@pytest.fixture
def server():
    srv = _JudgeServer()
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _judge(server: _JudgeServer, **settings) -> Judge:
    return Judge(base_url=server.url, model="judge", prompt=PROMPT, **settings)


def _case(response: str) -> JudgeCase:
    return JudgeCase("Capital of France?", ["Paris"], response)


def test_yes_no_replies_score_one_or_zero(server):
    verdicts = _judge(server).scores([_case("Paris"), _case("Lyon"), _case("paris, France")])
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0]
    assert verdicts[1].reply == "No, the capital is Paris." and verdicts[1].error == ""
    # the prompt the server saw: the gold answers as a JSON list
    assert 'Q: Capital of France?\nGold: ["Paris"]\nA: Lyon' in server.hits


def test_number_replies_are_clipped_and_scaled(server):
    judge = _judge(server, score="number", max_score=10.0)
    verdicts = judge.scores([_case("good"), _case("great"), _case("awful"), _case("ramble")])
    # 8/10 = 0.8; 12 clipped to 10 -> 1.0; -2 clipped to 0 -> 0.0; no number -> unparsable
    assert [v.score for v in verdicts] == [0.8, 1.0, 0.0, None]
    assert verdicts[3].error == "unparsable" and verdicts[3].reply == "I would rather not say."


def test_parsers_read_untrusted_text_without_raising():
    assert parse_yes_no("No; yes would be wrong") == 0.0 and parse_yes_no("eyes") is None
    assert parse_yes_no(None) is None  # type: ignore[arg-type]
    assert parse_number("9" * 400, 10.0) == 1.0  # a huge number is clipped, not an error
    assert parse_number("v1.5 says 3", 10.0) == 0.3  # "1.5" is inside a word: 3 is first
    assert parse_number("__import__('os')", 10.0) is None  # read, never evaluated


def test_the_cache_answers_repeats_without_a_request(server):
    judge = _judge(server)
    first = judge.scores([_case("Paris"), _case("Lyon"), _case("Paris")])
    assert server.requests() == 2  # the repeat within a call is asked once
    assert [v.cached for v in first] == [False, False, True]
    again = judge.scores([_case("Lyon"), _case("Paris")])
    assert server.requests() == 2 and all(v.cached for v in again)
    assert [v.score for v in again] == [0.0, 1.0]


def test_the_cache_keeps_the_most_recent_and_never_a_failure(server):
    judge = _judge(server, cache_size=1)
    judge.scores([_case("Paris")])
    judge.scores([_case("Lyon")])  # evicts Paris
    judge.scores([_case("Paris")])
    assert server.requests() == 3
    judge.scores([_case("ramble")])
    judge.scores([_case("ramble")])  # an unparsable reply is asked again
    assert server.requests() == 5


def test_requests_run_concurrently_up_to_the_limit(server):
    cases = [_case(f"slow-{i}") for i in range(4)]
    assert [v.score for v in _judge(server, max_concurrency=4).scores(cases)] == [1.0] * 4
    assert server.max_in_flight == 4  # each answer takes 0.3 s: all four were in flight at once
    server.max_in_flight = 0
    _judge(server, max_concurrency=2).scores([_case(f"slow-{i}") for i in range(4, 8)])
    assert server.max_in_flight == 2


def test_a_timeout_is_retried_then_a_verdict_not_an_exception(server):
    (verdict,) = _judge(server, timeout_s=0.3, retries=1).scores([_case("sleep")])
    assert verdict.score is None and verdict.error == "timeout" and verdict.reply == ""
    assert server.hits[next(iter(server.hits))] == 2  # the request and one retry


def test_http_errors_and_garbage_are_verdicts(server):
    judge = _judge(server, retries=1)
    verdicts = judge.scores([_case("http500"), _case("garbage"), _case("Paris")])
    assert [v.error for v in verdicts] == ["http 500", "bad response", ""]
    assert verdicts[2].score == 1.0
    assert server.hits[PROMPT.format(question="Capital of France?", answers='["Paris"]',
                                     response="http500")] == 2  # retried once  # fmt: skip


def test_a_closed_port_is_a_connection_failure():
    probe = _JudgeServer()
    url = f"http://127.0.0.1:{probe.server_port}/v1"
    probe.server_close()  # nothing listens there now
    (verdict,) = Judge(base_url=url, model="judge", retries=0).scores([_case("Paris")])
    assert verdict.score is None and verdict.error == "connection"


def test_the_key_comes_from_the_named_variable(server, monkeypatch):
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    _judge(server, api_key_env="JUDGE_TEST_KEY").scores([_case("Paris")])
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    _judge(server, api_key_env="JUDGE_TEST_KEY").scores([_case("Lyon")])
    assert server.keys == ["Bearer EMPTY", "Bearer sk-test"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"prompt": "Is {answer} right? {response}"}, "unknown field(s) ['answer']"),
        ({"prompt": "Q: {question} {answers}"}, "must name {response}"),
        ({"prompt": "{response} {"}, "not a valid template"),
        ({"prompt": "{response.__class__}"}, "unknown field(s) ['response.__class__']"),
        ({"score": "stars"}, "judge score 'stars' is not known; allowed: yes_no, number"),
        ({"timeout_s": 0}, "judge timeout_s must be > 0; got 0"),
        ({"max_concurrency": 0}, "judge max_concurrency must be >= 1; got 0"),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(InputError) as info:
        Judge(base_url="http://127.0.0.1:1/v1", model="judge", **settings)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_judge_survives_a_copy():
    judge = Judge(base_url="http://127.0.0.1:1/v1", model="judge")
    copy = pickle.loads(pickle.dumps(judge))
    assert copy.model == "judge" and copy.scores([]) == []


def test_signals_show_their_arithmetic():
    from lit_rag.judges import Verdict

    verdicts = [Verdict(1.0), Verdict(0.0), Verdict(1.0), Verdict(None, error="timeout")]
    signals = judge_signals(verdicts)
    # scored [1, 0, 1]: mean 2/3, std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 3) = sqrt(2)/3
    assert signals["failures"] == 1.0
    assert signals["score_mean"] == pytest.approx(2 / 3)
    assert signals["score_std"] == pytest.approx(2**0.5 / 3)
    assert (signals["score_at_0"], signals["score_at_1"]) == pytest.approx((1 / 3, 2 / 3))


def test_the_reward_pays_the_verdict_and_failure_reward_on_failure(server, capsys):
    reward = LLMJudgeReward(
        base_url=server.url, model="judge", prompt=PROMPT, timeout_s=0.3, retries=0,
        failure_reward=-0.5,
    )  # fmt: skip
    example = {"answers": ["Paris"]}
    trajectories = [
        trajectory("<think>capital</think><answer>Paris</answer>", **example),
        trajectory("<answer>Lyon</answer>", **example),
        trajectory("<answer>sleep</answer>", **example),
        trajectory("<answer>http500</answer>", **example),
        trajectory("no answer tag", **example),
    ]
    out = reward(trajectories)
    # Paris 1, Lyon 0, two failures -0.5 each, no answer 0 (not asked)
    assert out.total.tolist() == [1.0, 0.0, -0.5, -0.5, 0.0]
    assert out.components["judge_failures"].tolist() == [0, 0, 1, 1, 0]
    assert out.components["judge_at_0"].tolist() == [0, 1, 0, 0, 0]
    assert out.components["judge_at_1"].tolist() == [1, 0, 0, 0, 0]
    # the judge's failures leave the loss; no answer is the policy's own 0
    assert out.failed.tolist() == [False, False, True, True, False]
    assert server.requests() == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lit-rag reward llm_judge: 2/4 judge verdict(s) failed (first: timeout); judge judge; "
        "marked failed: they leave the loss (model.environment_failures: drop) or score "
        "failure_reward -0.5 (keep)"
    ]
    metrics = {k: float(v) for k, v in reward.metrics().items()}
    # scored: [1, 0]: mean 0.5, std 0.5, one at 0, one at 1
    assert metrics == {
        "judge/failures": 2.0,
        "judge/score_mean": 0.5,
        "judge/score_std": 0.5,
        "judge/score_at_0": 0.5,
        "judge/score_at_1": 0.5,
    }
    reward.set_weights({"judge": 2.0})
    assert reward(trajectories[:2]).total.tolist() == [2.0, 0.0]  # both from the cache
    assert server.requests() == 4 and capsys.readouterr().err == ""


# ---- a thinking judge ----------------------------------------------------------------------


def test_the_verdict_is_read_after_the_reasoning(server):
    judge = _judge(server)
    cases = ["think-done", "think-quoted", "opened-done", "split-done"]
    verdicts = judge.scores([_case(c) for c in cases])
    # "no" inside the reasoning of think-done, "yes" inside think-quoted's and opened-done's,
    # "yes yes yes" in split-done's reasoning field: none of them is the verdict
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert all(v.error == "" for v in verdicts)
    assert verdicts[0].reply.startswith("<think>")  # the reply is kept whole


def test_a_reply_cut_inside_its_reasoning_has_no_verdict(server):
    verdicts = _judge(server).scores([_case("think-cut"), _case("split-cut"), _case("think-stop")])
    assert [v.score for v in verdicts] == [None, None, None]
    assert [v.error for v in verdicts] == [
        UNFINISHED,  # "reasoning not finished within max_tokens"
        UNFINISHED,  # the server split the reasoning off; the content is empty
        "reasoning not finished (the reply ends before </think>)",
    ]
    judge = _judge(server)
    judge.scores([_case("think-cut")])
    judge.scores([_case("think-cut")])
    assert server.hits[judge.render(_case("think-cut"))] == 3  # a failure is never cached


def test_a_template_that_opens_think_makes_a_reply_without_its_end_unfinished(server):
    (plain,) = _judge(server).scores([_case("opened-cut")])
    assert plain.score == 1.0  # read as a verdict: the first "yes" of cut-off reasoning
    opened = _judge(server, template_opens_think=True)
    cut, done = opened.scores([_case("opened-cut"), _case("opened-done")])
    assert (cut.score, cut.error) == (None, UNFINISHED)
    assert (done.score, done.error) == (0.0, "")


def test_the_reasoning_parsers_read_untrusted_text_without_raising():
    hostile = [None, 7, "", "</think>", "<think>", "</think><think>", "<think></think>" * 3,
               "<think>" * 10_000, "</think>yes" + "</think>" * 50, "x" * 100_000]  # fmt: skip
    for text in hostile:
        strip_reasoning(text)  # type: ignore[arg-type]
        strip_reasoning(text, opened=True)  # type: ignore[arg-type]
        for finish in (None, "stop", "length", 3):
            read_reply(text, text, finish, parse_yes_no)
    assert strip_reasoning("<think>a</think>yes</think><think>more") is None  # reopened
    assert strip_reasoning("</think><think></think>Yes") == "Yes"
    assert read_reply(["yes"], None, "stop", parse_yes_no).error == "bad response"
    # the reasoning field alone never scores: "yes" there, nothing in the content
    assert read_reply("", "yes", "stop", parse_yes_no).error == "unparsable"


def test_requests_carry_the_budget_the_template_kwargs_and_the_extra_body(server):
    _judge(server).scores([_case("Paris")])
    _judge(
        server,
        max_tokens=16,
        chat_template_kwargs={"enable_thinking": False},
        extra_body={"top_p": 0.5, "chat_template_kwargs": {"enable_thinking": True, "x": 1}},
    ).scores([_case("Lyon")])
    first, second = server.bodies
    assert first["max_tokens"] == 1024 and "chat_template_kwargs" not in first  # the default
    assert second["max_tokens"] == 16 and second["top_p"] == 0.5
    # the chat_template_kwargs setting wins over extra_body's own
    assert second["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}
    assert second["temperature"] == 0.0 and second["model"] == "judge"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"extra_body": {"max_tokens": 8}}, "judge extra_body sets max_tokens, which the judge"),
        ({"chat_template_kwargs": "no_think"}, "judge chat_template_kwargs must be a mapping"),
        ({"extra_body": {"seed": object()}}, "judge extra_body must be JSON"),
        ({"extra_body": {"chat_template_kwargs": 1}}, "extra_body.chat_template_kwargs must be"),
        (
            {"template_opens_think": True, "chat_template_kwargs": {"enable_thinking": False}},
            "judge template_opens_think is true but chat_template_kwargs.enable_thinking is false",
        ),
        ({"max_tokens": 0}, "judge max_tokens must be >= 1; got 0"),
    ],
)
def test_bad_request_settings_are_one_line(settings, message):
    with pytest.raises(InputError) as info:
        Judge(base_url="http://127.0.0.1:1/v1", model="judge", **settings)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_reward_marks_a_judge_without_a_verdict_failed(server):
    reward = LLMJudgeReward(base_url=server.url, model="judge", prompt=PROMPT, failure_reward=0.25)
    example = {"answers": ["Paris"]}
    trajectories = [
        trajectory("<answer>think-done</answer>", **example),
        trajectory("<answer>think-cut</answer>", **example),
        trajectory("<answer>split-cut</answer>", **example),
        trajectory("<answer>ramble</answer>", **example),  # a reply without yes / no
        trajectory("no answer", **example),
    ]
    out = reward(trajectories)
    # verdict 1; three without a verdict pay failure_reward 0.25; no answer: 0, not failed
    assert out.total.tolist() == [1.0, 0.25, 0.25, 0.25, 0.0]
    assert out.failed.tolist() == [False, True, True, True, False]
    assert out.failed.dtype == torch.bool
    assert out.components["judge_failures"].tolist() == [0, 1, 1, 1, 0]
    assert reward.judge.max_tokens == 1024


# ---- asynchronous requests -----------------------------------------------------------------


def test_requests_go_through_the_async_client(server):
    _judge(server).scores([_case("Paris")])
    assert server.agents == {"AsyncOpenAI"}


def test_scores_waits_from_a_running_event_loop_and_from_a_thread(server):
    judge = _judge(server)

    async def inside_a_loop():  # a caller on an event loop using the synchronous API
        return judge.scores([_case("Paris")])

    assert [v.score for v in asyncio.run(inside_a_loop())] == [1.0]
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(judge.scores([_case("Lyon")])))
    worker.start()  # a thread with no event loop of its own
    worker.join()
    assert [v.score for v in out] == [0.0]


def test_ascores_is_awaited_from_any_loop_with_bounded_concurrency(server):
    judge = _judge(server, max_concurrency=3)

    async def two_batches():
        return await asyncio.gather(
            judge.ascores([_case(f"slow-{i}") for i in range(3)]),
            judge.ascores([_case(f"slow-{i}") for i in range(3, 6)]),
        )

    first, second = asyncio.run(two_batches())
    assert [v.score for v in first + second] == [1.0] * 6
    assert server.max_in_flight == 3  # one judge, one bound over both batches


def test_threads_share_one_judge(server):
    judge = _judge(server, max_concurrency=2)
    results: dict[int, list] = {}

    def ask(k: int) -> None:
        results[k] = judge.scores([_case("Paris"), _case(f"slow-{k}"), _case("Lyon")])

    workers = [threading.Thread(target=ask, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all([v.score for v in results[k]] == [1.0, 1.0, 0.0] for k in range(4))
    assert server.max_in_flight <= 2


# ---- the settings from a recipe and from lit-rag evaluate ----------------------------------


def test_a_recipe_reaches_the_judge_settings():
    """The real CLI (``run=False``) parses the reward's init_args, as a recipe gives them."""
    from pathlib import Path

    from lit_rag.cli.commands import build_cli

    root = Path(__file__).resolve().parents[2]
    cli = build_cli(
        [
            "--config", str(root / "recipes" / "tiny_tool_agent.yaml"),
            "--model.reward=llm_judge",
            "--model.reward.init_args.base_url=http://127.0.0.1:1/v1",
            "--model.reward.init_args.model=Qwen3-8B",
            '--model.reward.init_args.chat_template_kwargs={"enable_thinking": false}',
            "--model.reward.init_args.extra_body={top_p: 0.8}",
            "--model.reward.init_args.max_tokens=4096",
            "--trainer.logger=false",
        ],
        run=False,
    )  # fmt: skip
    judge = cli.model.reward.judge
    assert judge.chat_template_kwargs == {"enable_thinking": False}
    assert judge.extra_body == {"top_p": 0.8} and judge.max_tokens == 4096
    body = {"top_p": 0.8, "chat_template_kwargs": {"enable_thinking": False}}
    assert judge.request_body() == body  # what each request adds


def _record() -> dict:
    rows = [{"answers": ["Paris"], "prediction": "Paris"}]
    return {"predictions": {"hotpotqa": rows}, "metrics": {"hotpotqa": {}}}


def test_evaluate_sends_the_judge_settings_and_records_them(server, tmp_path):
    from lit_rag.evaluate.command import add_judgements, build_parser, judge_settings

    options, _ = build_parser().parse_known_args(
        ["--suite", "arena", "--judge", server.url, "--judge-model", "judge",
         "--judge-chat-template-kwargs", '{"enable_thinking": false}',
         "--judge-extra-body", '{"top_p": 0.5}']
    )  # fmt: skip
    server.forced = "think-done"
    record = _record()
    add_judgements(record, tmp_path, judge_settings(options))
    (body,) = server.bodies
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_p"] == 0.5
    assert body["max_tokens"] == 1024
    assert record["predictions"]["hotpotqa"][0]["lj"] == 1.0
    assert record["protocol"]["judge"] == {
        "base_url": server.url, "model": "judge", "max_tokens": 1024,
        "chat_template_kwargs": {"enable_thinking": False}, "extra_body": {"top_p": 0.5},
        "template_opens_think": False,
    }  # fmt: skip


def test_evaluate_stops_on_unfinished_reasoning_with_one_line(server, tmp_path):
    from lit_rag.evaluate.command import add_judgements, build_parser, judge_settings

    options, _ = build_parser().parse_known_args(
        ["--suite", "arena", "--judge", server.url, "--judge-model", "judge",
         "--judge-max-tokens", "8"]
    )  # fmt: skip
    server.forced = "think-cut"
    with pytest.raises(InputError) as info:
        add_judgements(_record(), tmp_path, judge_settings(options))
    assert str(info.value) == (
        f"evaluate: judge judge at {server.url} failed: reasoning not finished within "
        "max_tokens (8); raise --judge-max-tokens or turn thinking off: "
        "--judge-chat-template-kwargs '{\"enable_thinking\": false}'"
    )
    assert server.bodies[0]["max_tokens"] == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--judge-extra-body", "{top_p: 1}"], "argument --judge-extra-body: not JSON"),
        (["--judge-chat-template-kwargs", "[1]"], "not a JSON object: '[1]'"),
        (["--judge-max-tokens", "many"], "argument --judge-max-tokens: invalid int value"),
    ],
)
def test_evaluate_judge_options_fail_in_one_line(args, message):
    from lit_rag.evaluate.command import build_parser

    with pytest.raises(InputError) as info:
        build_parser().parse_known_args(["--suite", "arena", *args])
    assert message in str(info.value) and "\n" not in str(info.value)
