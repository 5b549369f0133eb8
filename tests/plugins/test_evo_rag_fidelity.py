"""EVO-RAG as the paper has it, worked by hand: Algorithm 1's
collect-then-train DPO loop, the preference model's L_RM, pair selection on the reward with
delta = 0.2, pairs only from different actions, the trajectory prefix the model reads, and the
refusal judge on the current (kept) evidence."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import lightning as L
import pytest
import torch

from lit_rag.api import EvoRagBranch
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.dpo import DPO, preference_pairs
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.rewards.evo_rag import (
    COMPONENTS,
    ChatJudgeVerifier,
    EvoRagReward,
    GoldCoverageVerifier,
    judge_verdict,
)
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.trainer.reward_model import (
    RewardModelModule,
    pairwise_loss,
    sibling_pairs,
    trajectory_text,
)
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

EX = Example(
    id="q",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1", "g2"],
)
G1 = Passage("g1", "Mira Tolvan", "Mira Tolvan, founder of Orbel Mills, was born in Kessa.")
TINY = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))


def sibling(action_token: int, state="s", example=EX, steps=(), branch_step=0) -> Trajectory:
    """A sibling at ``state`` whose action there is one completion token."""
    return Trajectory(
        example,
        0,
        torch.tensor([1, 2]),
        torch.tensor([action_token]),
        torch.ones(1),
        torch.zeros(1),
        "",
        steps=list(steps),
        prompt_text="STATE",
        contract=EvoRagBranch(state=state, step=branch_step),
    )


# ---- item 7: pairs only from branches ending in different actions ----------------------------
def test_identical_actions_form_no_pair_and_the_widest_different_pair_is_chosen():
    # state s: actions 7, 7, 8 with returns 1.0, 0.0, 0.5. The best (1.0) and the worst (0.0)
    # took the same action 7: no gradient, not a pair. Different-action pairs: (0, 2) gap 0.5,
    # (2, 1) gap 0.5; the first of the widest in rank order (best first) is kept: (0, 2).
    rows = [sibling(7), sibling(7), sibling(8)]
    returns = torch.tensor([1.0, 0.0, 0.5])
    assert preference_pairs(rows, returns, margin=0.2) == [(0, 2)]
    # state t: both siblings took action 9 (gap 3.0): nothing to prefer
    same = [sibling(9, state="t"), sibling(9, state="t")]
    assert preference_pairs(same, torch.tensor([3.0, 0.0]), margin=0.2) == []
    # the reward model's pairs follow the same rule (Delta = 0.3): only 1.0 vs 0.5 and 0.5 vs 0.0
    breakdown = RewardBreakdown(total=returns, components={k: torch.zeros(3) for k in COMPONENTS})
    assert sorted(round(p["margin"], 6) for p in sibling_pairs(rows, breakdown, threshold=0.3)) == [
        0.5,
        0.5,
    ]


# ---- item 6: selection on the reward with delta = 0.2 by default ------------------------------
def test_selection_defaults_to_the_reward_with_margin_0_2():
    dpo = DPO()
    assert dpo.selection == "return" and dpo.margin == 0.2
    # gaps 0.19 (no pair) and 0.21 (a pair) on the reward's own scale
    rows = [sibling(1, "a"), sibling(2, "a"), sibling(1, "b"), sibling(2, "b")]
    assert preference_pairs(rows, torch.tensor([0.19, 0.0, 0.21, 0.0]), margin=0.2) == [(2, 3)]
    dpo.scorer = lambda ts: torch.tensor([0.0, 9.0, 0.0, 9.0])  # attached, but not asked by default
    batch = dpo.prepare(rows, RewardBreakdown(total=torch.tensor([0.19, 0.0, 0.21, 0.0])))
    assert batch.size == 2 and "rm_agreement" not in batch.metrics


# ---- item 8: the model embeds the trajectory prefix (s_t, a_t) --------------------------------
def test_reward_model_reads_the_state_and_the_action_not_the_rest_of_the_branch():
    steps = [
        Step("search", "founder of Orbel Mills", ["g1"], ""),
        Step("search", "Mira Tolvan born", [], ""),
        Step("answer", None, [], "Kessa"),
    ]
    t = sibling(1, steps=steps, branch_step=1)
    # prefix: the state's prompt and the action at step 1 only
    assert trajectory_text(t) == "STATE\nsearch: Mira Tolvan born"
    assert trajectory_text(t, view="branch") == "STATE\nsearch: Mira Tolvan born\nanswer: Kessa"


# ---- item 5: L_RM = -1/7 sum_k log sigmoid(f_k(x+) - f_k(x-)) ----------------------------------
def test_reward_model_loss_is_the_papers_by_default_per_component_as_an_option():
    chosen = torch.tensor([[2.0, 0.0]])  # two heads
    rejected = torch.tensor([[1.0, 1.0]])
    # overall: diffs (1, -1): -(log s(1) + log s(-1)) / 2 = (0.31326 + 1.31326) / 2 = 0.81326
    expect_overall = -(math.log(1 / (1 + math.exp(-1))) + math.log(1 / (1 + math.exp(1)))) / 2
    assert float(pairwise_loss(chosen, rejected)) == pytest.approx(expect_overall, rel=1e-5)
    # per component with signs (+1, -1): head 2 learns the reverse order: diffs (1, 1) -> 0.31326
    signs = torch.tensor([[1.0, -1.0]])
    assert float(pairwise_loss(chosen, rejected, signs)) == pytest.approx(
        -math.log(1 / (1 + math.exp(-1))), rel=1e-5
    )

    def module(objective):
        m = RewardModelModule(encoder=TINY, heads=2, objective=objective)
        table = {"x+": chosen[0], "x-": rejected[0]}
        m.forward = lambda texts: torch.stack([table[t] for t in texts])  # fixed head scores
        return m

    pair = [{"chosen": "x+", "rejected": "x-", "signs": [1.0, -1.0]}]
    assert float(module("overall")._pair_step(pair)[0]) == pytest.approx(expect_overall, rel=1e-5)
    assert float(module("per_component")._pair_step(pair)[0]) == pytest.approx(0.31326, rel=1e-4)
    with pytest.raises(
        ValueError, match="objective 'signs' is not known; allowed: overall, per_component"
    ):
        RewardModelModule(encoder=TINY, objective="signs")


# ---- item 4: Algorithm 1, collect M episodes then E epochs of DPO ----------------------------
def _pairs_at(n: int, offset: int) -> tuple[list[Trajectory], RewardBreakdown]:
    """``n`` states, each with a chosen (return 1) and a rejected (return 0) action."""
    rows = [
        sibling(offset + 2 * i + side, state=f"{offset}-{i}") for i in range(n) for side in (0, 1)
    ]
    return rows, RewardBreakdown(total=torch.tensor([1.0, 0.0] * n))


def test_dpo_collects_then_trains_in_mini_batches_over_epochs():
    dpo = DPO(collect_steps=2, epochs=2, max_pairs=2)
    first = dpo.prepare(*_pairs_at(2, 100))  # step 1: store 2 pairs, no update
    assert first.size == 0 and float(first.metrics["pairs_stored"]) == 2.0
    batch = dpo.prepare(*_pairs_at(1, 200))  # step 2 (= M): 3 stored pairs -> 6 rows
    assert batch.size == 6 and float(batch.metrics["pairs_used"]) == 3.0
    # rows: chosen, rejected per pair in store order (completion tokens 100/101, 102/103, 200/201)
    assert batch.batch.input_ids[:, -1].tolist() == [100, 101, 102, 103, 200, 201]
    # E = 2 epochs x ceil(3 pairs / 2) = 2 mini-batches each = 4 optimizer steps; a chunk of 2
    # pairs is scaled 1/2, of 1 pair 1/1 (the loss is the mean over the step's pairs)
    minis = batch.batch.mini_batches
    assert len(minis) == 4 and sorted(s for _, s in minis) == [0.5, 0.5, 1.0, 1.0]
    for epoch in (minis[:2], minis[2:]):  # each epoch sees every row once, pairs kept whole
        rows = torch.cat([r for r, _ in epoch]).tolist()
        assert sorted(rows) == list(range(6)) and all(r % 2 == 0 for r in rows[0::2])
    assert dpo.stored == [] and dpo.collected == 0  # the store starts over
    # the online variant: each step's pairs, one optimizer step
    online = DPO().prepare(*_pairs_at(3, 0))
    assert [(r.tolist(), s) for r, s in online.batch.mini_batches] == [(list(range(6)), 1 / 3)]


def test_dpo_store_goes_through_a_checkpoint(tmp_path):
    dpo = DPO(collect_steps=3)
    dpo.prepare(*_pairs_at(2, 10))
    torch.save({"algorithm": dpo.state_dict()}, tmp_path / "c.pt")
    fresh = DPO(collect_steps=3)
    # plain tensors
    fresh.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True)["algorithm"])
    assert fresh.collected == 1 and len(fresh.stored) == 2
    assert torch.equal(fresh.stored[1]["rejected"]["completion_ids"], torch.tensor([13]))
    for d in (dpo, fresh):  # both continue alike: step 2 stores, step 3 trains on 2 + 2 + 2 pairs
        d.prepare(*_pairs_at(2, 20))
    assert [float(d.prepare(*_pairs_at(2, 30)).metrics["pairs_used"]) for d in (dpo, fresh)] == [
        6.0,
        6.0,
    ]


class _Distinct(RolloutEngine):
    """Every sample a different single token (10, 11, 12, ...): the two samples of a prompt are
    always different actions, so each prompt gives exactly one pair."""

    def __init__(self) -> None:
        self.next = 10

    def generate(self, prompts, params):
        out = []
        for _ in prompts:
            out.append(Generation(torch.tensor([self.next]), torch.zeros(1), str(self.next), True))
            self.next += 1
        return out


def test_policy_module_runs_one_optimizer_step_per_mini_batch(tmp_path):
    """Through Lightning: 2 collect steps of 2 questions x 2 samples = 4 pairs, E = 2, 2 pairs per
    step -> no update at step 1, then 2 epochs x 4 / 2 = 4 optimizer steps at step 2."""
    from lit_rag.data.datamodule import QADataModule
    from tests.helpers import EvenTokenReward

    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": ["x"]} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # margin -1 keeps every pair of different actions, whatever their even-token rewards
    module = PolicyModule(
        policy=TINY,
        environment=SingleTurnEnvironment(),
        reward=EvenTokenReward(),
        algorithm=DPO(collect_steps=2, epochs=2, max_pairs=2, margin=-1.0),
        group_size=2,
        engine=_Distinct(),
        sampling=SamplingParams(max_new_tokens=4),
        micro_batch_size=2,
        optimizer=OptimizerSettings(lr=1e-3),
    )
    steps_seen = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            steps_seen.append(trainer.global_step)

    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[Watch()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(
        module, datamodule=QADataModule(train=str(tmp_path / "train.jsonl"), val=None, batch_size=2)
    )
    assert float(trainer.callback_metrics["rollout/pairs_used"]) == 4.0
    assert float(trainer.callback_metrics["train/optimizer_steps"]) == 4.0
    assert steps_seen == [0, 4]


# ---- item 9: the refusal judge, on the evidence the agent still keeps -------------------------
class _Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that answers like a careful judge: yes when the
    evidence names the answer (Kessa), no otherwise. Records the prompts it saw."""

    seen: ClassVar[list[str]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        type(self).seen.append(prompt)
        evidence = prompt.split("Evidence:", 1)[1]
        reply = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": "Yes." if "Kessa" in evidence else "No.",
                    },
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Judge.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _episodes():
    hit = Step("search", "founder of Orbel Mills", ["g1"], "")
    answer = Trajectory(
        EX,
        0,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0),
        torch.zeros(0),
        "",
        steps=[hit, Step("answer", None, [], "Kessa")],
        contract=EvoRagBranch(state="0:0", passages={"g1": G1}),
    )
    refuse = Trajectory(
        EX,
        0,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0),
        torch.zeros(0),
        "",
        steps=[hit, Step("refuse", None, [], "")],
        contract=EvoRagBranch(state="0:0", passages={"g1": G1}),
    )
    return answer, refuse


