"""Retrieval metrics as torchmetrics ``Metric``s: Recall@k, Full-Recall@k and mAP.

Each query contributes one score; the metric is the mean over queries. States are a running
sum and a count, both summed across processes, so the mean is exact under DDP however the
queries are split. Inputs are passage ids: ``retrieved_ids`` ranked best first, ``gold_ids``
the supporting passages (order ignored, duplicates counted once). A query without gold ids
scores 0 (it cannot be recalled) but still counts, so skipped gold never inflates a score.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


def recall_at_k(retrieved: list[str], gold: list[str], k: int) -> float:
    """Fraction of gold ids among the first ``k`` retrieved; 0.0 when there is no gold.

    Example:
        >>> recall_at_k(["a", "x", "b"], ["a", "b"], 2)  # only "a" in the top-2 -> 1/2
        0.5
    """
    wanted = set(gold)
    if not wanted:
        return 0.0
    return len(wanted & set(retrieved[:k])) / len(wanted)


def full_recall_at_k(retrieved: list[str], gold: list[str], k: int) -> float:
    """1.0 if every gold id is among the first ``k`` retrieved (and there is gold), else 0.0.

    Example:
        >>> full_recall_at_k(["a", "x", "b"], ["a", "b"], 3)
        1.0
    """
    wanted = set(gold)
    return float(bool(wanted) and wanted <= set(retrieved[:k]))


def average_precision(retrieved: list[str], gold: list[str]) -> float:
    """Mean over gold ids of the precision at the rank where each is found (0 if not found).

    Example:
        >>> round(average_precision(["a", "x", "b"], ["a", "b"]), 4)  # (1/1 + 2/3) / 2 = 5/6
        0.8333
    """
    wanted = set(gold)
    if not wanted:
        return 0.0
    hits, total, seen = 0, 0.0, set()
    for rank, pid in enumerate(retrieved, start=1):
        if pid in wanted and pid not in seen:
            seen.add(pid)
            hits += 1
            total += hits / rank
    return total / len(wanted)


class _MeanQueryScore(Metric):
    """Mean of a per-query score over all updates; 0.0 before any update."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        total = torch.tensor(0.0, dtype=torch.float64)
        self.add_state("total", default=total, dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def score(self, retrieved: list[str], gold: list[str]) -> float:
        raise NotImplementedError

    def update(self, retrieved_ids: list[list[str]], gold_ids: list[list[str]]) -> None:
        """Add a batch of queries.

        Args:
            retrieved_ids: Per query, the retrieved passage ids, best first.
            gold_ids: Per query, the gold passage ids.
        """
        if len(retrieved_ids) != len(gold_ids):
            raise ValueError(
                f"retrieved_ids: got {len(retrieved_ids)} ranking(s) "
                f"for {len(gold_ids)} gold list(s)"
            )
        scores = [
            self.score(list(r), list(g)) for r, g in zip(retrieved_ids, gold_ids, strict=True)
        ]
        self.total += sum(scores)
        self.count += len(scores)

    def compute(self) -> torch.Tensor:
        """Mean score over queries (float32), or 0.0 when nothing was added."""
        mean = torch.where(self.count > 0, self.total / self.count.clamp(min=1), 0.0)
        return mean.float()


class _AtK(_MeanQueryScore):
    def __init__(self, k: int, **kwargs: object) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k: got {k!r}; expected an integer >= 1")
        super().__init__(**kwargs)
        self.k = k


class RecallAtK(_AtK):
    """Recall@k: fraction of a query's gold passages in its top-k, averaged over queries.

    Example:
        >>> m = RecallAtK(2)
        >>> m.update([["a", "x", "b"], ["c"]], [["a", "b"], ["c"]])  # (1/2 + 1) / 2
        >>> float(m.compute())
        0.75
    """

    def score(self, retrieved: list[str], gold: list[str]) -> float:
        return recall_at_k(retrieved, gold, self.k)


class FullRecallAtK(_AtK):
    """Full-Recall@k: share of queries whose gold passages are all in the top-k.

    Example:
        >>> m = FullRecallAtK(2)
        >>> m.update([["a", "x", "b"], ["c"]], [["a", "b"], ["c"]])  # (0 + 1) / 2
        >>> float(m.compute())
        0.5
    """

    def score(self, retrieved: list[str], gold: list[str]) -> float:
        return full_recall_at_k(retrieved, gold, self.k)


class MeanAveragePrecision(_MeanQueryScore):
    """mAP over the full ranking (named apart from torchmetrics' detection mAP).

    Example:
        >>> m = MeanAveragePrecision()
        >>> m.update([["a", "x", "b"]], [["a", "b"]])  # (1/1 + 2/3) / 2 = 5/6
        >>> round(float(m.compute()), 4)
        0.8333
    """

    def score(self, retrieved: list[str], gold: list[str]) -> float:
        return average_precision(retrieved, gold)
