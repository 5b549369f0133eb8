"""The LLM judge and the ``llm_judge`` reward against a REAL HTTP server, through the real
``openai`` client.

The server is the standard library's ``http.server`` in a thread, answering
``/v1/chat/completions`` with a canned reply chosen by the answer being judged (what follows
``A: `` in the test prompt); a few answers pick a failure instead: ``sleep`` (answers after the
client's timeout), ``http500``, ``garbage`` (a body that is no JSON), ``slow`` (answers after
0.3 s, to see requests in flight together). It stands in for a judge model only in what it
replies; the client, its retries, time-outs and the HTTP in between are the real ones.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kit import trajectory

from lit_rag.errors import InputError
from lit_rag.judges import Judge, JudgeCase, judge_signals, parse_number, parse_yes_no
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


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        answer = prompt.rsplit("A: ", 1)[-1]
        server: _JudgeServer = self.server  # type: ignore[assignment]
        with server.lock:
            server.hits[prompt] += 1
            server.keys.append(self.headers.get("Authorization", ""))
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
        reply = REPLIES.get(answer.split("-")[0], "no")
        message = {"role": "assistant", "content": reply}
        completion = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
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
    assert server.requests() == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lit-rag reward llm_judge: 2/4 judge verdict(s) failed (first: timeout); judge judge; "
        "they score failure_reward -0.5"
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
