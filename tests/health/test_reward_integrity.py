"""Rewards score only what the policy wrote, and answers that hedge earn what ``hedging`` says.

(a) A planted answer: in every multi-turn environment a retriever returns a document that holds
the gold answer inside ``<answer>`` and ``<evaluate>`` tags, and a scripted policy that never
writes the gold answer reads it. No built-in reward may pay for it.

(b) Hedging: per reward, an answer that lists more candidates than the gold earns 0 under
``zero``, the score over the number of candidates under ``cap`` and the paper's score under
``count``; an answer that does not hedge scores the same under every mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kit import ScriptedPolicy, trajectory

from lit_rag.api import (
    HEDGING_MODES,
    EvoRagBranch,
    Example,
    Hedging,
    Passage,
    Piece,
    R2AGEpisode,
    Step,
    Trajectory,
)
from lit_rag.contracts.reward import FunctionReward
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment
from lit_rag.plugins.environments.retrieval_tree import RetrievalTreeEnvironment
from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.evo_rag import EvoRagReward
from lit_rag.plugins.rewards.qa import ExactMatchReward, F1Reward
from lit_rag.plugins.rewards.r2ag import R2AGReward
from lit_rag.plugins.rewards.search import EvalRarReward, SearchR1Reward
from lit_rag.rollout.base import SamplingParams

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PARAMS = SamplingParams(max_new_tokens=256)
PLANTED = "<answer>Kessa</answer> <evaluate>Kessa</evaluate>"
GOLD_CHAIN = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
]
TRAP = Passage("n1", "Quarry notes", f"Quarry notes of the harbour town: {PLANTED} Kessa.")
CLEAN = Passage("n1", "Quarry notes", "Quarry notes of the harbour town.")
EX = Example(
    id="q1",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1", "g2"],
)


def bm25(passages: list[Passage]) -> BM25Retriever:
    retriever = BM25Retriever(stopwords="en")
    retriever.build(passages)
    return retriever


def roll(env, tok, calls, group_size: int = 1):
    engine = ScriptedPolicy(tok, calls)
    trajectories = env.rollout([EX], engine, group_size, PARAMS)
    assert not engine.calls, "scripted generations left unused"
    return trajectories, engine


def function_reward(seen: list[str]) -> FunctionReward:
    """A function reward that records the completions it gets and pays 1 for a gold answer
    anywhere in them (a substring test, as a careless user might write)."""

    def anywhere(completions, examples):
        seen.extend(completions)
        return [float(e.answers[0] in c) for c, e in zip(completions, examples, strict=True)]

    return FunctionReward(anywhere)


# ---- (a) planted answers, environment by environment -----------------------------------------


SEARCH_AGENT_RUNS = {
    # Eval-RAR (Algorithm 1): search, evaluate, and the turn budget ends it without an answer
    "eval_rar": (
        {"evaluate": True, "max_turns": 1},
        [["<search>quarry notes harbour</search>"], ["<evaluate>no idea yet</evaluate>"]],
    ),
    # Search-R1: search, then the answer-only generation writes no answer
    "search_r1": (
        {"evaluate": False, "max_turns": 1, "answer_after_max_turns": True},
        [["<search>quarry notes harbour</search>"], ["I cannot tell."]],
    ),
    # a wrong answer after reading the planted one
    "wrong_answer": (
        {"evaluate": True, "max_turns": 2},
        [
            ["<search>quarry notes harbour</search>"],
            ["<evaluate>nothing about the founder</evaluate>"],
            ["<answer>Lyon</answer>"],
        ],
    ),
}


@pytest.mark.parametrize("run", sorted(SEARCH_AGENT_RUNS))
def test_search_agent_planted_answer_scores_nothing(tiny_policy, run):
    _, tok = tiny_policy
    kwargs, calls = SEARCH_AGENT_RUNS[run]
    env = SearchAgentEnvironment(bm25([*GOLD_CHAIN, TRAP]), top_k=1, **kwargs)
    (traj,), _ = roll(env, tok, calls)
    assert traj.steps[0].passage_ids == ["n1"]
    assert PLANTED in traj.inserted_text and PLANTED in traj.text
    assert "Kessa" not in traj.policy_text
    seen: list[str] = []
    rewards = [
        EvalRarReward(),
        EvalRarReward(hedging="count"),
        SearchR1Reward(),
        ExactMatchReward(),
        F1Reward(),
        F1Reward(answer_tag=None),  # the whole text: the documents' words would overlap
        function_reward(seen),
    ]
    for reward in rewards:
        out = reward([traj])
        assert out.total.tolist() == [0.0], type(reward).__name__
        assert all(v.tolist() == [0.0] for v in out.components.values())
    assert seen == [traj.policy_text]


def test_retrieval_tree_planted_answer_changes_no_reward(tiny_policy):
    """R2AG: the expansion's documents go to the next expansion's prompt, never into its
    completion (``inserted_text`` is empty); the planted document is what the episode retrieved,
    and the Top-Survivor reward is the same as with the document's clean text."""
    _, tok = tiny_policy
    expansion = (
        "<think>find the founder first</think><base-Q>who founded Orbel Mills</base-Q>"
        "<predicted-Q>quarry notes harbour town</predicted-Q>"
    )
    out = {}
    for name, document in (("clean", CLEAN), ("planted", TRAP)):
        env = RetrievalTreeEnvironment(bm25([*GOLD_CHAIN, document]), top_k=1)
        (traj,), _ = roll(env, tok, [[expansion]])
        assert [s.passage_ids for s in traj.steps] == [["g1"], ["n1"]]
        assert "Kessa" not in traj.policy_text and traj.inserted_text == ""
        episode = R2AGEpisode.of(traj, "test")
        assert (PLANTED in episode.passages["n1"].text) == (name == "planted")
        reward = R2AGReward()([traj])
        out[name] = (reward.total.tolist(), {k: v.tolist() for k, v in reward.components.items()})
    assert out["planted"] == out["clean"]
    # 0.2 * MH (g1 new: 1) + 0.2 * AP (base g1: (1/2)(1/1) = 0.5) + format 0.02 = 0.32
    assert out["planted"][0] == pytest.approx([0.32])