def _reward(verifier) -> EvoRagReward:
    r = EvoRagReward(t_max=4, verifier=verifier)
    r._embed = lambda texts: torch.eye(len(texts))
    return r


def test_a_correct_answer_outscores_a_refusal_when_the_judge_says_the_evidence_suffices(judge_url):
    # Discovery, T_max 4: w(t=0) retrieval 2.0, step 0.02; w(t=1) = 0.75 start + 0.25 mid:
    # refusal 0.5, step 0.75*0.02 + 0.25*0.05 = 0.0275, answer 0.75*0.05 + 0.25*0.10 = 0.0625.
    # Both episodes: t=0 a SEARCH that hits gold g1 (not g2): +1 x 2.0 - 1 x 0.02 = 1.98.
    # answer: 1.98 + (EM 1 + F1 1)/2 x 0.0625 - 0.0275 = 2.015
    # refuse, judge "enough" (g1 names Kessa): 1.98 - 1 x 0.5 - 0.0275 = 1.4525
    # refuse, gold coverage 1/2 < 1 "not enough":  1.98 + 1 x 0.5 - 0.0275 = 2.4525
    # (the old inversion)
    answer, refuse = _episodes()
    judge = ChatJudgeVerifier(model="judge", base_url=judge_url, max_retries=0)
    returns = _reward(judge)([answer, refuse]).total.sum(-1)
    assert returns.tolist() == pytest.approx([2.015, 1.4525], abs=1e-6)
    assert returns[0] > returns[1]
    stand_in = _reward(GoldCoverageVerifier())([answer, refuse]).total.sum(-1)
    assert stand_in.tolist() == pytest.approx([2.015, 2.4525], abs=1e-6)
    assert (
        len(_Judge.seen) == 1
        and "- Mira Tolvan: Mira Tolvan, founder of Orbel Mills" in _Judge.seen[0]
    )
    _reward(judge)([refuse])  # a new reward, the same judge: the verdict is cached
    assert len(_Judge.seen) == 1


