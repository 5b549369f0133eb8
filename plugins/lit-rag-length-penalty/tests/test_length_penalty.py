"""LengthPenaltyReward: the score curve, missing answers, weights, and its entry point."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from lit_rag_length_penalty import LengthPenaltyReward, length_score

from lit_rag.api import Example, Reward, Trajectory

EXAMPLE = Example(id="q", question="?", answers=["Paris"])


def traj(text: str) -> Trajectory:
    ids = torch.tensor([1, 2])
    return Trajectory(EXAMPLE, 0, ids, ids, torch.ones(2), torch.zeros(2), text)


def answer_of(words: int) -> str:
    return "<answer>" + " ".join(["w"] * words) + "</answer>"


def test_score_is_flat_then_linear_then_zero() -> None:
    texts = [answer_of(n) for n in (1, 5, 6, 8, 10, 12)]
    out = LengthPenaltyReward(max_words=5)([traj(t) for t in texts])
    # n <= 5 -> 1.0; 6 -> 1 - 1/5 = 0.8; 8 -> 1 - 3/5 = 0.4; 10 -> 1 - 5/5 = 0; 12 -> clipped to 0
    assert out.total.tolist() == pytest.approx([1.0, 1.0, 0.8, 0.4, 0.0, 0.0])
    assert out.components["length"].tolist() == pytest.approx([1.0, 1.0, 0.8, 0.4, 0.0, 0.0])
    assert out.total.shape == (6,)


def test_no_answer_scores_zero_and_empty_answer_scores_one() -> None:
    texts = ["Paris", "<answer>Paris", "", "<answer></answer>"]
    out = LengthPenaltyReward()([traj(t) for t in texts])
    # no complete pair -> 0; an empty but present answer has 0 words <= 5 -> 1.0
    assert out.total.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_reads_last_complete_answer() -> None:
    text = "<answer>a long first draft of the answer here</answer> <answer>Paris</answer>"
    assert LengthPenaltyReward(max_words=2)([traj(text)]).total.tolist() == [1.0]


def test_weight_scales_total_not_component() -> None:
    reward = LengthPenaltyReward(max_words=5, weight=2.0)
    out = reward([traj("<answer>the tall iron tower in central Paris</answer>")])
    # 7 words: 1 - (7 - 5)/5 = 0.6; total = 2.0 * 0.6 = 1.2
    assert out.components["length"].tolist() == pytest.approx([0.6])
    assert out.total.tolist() == pytest.approx([1.2])
    reward.set_weights({"length": 0.5})
    assert reward([traj(answer_of(7))]).total.tolist() == pytest.approx([0.3])  # 0.5 * 0.6


def test_never_raises_on_odd_text() -> None:
    texts = [
        "</answer><answer>",  # tags in the wrong order: no complete pair
        "<answer>\n\t </answer>",  # whitespace only: 0 words
        "<answer>" + "x " * 10_000,  # never closed
        "\x00<answer>é</answer>",  # 1 word
    ]
    out = LengthPenaltyReward()([traj(t) for t in texts])
    assert out.total.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_empty_batch_and_bad_max_words() -> None:
    assert LengthPenaltyReward()([]).total.shape == (0,)
    with pytest.raises(ValueError, match="max_words: got 0"):
        LengthPenaltyReward(max_words=0)


def test_length_score_docstring_example() -> None:
    assert length_score("the tall iron tower in central Paris", 5) == pytest.approx(0.6)
    assert length_score(None, 5) == 0.0


def test_is_a_reward_registered_as_length_penalty() -> None:
    assert issubclass(LengthPenaltyReward, Reward)
    group = metadata.entry_points(group="lit_rag.rewards")
    eps = [ep for ep in group if ep.name == "length_penalty"]
    assert len(eps) == 1
    assert eps[0].dist.metadata["Name"] == "lit-rag-length-penalty"
    assert eps[0].load() is LengthPenaltyReward