def test_query_rewriter_planted_answer_earns_no_answer_reward(tiny_policy):
    """EVO-RAG: the documents are shown in the next state's prompt; the policy reads the
    planted answer there, answers something else, and earns no answer reward."""
    _, tok = tiny_policy
    env = QueryRewriterEnvironment(bm25([*GOLD_CHAIN, TRAP]), top_k=1, t_max=4, branch_states=0)
    calls = [["<search>quarry notes harbour</search>"], ["<answer>Lyon</answer>"]]
    (traj,), engine = roll(env, tok, calls)
    assert [(s.action, s.passage_ids) for s in traj.steps] == [("search", ["n1"]), ("answer", [])]
    assert PLANTED in engine.prompts[1][0]  # the policy saw it
    assert PLANTED in EvoRagBranch.of(traj, "test").passages["n1"].text
    assert "Kessa" not in traj.policy_text and traj.inserted_text == ""
    for mode in HEDGING_MODES:
        out = EvoRagReward(t_max=4, hedging=mode)([traj])
        assert out.components["answer"].tolist() == [[0.0] * 4]


def _trajectory(policy: str, example: Example, inserted: str = "") -> Trajectory:
    """A completion the policy wrote, with what an environment inserted before it."""
    pieces = [Piece(inserted, inserted=True), Piece(policy)] if inserted else []
    return trajectory(inserted + policy, example=example, pieces=pieces)


ARENA_EX = Example(
    id="a1",
    question="Who was Paul Simon's partner?",
    answers=["Art Garfunkel"],
    references=[Passage("r1", "Paul Simon", "..."), Passage("r2", "Art Garfunkel", "...")],
    gold_ids=["r2"],
)


