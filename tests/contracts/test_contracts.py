"""Typed contracts between environments and the rewards / algorithms that read their trajectories
(docs/STYLE.md 19): a wrong or missing one fails at once naming both plugins; the right one gives
the rewards the tests of each method pin; a pruned tree survives a checkpoint with its type.

Hand-built corpus: "Where was the founder of Orbel Mills born?" needs g1 then g2."""

import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from helpers import ScriptedPolicy

import lit_rag.api as api
from lit_rag.api import (
    Branch,
    Contract,
    EvoRagBranch,
    InputError,
    R2AGEpisode,
    R2AGTree,
    SearchEpisode,
    TreeVertex,
)
from lit_rag.data.datamodule import QADataModule
from lit_rag.plugins.algorithms.dpo import preference_pairs
from lit_rag.plugins.environments.retrieval_tree import RetrievalTreeEnvironment
from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.evo_rag import EvoRagReward
from lit_rag.plugins.rewards.r2ag import R2AGReward
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.reward_model import sibling_pairs, trajectory_text
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Vell Works", "Vell Works makes boats in the city of Ardun."),
]
EX = Example(
    id="q1",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    references=[CORPUS[0]],
    gold_ids=["g1", "g2"],
)
PARAMS = SamplingParams(max_new_tokens=512)
EXPANSION = (
    "<think>first the founder</think><base-Q>who founded Orbel Mills</base-Q>"
    "<predicted-Q>where was Mira Tolvan born</predicted-Q>"
)


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def tree_trajectories(tok, retriever):
    env = RetrievalTreeEnvironment(retriever, top_k=1)
    return env.rollout([EX], ScriptedPolicy(tok, [[EXPANSION]]), 1, PARAMS)


def search_trajectories(tok, retriever):
    env = SearchAgentEnvironment(retriever, top_k=1, max_turns=2, evaluate=False)
    calls = [["<search>Mira Tolvan born</search>"], ["<answer>Kessa</answer>"]]
    return env.rollout([EX], ScriptedPolicy(tok, calls), 1, PARAMS)


def single_turn_trajectories(tok):
    return SingleTurnEnvironment().rollout(
        [EX], ScriptedPolicy(tok, [["<answer>Kessa</answer>"]]), 1, PARAMS
    )


def bare(contract=None, steps=(), example=EX, group=0) -> Trajectory:
    e = torch.zeros(0, dtype=torch.long)
    return Trajectory(example, group, e, e, e, e.float(), "", list(steps), contract=contract)


# ---- (a) a reward given another environment's trajectories ----------------------------------
def test_a_reward_given_another_environments_trajectories_names_both(tiny_policy, retriever):
    _, tok = tiny_policy
    searched = search_trajectories(tok, retriever)
    assert searched[0].contract == SearchEpisode("answer", 1)
    with pytest.raises(InputError) as err:
        R2AGReward()(searched)
    assert str(err.value) == (
        "reward r2ag needs R2AGEpisode from environment retrieval_tree on every trajectory; "
        "the trajectory of example 'q1' (group 0) has SearchEpisode from environment search_agent"
    )
    # single_turn hands no typed data: the message names it and says the trajectory has none
    with pytest.raises(
        InputError,
        match=(
            "reward r2ag needs R2AGEpisode from environment retrieval_tree on every trajectory; "
            r"the trajectory of example 'q1' \(group 0\) has none \(environment single_turn "
            r"hands no R2AGEpisode\)"
        ),
    ):
        R2AGReward()(single_turn_trajectories(tok))
    # EVO-RAG's reward on R2AG's trajectories, before any step is scored or judged
    with pytest.raises(
        InputError,
        match=(
            "reward evo_rag needs EvoRagBranch from environment query_rewriter on every "
            r"trajectory; the trajectory of example 'q1' \(group 0\) has R2AGEpisode from "
            "environment retrieval_tree"
        ),
    ):
        EvoRagReward()(tree_trajectories(tok, retriever))
    # the environment's own readers too: R2AG's forest on search-agent trajectories
    env = RetrievalTreeEnvironment(retriever)
    with pytest.raises(InputError, match="environment retrieval_tree \\(next_contexts\\) needs"):
        env.next_contexts(searched)


# ---- (b) a contract object of the wrong type -------------------------------------------------
def test_a_contract_of_the_wrong_type_fails_likewise():
    # the example-side tree on a trajectory: same environment, wrong type
    with pytest.raises(
        InputError,
        match=(
            "reward r2ag needs R2AGEpisode from environment retrieval_tree on every trajectory; "
            r"the trajectory of example 'q1' \(group 0\) has R2AGTree from environment "
            "retrieval_tree"
        ),
    ):
        R2AGReward()([bare(R2AGTree(depth=1))])
    # the old string keys, put where the contract goes: not a contract at all
    old = {"prior": [], "stop": False, "think": True, "segments": 1}
    with pytest.raises(InputError, match=r"has a dict, which is not a Contract"):
        R2AGReward()([bare(old)])
    # a trajectory of the right ones among wrong ones still fails (every trajectory is checked)
    good = bare(R2AGEpisode(depth=0, prior=[], think=True, stop=False, segments=1))
    with pytest.raises(InputError, match=r"example 'q1' \(group 3\) has SearchEpisode"):
        R2AGReward()([good, bare(SearchEpisode("answer", 1), group=3)])
    # optional readers (DPO, the reward model) also refuse what is not a contract
    with pytest.raises(
        InputError,
        match=(
            r"algorithm dpo reads Branch on a trajectory; the trajectory of example 'q1' "
            r"\(group 0\) has a dict, which is not a Contract"
        ),
    ):
        preference_pairs([bare(old)], torch.zeros(1), margin=0.2)