def test_the_judge_does_not_see_documents_a_backtrack_dropped(judge_url, tmp_path):
    # search (hit g1), BACKTRACK (drops g1 from the state), REFUSE: the evidence is empty, the
    # judge says no, the refusal is right: +1 x w_refusal(t=2) = 0.5
    steps = [
        Step("search", "founder of Orbel Mills", ["g1"], ""),
        Step("backtrack", None, [], ""),
        Step("refuse", None, [], ""),
    ]
    episode = Trajectory(
        EX,
        0,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0),
        torch.zeros(0),
        "",
        steps=steps,
        contract=EvoRagBranch(state="0:0", passages={"g1": G1}),
    )
    cache = tmp_path / "verdicts.jsonl"
    judge = ChatJudgeVerifier(
        model="judge", base_url=judge_url, max_retries=0, cache_file=str(cache)
    )
    out = _reward(judge)([episode])
    assert float(out.components["refusal"][0, 2]) == 1.0
    assert (
        len(_Judge.seen) == 1 and "Mira Tolvan" not in _Judge.seen[0] and "(none)" in _Judge.seen[0]
    )
    # verdicts persist: a new judge reads the file and asks nothing
    assert json.loads(cache.read_text()) == {
        "question": EX.question,
        "evidence": [],
        "enough": False,
    }
    ChatJudgeVerifier(model="judge", base_url=judge_url, cache_file=str(cache))(EX, [])
    assert len(_Judge.seen) == 1


def test_a_judge_that_cannot_be_reached_stops_with_one_line():
    judge = ChatJudgeVerifier(
        model="judge", base_url="http://127.0.0.1:9/v1", timeout=2, max_retries=0
    )
    with pytest.raises(
        RuntimeError, match=r"^refusal judge judge at http://127.0.0.1:9/v1 failed after 0 retries"
    ):
        judge(EX, [G1])


def test_judge_verdict_reads_untrusted_text_without_raising():
    assert (
        judge_verdict("Yes")
        and judge_verdict(" yes, enough")
        and not judge_verdict("No, yes later")
    )
    assert not judge_verdict("") and not judge_verdict("maybe") and not judge_verdict("eyes")
    assert not judge_verdict(None)  # type: ignore[arg-type]