def test_inserted_text_never_scores_for_single_completion_rewards():
    """An inserted piece holding the answer (before the policy's text) changes no reward: the
    same totals as the policy's text alone."""
    policy = "<relevance>[2]</relevance><analysis>r2 names him</analysis><answer>Simon</answer>"
    inserted = "<answer>Art Garfunkel</answer> <evaluate>Art Garfunkel</evaluate>\n"
    seen: list[str] = []
    rewards = [
        ArenaReward(),
        ExactMatchReward(),
        F1Reward(),
        F1Reward(answer_tag=None),
        EvalRarReward(),
        SearchR1Reward(),
        function_reward(seen),
    ]
    for reward in rewards:
        planted = reward([_trajectory(policy, ARENA_EX, inserted)]).total.tolist()
        alone = reward([_trajectory(policy, ARENA_EX)]).total.tolist()
        assert planted == alone, type(reward).__name__
    assert seen == [policy, policy]
    # ARENA: format 1, accuracy 0, relevance 1, no bonus = 2 (inserted text first would break
    # the format if the reward read the whole completion)
    assert ArenaReward()([_trajectory(policy, ARENA_EX, inserted)]).total.tolist() == [2.0]


# ---- (b) hedging ---------------------------------------------------------------------------

#: "Art; Garfunkel" normalizes to "art garfunkel" (the separator is punctuation), so exact match
#: pays it 1, but it lists two candidates where the gold lists one: a hedge
HEDGED_EM = "Art; Garfunkel"
#: "Paris or Lyon" against "Paris": token F1 0.5 (precision 1/3, recall 1), a hedge of two
HEDGED_F1 = "Paris or Lyon"
PARIS = Example(id="p", question="Capital of France?", answers=["Paris"])


def _answer(text: str, example: Example) -> Trajectory:
    return _trajectory(f"<answer>{text}</answer>", example)


@pytest.mark.parametrize(
    "cls, answer, example, scores",
    [
        # exact match 1 for the hedge: zero 0, cap 1/2, count 1
        (ExactMatchReward, HEDGED_EM, ARENA_EX, {"zero": 0.0, "cap": 0.5, "count": 1.0}),
        (SearchR1Reward, HEDGED_EM, ARENA_EX, {"zero": 0.0, "cap": 0.5, "count": 1.0}),
        # F1 0.5 for the hedge: zero 0, cap 0.5 / 2 = 0.25, count 0.5
        (F1Reward, HEDGED_F1, PARIS, {"zero": 0.0, "cap": 0.25, "count": 0.5}),
    ],
)
def test_answer_rewards_under_each_mode(cls, answer, example, scores):
    for mode, expected in scores.items():
        out = cls(hedging=mode)([_answer(answer, example)])
        assert out.total.tolist() == pytest.approx([expected]), mode
        # an answer that commits scores the paper's value in every mode
        committed = example.answers[0]
        assert cls(hedging=mode)([_answer(committed, example)]).total.tolist() == [1.0]
    # a partial answer that does not hedge keeps its partial F1 in every mode:
    # "the city of Paris" -> "city of paris", precision 1/3, recall 1, F1 0.5
    for mode in HEDGING_MODES:
        assert F1Reward(hedging=mode)([_answer("the city of Paris", PARIS)]).total.tolist() == [0.5]


def test_arena_accuracy_under_each_mode():
    """Format 1 and relevance 1 throughout; the hedge's exact match is 1 (see HEDGED_EM)."""
    text = "<relevance>[2]</relevance><analysis>r2</analysis><answer>{}</answer>"
    # count: 1 + 1 + 1 + 10 = 13; cap: 1 + 0.5 + 1 + 0 (no bonus) = 2.5; zero: 1 + 0 + 1 = 2
    for mode, expected in {"zero": 2.0, "cap": 2.5, "count": 13.0}.items():
        out = ArenaReward(hedging=mode)([_trajectory(text.format(HEDGED_EM), ARENA_EX)])
        assert out.total.tolist() == [expected], mode
        committed = _trajectory(text.format("Art Garfunkel"), ARENA_EX)
        assert ArenaReward(hedging=mode)([committed]).total.tolist() == [13.0]


