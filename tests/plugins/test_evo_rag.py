"""EVO-RAG's step rewards (Section 3.2), time-based weights (3.6, Table 1) and DPO (3.4),
worked by hand. The overlap encoder is a fixed table of unit vectors (no model)."""

import math

import pytest
import torch
from kit import trajectory

from lit_rag import registry
from lit_rag.api import EvoRagBranch
from lit_rag.callbacks import RewardWeightScheduler
from lit_rag.plugins.algorithms.dpo import DPO, preference_pairs
from lit_rag.plugins.rewards.evo_rag import TABLE_1, EvoRagReward, GoldCoverageVerifier, interpolate
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory
from tests.helpers import EVO_RAG_TABLE_1 as PAPER_TABLE_1
from tests.helpers import train_batch

EX = Example(
    id="q",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1", "g2"],
)
VECTORS = {  # cos(a, a2) = 0.8, cos(a, b) = 0, cos(a, c) = -0.6
    "a": [1.0, 0.0],
    "a2": [0.8, 0.6],
    "b": [0.0, 1.0],
    "c": [-0.6, 0.8],
}


def reward(**kw) -> EvoRagReward:
    r = EvoRagReward(**kw)
    r._embed = lambda texts: torch.tensor([VECTORS[t] for t in texts])
    return r


def traj(*steps: Step, example=EX) -> Trajectory:
    return trajectory(example=example, steps=steps, contract=EvoRagBranch(state="0:0", step=0))


def test_each_step_reward_by_hand():
    r = reward(t_max=20)
    raw = r.step_rewards(
        EX,
        [
            Step("search", "a", ["g1"]),  # t=0: hit -> r_ret +1; first query -> r_dup 0
            Step("search", "a2", ["x"]),  # t=1: miss -> -1; r_dup = -max(cos(a2, a)) = -0.8
            Step("backtrack"),  # t=2: r_bt = -1
            Step("refuse"),  # t=3: evidence {g1, x} lacks g2 -> not enough -> +1
            Step("answer", text="the Kessa"),  # t=4, terminal: EM 1, F1 1 -> (1 + 1) / 2 = 1
        ],
    )
    assert raw["retrieval"] == [1.0, -1.0, 0.0, 0.0, 0.0]
    assert raw["overlap"] == pytest.approx([0.0, -0.8, 0.0, 0.0, 0.0])
    assert raw["backtrack"] == [0.0, 0.0, -1.0, 0.0, 0.0]
    assert raw["refusal"] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert raw["step"] == [-1.0] * 5
    assert raw["answer"] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert raw["action"] == [0.0] * 5  # p(t) = t / 20 < 0.3 for t <= 4: early searches are free


def test_action_penalty_boundary_at_p_0_3():
    # T_max = 10: p(2) = 0.2 < 0.3 (free), p(3) = 0.3 >= 0.3 (pays -1[r_dup < 0])
    r = reward(t_max=10)
    steps = [
        Step("search", "a", ["x"]),
        Step("search", "b", ["x"]),
        Step("search", "a2", ["x"]),
        Step("search", "c", ["x"]),
    ]
    raw = r.step_rewards(EX, steps)
    # overlaps: t=1 b vs a: -0 ; t=2 a2 vs {a, b}: -max(0.8, 0.6) = -0.8 ;
    # t=3 c vs {a,b,a2}: -max(-0.6, 0.8, 0.0) = -0.8
    assert raw["overlap"] == pytest.approx([0.0, 0.0, -0.8, -0.8])
    assert raw["action"] == [
        0.0,
        0.0,
        0.0,
        -1.0,
    ]  # t=2 overlaps but is early; t=3 is late and overlaps
    # a late search with no overlap (r_dup = 0, not < 0) pays nothing
    raw = r.step_rewards(
        EX,
        [Step("search", "a", ["x"])] * 0
        + [Step("answer", text="x")] * 3
        + [Step("search", "a", ["x"])],
    )
    assert raw["action"] == [0.0, 0.0, 0.0, 0.0]


def test_refusal_when_evidence_is_enough_is_penalised_and_answer_only_at_the_end():
    raw = reward().step_rewards(EX, [Step("search", "a", ["g1", "g2"]), Step("refuse")])
    assert raw["refusal"] == [0.0, -1.0]  # both gold retrieved: answerable -> -1
    raw = reward().step_rewards(EX, [Step("answer", text="Kessa"), Step("search", "a", ["g1"])])
    assert raw["answer"] == [0.0, 0.0]  # not the terminal step
    assert GoldCoverageVerifier(min_coverage=0.5)(EX, [Passage("g1", "", "")]) is True


def test_answerable_verifier_reads_the_label_not_the_evidence():
    from lit_rag.plugins.rewards.evo_rag import AnswerableVerifier

    r = EvoRagReward(verifier=AnswerableVerifier())
    # nothing retrieved yet, but the question has gold: refusing is wrong (-1)
    assert r.step_rewards(EX, [Step("refuse")])["refusal"] == [-1.0]
    unanswerable = Example(id="u", question="?", answers=[], gold_ids=[])
    assert r.step_rewards(unanswerable, [Step("refuse")])["refusal"] == [1.0]


