"""Recall@k, Full-Recall@k and mAP on hand-worked rankings."""

from __future__ import annotations

import pytest
import torch

from lit_rag.metrics import FullRecallAtK, MeanAveragePrecision, RecallAtK

# Query 1: ranking a x b y, gold {a, b}.  Query 2: ranking x y z, gold {z}.
# Query 3: ranking p q, gold {g} (never found).
RETRIEVED = [["a", "x", "b", "y"], ["x", "y", "z"], ["p", "q"]]
GOLD = [["a", "b"], ["z"], ["g"]]


@pytest.mark.parametrize(
    ("k", "recall", "full"),
    [
        # k=1: q1 1/2, q2 0, q3 0 -> recall 0.5/3 = 0.16667; full 0/3
        (1, 0.5 / 3, 0.0),
        # k=3: q1 2/2, q2 1/1, q3 0 -> recall 2/3; full (1 + 1 + 0)/3 = 2/3
        (3, 2 / 3, 2 / 3),
        # k=10 (> every ranking): same as k=3
        (10, 2 / 3, 2 / 3),
    ],
)
def test_recall_and_full_recall(k, recall, full):
    r, f = RecallAtK(k), FullRecallAtK(k)
    r.update(RETRIEVED, GOLD)
    f.update(RETRIEVED, GOLD)
    assert float(r.compute()) == pytest.approx(recall)
    assert float(f.compute()) == pytest.approx(full)


def test_full_recall_differs_from_recall():
    # k=2: q1 finds a but not b -> recall 1/2, full recall 0
    r, f = RecallAtK(2), FullRecallAtK(2)
    r.update(RETRIEVED[:1], GOLD[:1])
    f.update(RETRIEVED[:1], GOLD[:1])
    assert float(r.compute()) == pytest.approx(0.5)
    assert float(f.compute()) == 0.0


def test_map_hand_worked():
    # q1: a at rank 1 (P = 1/1), b at rank 3 (P = 2/3) -> AP (1 + 2/3) / 2 = 5/6
    # q2: z at rank 3 (P = 1/3)                        -> AP 1/3
    # q3: nothing found                                -> AP 0
    # mAP = (5/6 + 1/3 + 0) / 3 = (7/6) / 3 = 7/18 = 0.38889
    m = MeanAveragePrecision()
    m.update(RETRIEVED, GOLD)
    assert float(m.compute()) == pytest.approx(7 / 18)


def test_map_counts_unfound_gold_in_denominator():
    # gold {a, b, c}, only a found at rank 2: AP = (1/2) / 3 = 1/6
    m = MeanAveragePrecision()
    m.update([["x", "a"]], [["a", "b", "c"]])
    assert float(m.compute()) == pytest.approx(1 / 6)


def test_updates_accumulate_across_batches():
    # one update per query gives the same mean as one update for all
    whole, split = RecallAtK(3), RecallAtK(3)
    whole.update(RETRIEVED, GOLD)
    for retrieved, gold in zip(RETRIEVED, GOLD, strict=True):
        split.update([retrieved], [gold])
    assert torch.equal(whole.compute(), split.compute())
    assert int(split.count) == 3


def test_empty_and_errors():
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert float(RecallAtK(5).compute()) == 0.0  # nothing added
    m = MeanAveragePrecision()
    m.update([["a"]], [[]])  # no gold -> scores 0 but counts
    assert float(m.compute()) == 0.0 and int(m.count) == 1
    with pytest.raises(ValueError, match="retrieved_ids: got 2 ranking"):
        RecallAtK(1).update([["a"], ["b"]], [["a"]])
    with pytest.raises(ValueError, match="k: got 0"):
        RecallAtK(0)


def test_states_sum_across_processes():
    m = FullRecallAtK(1)
    # sum/count states, both summed under DDP (mean of the merged sums is exact)
    assert {m._reductions[name].__name__ for name in ("total", "count")} == {"dim_zero_sum"}
    assert m._defaults["count"].dtype == torch.long