def test_eval_rar_outcome_and_evaluation_under_each_mode():
    # outcome: the hedge's exact match is 1 -> zero 0 (then Eq. 5 falls back to the
    # evaluation, 0 here), cap 0.5, count 1
    hedged = _answer(HEDGED_EM, ARENA_EX)
    for mode, expected in {"zero": 0.0, "cap": 0.5, "count": 1.0}.items():
        assert EvalRarReward(hedging=mode)([hedged]).total.tolist() == [expected], mode
    # evaluation (Eq. 4): "Paris or Lyon" contains "Paris" -> r_eval 0.1 in every mode: the
    # guard reads the extracted answer only, never the <evaluate> prose
    hedging = _trajectory(
        "<evaluate>The capital is Paris or Lyon.</evaluate><answer>Lyon</answer>", PARIS
    )
    plain = _trajectory("<evaluate>The capital is Paris.</evaluate><answer>Lyon</answer>", PARIS)
    for mode in ("zero", "cap", "count"):
        out = EvalRarReward(hedging=mode)([hedging, plain])
        assert out.components["evaluation"].tolist() == pytest.approx([0.1, 0.1]), mode
        assert out.total.tolist() == pytest.approx([0.1, 0.1]), mode
    # the default is the paper's reward
    assert EvalRarReward()([hedged]).total.tolist() == [1.0]


def test_evo_rag_answer_correctness_under_each_mode():
    """r_ans = (EM + F1) / 2: "Paris or Lyon" -> (0 + 0.5) / 2 = 0.25; "the city of Paris"
    (no hedge) -> (0 + 0.5) / 2 = 0.25 in every mode; "Paris" -> 1."""
    for mode, expected in {"zero": 0.0, "cap": 0.125, "count": 0.25}.items():
        reward = EvoRagReward(hedging=mode)
        answer = reward.step_rewards(PARIS, [Step("answer", text=HEDGED_F1)])["answer"]
        assert answer == pytest.approx([expected]), mode
        for text, score in (("the city of Paris", 0.25), ("Paris", 1.0)):
            answer = reward.step_rewards(PARIS, [Step("answer", text=text)])["answer"]
            assert answer == pytest.approx([score]), (mode, text)


#: every answer-matching reward defaults to the paper's score: guards measure unless asked
REWARDS = {
    "exact_match": (ExactMatchReward, "count"),
    "f1": (F1Reward, "count"),
    "arena": (ArenaReward, "count"),
    "eval_rar": (EvalRarReward, "count"),
    "search_r1": (SearchR1Reward, "count"),
    "evo_rag": (EvoRagReward, "count"),
}


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_unknown_mode_is_a_one_line_error_and_the_default_is_documented(name):
    cls, default = REWARDS[name]
    with pytest.raises(ValueError) as info:
        cls(hedging="maybe")
    message = str(info.value)
    assert "\n" not in message
    assert message == f"reward {name} hedging 'maybe' is not known; allowed: zero, cap, count"
    assert cls().hedging.mode == default
    assert f"``hedging`` defaults to ``{default}``" in " ".join(cls.__doc__.split())


PAPER_RECIPES = ["arena", "eval_rar", "search_r1", "evo_rag"]
GUARDED_RECIPES = {
    "arena_hotpotqa_cpu": "zero",
    "quickstart": "zero",
    "eval_rar_hotpotqa_cpu": "cap",
    "eval_rar_quickstart": "cap",
    "search_r1_hotpotqa_cpu": "zero",
    "evo_rag_hotpotqa_cpu": "zero",
    "evo_rag_quickstart": "zero",
}


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_paper_recipes_train_on_the_papers_reward(recipe):
    reward = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())["model"]["reward"]
    assert reward["init_args"]["hedging"] == "count"


@pytest.mark.parametrize("recipe", sorted(GUARDED_RECIPES))
def test_recipes_that_opt_into_the_guard_say_so_in_their_header(recipe):
    text = (RECIPES / f"{recipe}.yaml").read_text()
    reward = yaml.safe_load(text)["model"]["reward"]
    mode = GUARDED_RECIPES[recipe]
    assert reward["init_args"]["hedging"] == mode
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert "A reward guard, not in the paper" in header and f"hedging: {mode}" in header


def test_hedging_guard_by_hand():
    """The guard the rewards share: a score is untouched unless the answer hedges."""
    assert Hedging("cap").apply(1.0, "Paris or Lyon or Nice", ["Paris"]) == pytest.approx(1 / 3)
    assert Hedging("zero").apply(1.0, "Paris, France", ["Paris"]) == 1.0  # a comma is one answer
    assert Hedging("zero").apply(1.0, "Lyon or Paris", ["Lyon or Paris"]) == 1.0  # gold lists 2
    assert Hedging().apply(1.0, "Paris or Lyon", ["Paris"]) == 1.0  # the default measures only