def test_old_meta_keys_are_the_users_own_and_read_by_nothing():
    """``meta`` is free-form: the R2AG keys there are not the reward's input any more."""
    t = bare(steps=[Step("base", "q", ["g1"])])
    t.meta.update({"prior": [], "stop": False, "think": True, "segments": 1})
    with pytest.raises(InputError, match="has none"):
        R2AGReward()([t])


# ---- (c) the happy path gives the rewards each method's tests pin ----------------------------
def test_the_right_contract_gives_the_pinned_rewards(tiny_policy, retriever):
    _, tok = tiny_policy
    (t,) = tree_trajectories(tok, retriever)
    assert t.contract.prior == [] and t.contract.think and t.contract.segments == 2
    assert t.meta == {}
    # as test_retrieval_tree pins: MH = 1 + 1.25 * 1 = 2.25, AP = 1.0, JH 0, format 0.02:
    # R = 0.2 * 2.25 + 0.2 * 1.0 + 0.02 = 0.67
    assert float(R2AGReward()([t]).total[0]) == pytest.approx(0.67)
    # EVO-RAG's reward reads its passages from the branch: search hit (+1 x 2.0 - 0.02) then a
    # terminal answer (EM 1, F1 1: 1 x 0.05 - 0.02) at t_max 20, Discovery, t = 0 and 1
    # (w(1) = 0.95 start + 0.05 mid): 1.98 + 0.0525 - 0.0215 = 2.011
    steps = [Step("search", "founder of Orbel Mills", ["g1"]), Step("answer", None, [], "Kessa")]
    branch = EvoRagBranch(state="0:0", step=0, passages={"g1": CORPUS[0]})
    reward = EvoRagReward(t_max=20, stage="discovery")
    reward._embed = lambda texts: torch.eye(len(texts))
    assert float(reward.returns([bare(branch, steps)])[0]) == pytest.approx(2.011)


def test_sibling_readers_take_any_branch_and_fall_back_to_the_group():
    """DPO and the reward model pair by ``Branch.state`` (any environment's subclass); a
    trajectory without one (or with another environment's contract) is its prompt group."""
    steps = [Step("search", "a", []), Step("answer", None, [], "x")]
    rows = [bare(Branch("s", 1), steps), bare(EvoRagBranch("s", 1), steps)]
    rows[1].completion_ids = torch.tensor([1])
    returns = torch.tensor([1.0, 0.0])
    assert preference_pairs(rows, returns, margin=0.2) == [(0, 1)]
    assert trajectory_text(rows[0]) == "\nanswer: x"  # the action at the branch's step 1
    # groups 0 and 1, no branch: two states of one sibling each, no pair
    loose = [bare(None, steps, group=0), bare(SearchEpisode("answer", 0), steps, group=1)]
    loose[1].completion_ids = torch.tensor([1])
    assert preference_pairs(loose, returns, margin=0.2) == []
    assert trajectory_text(loose[0]) == "\nsearch: a"  # step 0
    assert sibling_pairs(loose, RewardBreakdown(total=returns)) == []


# ---- resume: a pruned tree keeps its type through a checkpoint ----------------------------
def test_forest_contexts_survive_a_checkpoint_typed(tmp_path):
    tree = R2AGTree(depth=1, retrieved=["g1"], tree=[TreeVertex("who founded", "base", ["g1"], 1)])
    pruned = Example("q1", "?", ["Kessa"], [CORPUS[0]], ["g1", "g2"], {"hops": 2}, tree)
    dm = QADataModule(train="synthetic", val=None, forest=True)
    assert dm.add_contexts([pruned, EX]) == 2
    assert set(dm.next) == {("q1", ("g1",)), ("q1", ())}
    path = tmp_path / "state.pt"
    torch.save(dm.state_dict(), path)
    state = torch.load(path, weights_only=True)  # plain types only, as a checkpoint loads
    restored = QADataModule(train="synthetic", val=None, forest=True)
    restored.load_state_dict(state)
    assert list(restored.next.values()) == [pruned, EX]
    assert isinstance(restored.next["q1", ("g1",)].contract.tree[0], TreeVertex)
    # a checkpoint is data: a type it names is looked up among the loaded contracts, never
    # imported (the module below is never imported)
    for name in ("builtins:dict", "os:system", "lit_rag_evil.payload:Contract"):
        with pytest.raises(InputError, match=f"contract type '{name}' is not one this run's"):
            Contract.from_dict({"type": name, "fields": {}})
    assert "lit_rag_evil.payload" not in sys.modules


def test_a_plugin_writes_its_own_contract_in_a_few_lines():
    """The docs' example: a dataclass with a producer, read with ``of``."""

    @dataclass
    class Turns(Contract):
        producer: ClassVar[str] = "my_agent"
        turns: int

    t = bare(Turns(turns=3))
    assert Turns.of(t, consumer="reward brevity").turns == 3
    with pytest.raises(InputError, match="reward brevity needs Turns from environment my_agent"):
        Turns.of(bare(SearchEpisode("answer", 1)), consumer="reward brevity")


def test_the_methods_contracts_are_public_api_from_contracts_methods():
    for name in ("R2AGEpisode", "R2AGTree", "SearchEpisode", "EvoRagBranch"):
        assert name in api.__all__
        assert getattr(api, name).__module__ == "lit_rag.contracts.methods"
        assert issubclass(getattr(api, name), Contract)
    assert {"Contract", "Branch", "R2AGInference", "TreeVertex"} <= set(api.__all__)
    assert issubclass(EvoRagBranch, Branch)
