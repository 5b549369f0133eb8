"""EVO-RAG's query-rewriting environment driven by a scripted policy (no model):
search -> backtrack -> answer, search -> refuse, T_max, and sibling branches for DPO."""

import pytest
import torch
from helpers import ScriptedPolicy

from lit_rag import registry
from lit_rag.plugins.algorithms.dpo import DPO
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment, parse_action
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.evo_rag import EvoRagReward
from lit_rag.rollout.base import SamplingParams
from lit_rag.types import Example, Passage

CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Vell Works", "Vell Works makes boats in the city of Ardun."),
]
EX = Example(
    id="q1",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1", "g2"],
)
PARAMS = SamplingParams(max_new_tokens=512)


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def test_parse_action():
    assert parse_action("<think>x</think><search> Orbel Mills </search>") == (
        "search",
        "Orbel Mills",
    )
    assert parse_action("<backtrack></backtrack><search>q</search>") == ("backtrack", "")
    assert parse_action("<answer>Kessa</answer>") == ("answer", "Kessa")
    assert parse_action("<refuse></refuse>") == ("refuse", "")
    assert parse_action("<search></search>") == ("invalid", "")
    assert parse_action("<think><answer>x</answer></think> nothing") == ("invalid", "")


def test_search_backtrack_answer_and_search_refuse(tiny_policy, retriever):
    _, tok = tiny_policy
    env = QueryRewriterEnvironment(retriever, top_k=1, t_max=5, branch_states=0)
    other = Example(
        id="q2", question="What does Vell Works make?", answers=["boats"], gold_ids=["n1"]
    )
    engine = ScriptedPolicy(
        tok,
        [
            ["<search>boats Ardun</search>", "<search>Vell Works</search>"],
            ["<backtrack></backtrack>", "<refuse></refuse>"],
            ["<search>Orbel Mills founder</search>"],
            ["<answer>Kessa</answer>"],
        ],
    )
    first, second = env.validation_rollout([EX, other], engine, PARAMS)
    assert [s.action for s in first.steps] == ["search", "backtrack", "search", "answer"]
    assert first.steps[0].passage_ids == ["n1"] and first.steps[2].passage_ids == ["g1"]
    # after BACKTRACK the dropped sub-query and its document are gone from the state
    assert "boats Ardun" in engine.prompts[1][0]
    assert (
        "boats Ardun" not in engine.prompts[2][0]
        and "Vell Works makes boats" not in engine.prompts[2][0]
    )
    assert env.extract_answer(first) == "Kessa"
    assert [s.action for s in second.steps] == ["search", "refuse"]
    m = env.metrics([first, second])
    assert float(m["steps"]) == 3.0 and float(m["refusal_rate"]) == 0.5
    assert float(m["backtrack_rate"]) == pytest.approx(0.125)  # (1/4 + 0/2) / 2
    # the step rewards read these episodes: the refusal had enough evidence (n1 retrieved) -> -1
    r = EvoRagReward()
    r._embed = lambda texts: torch.eye(len(texts))
    raw = r.step_rewards(other, second.steps)
    assert raw["refusal"] == [0.0, -1.0] and raw["retrieval"] == [1.0, 0.0]


def test_state_carries_the_kept_rationales(tiny_policy, retriever):
    """s_t = (q_<t, D_<t, A_<t) (Section 3.2): each kept sub-query's rationale (its <think>) is in
    the next states; a BACKTRACK drops it with the sub-query; state_rationales false omits it."""
    _, tok = tiny_policy
    calls = [
        ["<think>first the founder</think><search>boats Ardun</search>"],
        ["<think>wrong company</think><backtrack></backtrack>"],
        ["<think>the founder of Orbel Mills</think><search>Orbel Mills founder</search>"],
        ["<answer>Kessa</answer>"],
    ]
    env = QueryRewriterEnvironment(retriever, top_k=1, t_max=5, branch_states=0)
    engine = ScriptedPolicy(tok, [list(c) for c in calls])
    env.validation_rollout([EX], engine, PARAMS)
    state_1, state_2, state_3 = (engine.prompts[i][0] for i in (1, 2, 3))
    assert "Thought 1: first the founder\nSub-query 1: boats Ardun" in state_1
    assert "first the founder" not in state_2 and "wrong company" not in state_2  # back at s_0
    assert "Thought 1: the founder of Orbel Mills\nSub-query 1: Orbel Mills founder" in state_3
    plain = QueryRewriterEnvironment(
        retriever, top_k=1, t_max=5, branch_states=0, state_rationales=False
    )
    engine = ScriptedPolicy(tok, [list(c) for c in calls])
    plain.validation_rollout([EX], engine, PARAMS)
    assert (
        "Thought" not in engine.prompts[1][0] and "Sub-query 1: boats Ardun" in engine.prompts[1][0]
    )


def test_t_max_ends_the_episode(tiny_policy, retriever):
    _, tok = tiny_policy
    env = QueryRewriterEnvironment(retriever, t_max=2, branch_states=0)
    engine = ScriptedPolicy(tok, [["hmm"], ["<search>x y</search>"]])
    (t,) = env.validation_rollout([EX], engine, PARAMS)
    assert [s.action for s in t.steps] == ["invalid", "search"] and env.extract_answer(t) == ""


def test_siblings_share_the_state_and_make_a_dpo_pair(tiny_policy, retriever):
    _, tok = tiny_policy
    env = QueryRewriterEnvironment(retriever, top_k=1, t_max=4, branch_states=1)
    engine = ScriptedPolicy(
        tok,
        [
            # the main episode at t=0 and the sibling it starts there, generated together
            ["<search>Orbel Mills founder</search>", "<refuse></refuse>"],
            ["<answer>Kessa</answer>"],  # main episode, t=1
        ],
    )
    trajectories = env.rollout([EX], engine, group_size=2, params=PARAMS)
    assert len(engine.prompts[0]) == 2 and engine.prompts[0][0] == engine.prompts[0][1]  # one state
    assert [(t.contract.state, t.contract.step) for t in trajectories] == [("0:0", 0), ("0:0", 0)]
    assert trajectories[0].prompt_text == trajectories[1].prompt_text  # the shared state
    assert [[s.action for s in t.steps] for t in trajectories] == [["search", "answer"], ["refuse"]]
    assert tok.decode(trajectories[1].completion_ids) == "<refuse></refuse>"  # the action compared
    reward = EvoRagReward()
    reward._embed = lambda texts: torch.eye(len(texts))
    returns = reward.returns(trajectories)
    # search hit (2.0 - 0.02) + answer at t=1 (0.0525 - 0.0215) = 2.011 vs refusal with no
    # evidence (unanswerable: +1 * 0.5 - 0.02 = 0.48): the main path is chosen
    assert returns.tolist() == pytest.approx([2.011, 0.48])
    batch = DPO(margin=0.2).prepare(trajectories, reward(trajectories))
    assert batch.size == 2 and float(batch.metrics["return_gap"]) == pytest.approx(1.531)
    assert registry.resolve("environment", "query_rewriter") is QueryRewriterEnvironment
