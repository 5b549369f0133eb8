"""CompositeReward: weighted sum of child rewards, component naming, set_weights."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from kit import trajectory

from lit_rag.api import Reward
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.composite import CompositeReward, short_name
from lit_rag.plugins.rewards.qa import ExactMatchReward, F1Reward
from lit_rag.types import Example, Passage, RewardBreakdown, Trajectory

EXAMPLE = Example(
    id="q",
    question="?",
    answers=["Paris France"],
    references=[Passage("p1", "", ""), Passage("p2", "", "")],
    gold_ids=["p2"],
)


traj = partial(trajectory, example=EXAMPLE, prompt=[1, 2], tokens=2)


def test_short_names() -> None:
    assert short_name(ExactMatchReward()) == "exact_match"
    assert short_name(F1Reward()) == "f1"
    assert short_name(ArenaReward()) == "arena"


def test_weighted_sum_of_em_and_f1() -> None:
    trajs = [traj("<answer>the city of Paris</answer>"), traj("<answer>Paris, France</answer>")]
    out = CompositeReward([ExactMatchReward(), F1Reward()], [0.5, 0.5])(trajs)
    # 1st: EM 0, F1 0.4 (P 1/3, R 1/2) -> 0.5*0 + 0.5*0.4 = 0.2
    # 2nd: EM 1, F1 1                  -> 0.5*1 + 0.5*1   = 1.0
    assert out.total.tolist() == pytest.approx([0.2, 1.0])
    assert set(out.components) == {"exact_match", "f1"}
    assert out.components["f1"].tolist() == pytest.approx([0.4, 1.0])  # unweighted


def test_default_weights_are_one() -> None:
    composite = CompositeReward([ExactMatchReward(), F1Reward()])
    assert composite.weights == {"exact_match": 1.0, "f1": 1.0}
    # EM 1 + F1 1 = 2
    assert composite([traj("<answer>Paris France</answer>")]).total.tolist() == [2.0]


def test_clashing_names_are_prefixed() -> None:
    composite = CompositeReward([ExactMatchReward(), ExactMatchReward(answer_tag=None)], [1.0, 3.0])
    assert list(composite.weights) == ["exact_match", "exact_match_1"]
    out = composite([traj("Paris France")])
    # tagged child: no <answer> -> 0; whole-text child: EM 1 -> total = 1*0 + 3*1 = 3
    assert out.total.tolist() == [3.0]
    assert out.components["exact_match.exact_match"].tolist() == [0.0]
    assert out.components["exact_match_1.exact_match"].tolist() == [1.0]


def test_set_weights_own_and_nested() -> None:
    composite = CompositeReward([ArenaReward(), F1Reward()])
    composite.set_weights({"f1": 0.0, "arena.bonus": 0.5})
    text = "<relevance>[2]</relevance><analysis>.</analysis><answer>Paris France</answer>"
    out = composite([traj(text)])
    # arena: 1 + 1 + 1 + 0.5*10 = 8; f1 weight 0 -> total 8
    assert out.total.tolist() == [8.0]
    assert set(out.components) == {"format", "accuracy", "relevance", "bonus", "f1"}


@pytest.mark.parametrize("bad", [{"em": 1.0}, {"arena.nope": 1.0}, {"nope.bonus": 1.0}])
def test_set_weights_unknown_changes_nothing(bad: dict[str, float]) -> None:
    composite = CompositeReward([ArenaReward(), F1Reward()])
    with pytest.raises(ValueError, match="arena.bonus"):  # the message lists what is allowed
        composite.set_weights({"f1": 9.0, **bad})
    assert composite.weights == {"arena": 1.0, "f1": 1.0}


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="weights: got 1 value"):
        CompositeReward([ExactMatchReward(), F1Reward()], [1.0])
    with pytest.raises(ValueError, match="rewards"):
        CompositeReward([])


class StepReward(Reward):
    weights = {"step": 1.0}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        return RewardBreakdown(total=torch.zeros(len(trajectories), 3))


def test_mismatched_shapes_fail_clearly() -> None:
    with pytest.raises(ValueError, match="different shapes"):
        CompositeReward([F1Reward(), StepReward()])([traj("x")])
