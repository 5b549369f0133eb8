"""median_baseline, the advantage estimator: by hand, reward scaling, and its entry point."""

from __future__ import annotations

import math
from importlib import metadata

import pytest
import torch
from lit_rag_length_penalty.median_baseline import median_baseline


def test_one_group_by_hand() -> None:
    # [0, 1, 3, 10]: median (1 + 3) / 2 = 2 -> A = [-2, -1, 1, 8]
    adv = median_baseline(torch.tensor([0.0, 1.0, 3.0, 10.0]), torch.zeros(4, dtype=torch.long))
    assert adv.tolist() == [-2.0, -1.0, 1.0, 8.0]


def test_interleaved_groups_and_a_group_of_one() -> None:
    # group 0 (rows 0, 2, 4): [5, 1, 2] -> median 2 -> [3, -1, 0]
    # group 1 (rows 1, 3):    [0, 4]    -> median 2 -> [-2, 2]
    # group 2 (row 5):        [7]       -> median 7 -> [0]
    rewards = torch.tensor([5.0, 0.0, 1.0, 4.0, 2.0, 7.0])
    groups = torch.tensor([0, 1, 0, 1, 0, 2])
    assert median_baseline(rewards, groups).tolist() == [3.0, -2.0, -1.0, 2.0, 0.0, 0.0]


def test_scale_rewards() -> None:
    # one group [0, 4]: A = [-2, 2]; sample std sqrt((4 + 4) / 1) = 2.82843
    r, g = torch.tensor([0.0, 4.0]), torch.zeros(2, dtype=torch.long)
    s = math.sqrt(8) + 1e-4
    assert median_baseline(r, g, "group").tolist() == pytest.approx([-2 / s, 2 / s])
    # two groups [0, 4] and [1, 1]: A = [-2, 2, 0, 0]; batch: mean 1.5, std of [0, 4, 1, 1]
    #   = sqrt((2.25 + 6.25 + 0.25 + 0.25) / 3) = sqrt(3) = 1.73205
    r, g = torch.tensor([0.0, 4.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    b = math.sqrt(3) + 1e-4
    assert median_baseline(r, g, "batch").tolist() == pytest.approx([-2 / b, 2 / b, 0.0, 0.0])
    assert median_baseline(r, g, "none").tolist() == [-2.0, 2.0, 0.0, 0.0]


def test_registered_as_median_baseline() -> None:
    eps = [
        ep
        for ep in metadata.entry_points(group="lit_rag.advantages")
        if ep.name == "median_baseline"
    ]
    (ep,) = eps
    assert ep.dist.metadata["Name"] == "lit-rag-length-penalty"
    assert ep.load() is median_baseline