def test_weighted_total_uses_the_time_dependent_weights():
    r = reward(t_max=20, stage="discovery")
    out = r([traj(Step("search", "a", ["g1"]), Step("answer", text="Kessa"))])
    # t=0: w(0) = start weights: beta 2.0 * 1 + eta 0.02 * (-1) = 1.98
    # t=1: p = 0.05: eta = 0.95*0.02 + 0.05*0.05 = 0.0215; kappa = 0.95*0.05 + 0.05*0.10 = 0.0525
    #      total = -0.0215 + 0.0525 * 1 = 0.031
    assert out.total.shape == (1, 20)
    assert float(out.total[0, 0]) == pytest.approx(1.98)
    assert float(out.total[0, 1]) == pytest.approx(0.031)
    assert float(out.total[0, 2:].abs().sum()) == 0.0
    assert float(
        r.returns([traj(Step("search", "a", ["g1"]), Step("answer", text="Kessa"))])[0]
    ) == pytest.approx(2.011)


@pytest.mark.parametrize(
    "stage,expect",
    [
        ("discovery", {0: "start", 10: "half", 20: "mid"}),
        ("refinement", {0: "mid", 10: "half", 20: "end"}),
    ],
)
def test_scheduler_weights_at_0_half_and_t_max(stage, expect):
    r = reward(t_max=20, stage=stage)
    col = {"start": 0, "mid": 1, "end": 2}
    for t, where in expect.items():
        w = r.weights_at(t)
        assert set(w) == set(PAPER_TABLE_1)
        for k, (start, mid, end) in PAPER_TABLE_1.items():
            if where == "half":
                lo, hi = (start, mid) if stage == "discovery" else (mid, end)
                assert w[k] == pytest.approx((lo + hi) / 2), (k, t)
            else:
                assert w[k] == pytest.approx((start, mid, end)[col[where]]), (k, t)
    # the step penalty grows 0.02 -> 0.10 across the two stages (3.2)
    assert interpolate(0.02, 0.05, 0, 20) == 0.02 and interpolate(0.05, 0.10, 20, 20) == 0.10


def test_scheduler_callback_switches_anchors():
    class Module:
        reward = reward(stage="discovery")

    sched = RewardWeightScheduler(stage="discovery")
    sched.set_stage(Module, "refinement")
    assert (
        Module.reward.weights_at(0)["answer"] == 0.10
        and Module.reward.weights_at(20)["answer"] == 1.0
    )
    custom = RewardWeightScheduler(table={k: [1.0, 2.0, 3.0] for k in TABLE_1})
    custom.set_stage(Module, "discovery")
    assert Module.reward.weights_at(10)["retrieval"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="unknown EVO-RAG stage"):
        RewardWeightScheduler(stage="warmup").on_train_start(None, Module)
    with pytest.raises(ValueError, match="one length of at least 2"):
        RewardWeightScheduler(table={"answer": [1.0]})
    first = RewardWeightScheduler()  # no stage named: the reward's first
    first.on_train_start(None, Module)
    assert first.stage == "discovery" and Module.reward.weights_at(0)["answer"] == 0.05


def test_dpo_loss_worked_by_hand():
    # one pair; chosen token log-probs [-1, -2] (sum -3), rejected [-1, -1, -2] (sum -4)
    # reference: chosen sum -3.5, rejected sum -3.0
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    batch = train_batch(mask, logprobs=logp, ref_logprobs=ref)
    # standard: beta * ((-3 - -3.5) - (-4 - -3)) = 0.1 * (0.5 + 1.0) = 0.15 -> -log sigmoid(0.15)
    out = DPO(beta=0.1).loss(batch)
    assert float(out.loss) == pytest.approx(-math.log(1 / (1 + math.exp(-0.15))), rel=1e-6)
    # reference-free (the paper's equation): 0.1 * (-3 - -4) = 0.1
    out = DPO(beta=0.1, reference_free=True).loss(batch)
    assert float(out.loss) == pytest.approx(-math.log(1 / (1 + math.exp(-0.1))), rel=1e-6)
    assert DPO(reference_free=True).needs_reference is False and DPO().needs_reference is True


def test_pairs_come_from_siblings_with_enough_margin():
    e = torch.zeros(1, dtype=torch.long)

    def t(state, action, ex=EX):  # each sibling a different action (completion token)
        a = torch.tensor([action])
        branch = EvoRagBranch(state=state)
        return Trajectory(ex, 0, e, a, torch.ones(1), e.float(), "", contract=branch)

    rows = [t("s0", 1), t("s0", 2), t("s0", 3), t("s1", 1), t("s1", 2), t("s2", 1)]
    returns = torch.tensor([0.5, 1.0, 0.1, 0.3, 0.4, 9.0])
    # s0: best 1 (1.0), worst 2 (0.1): gap 0.9 >= 0.2; s1: gap 0.1 < 0.2; s2: a single branch
    assert preference_pairs(rows, returns, margin=0.2) == [(1, 2)]
    batch = DPO().prepare(rows, RewardBreakdown(total=returns))
    assert batch.size == 2 and float(batch.metrics["pairs"]) == 1.0
    assert registry.resolve("algorithm", "dpo") is DPO
    assert registry.resolve("reward", "evo_rag") is EvoRagReward


def test_local_model_verifier_reads_yes_or_no_and_caches():
    from lit_rag.models.loading import ModelConfig, TinyConfig
    from lit_rag.plugins.rewards.evo_rag import LocalModelVerifier

    verifier = LocalModelVerifier(
        ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
    )
    evidence = [Passage("g1", "Orbel Mills", "Orbel Mills was founded by Mira Tolvan.")]
    assert isinstance(verifier(EX, evidence), bool)  # a real (random) tiny model answers something
    asked = []
    verifier._cache.clear()
    verifier.reply = lambda text: asked.append(text) or " Yes, it is."
    assert verifier(EX, evidence) is True and verifier(EX, evidence) is True
    assert len(asked) == 1 and "Orbel Mills: Orbel Mills was founded by Mira Tolvan." in asked[0]
    verifier.reply = lambda text: "No."
    assert verifier(EX, []) is False
