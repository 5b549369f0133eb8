"""Answer metrics as torchmetrics ``Metric``s: normalized EM and token F1 (ARENA Appendix C).

Paper: EM and F1 on normalized answers, best over the gold aliases, averaged over the
evaluation set. The scores are :func:`lit_rag.text.exact_match` and :func:`lit_rag.text.f1_score`,
the functions the EM and F1 rewards (:mod:`lit_rag.plugins.rewards.qa`) score with, so the
training reward and the reported metric cannot drift apart. States are a running sum and a
count, both summed across processes, so the mean is exact under DDP however the data is split.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchmetrics import Metric

from lit_rag.text import exact_match, f1_score


class _MeanAnswerScore(Metric):
    """Mean of a per-answer score over all updates; 0.0 before any update."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    score_fn: Callable[[str, list[str], str], float]

    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, punctuation: str = "delete", **kwargs: object) -> None:
        super().__init__(**kwargs)
        # ``delete`` (SQuAD, Search-R1) or ``space`` (ARENA's release)
        self.punctuation = punctuation
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: list[str], targets: list[list[str]] | list[str]) -> None:
        """Add a batch.

        Args:
            preds: One predicted answer per example.
            targets: The gold aliases per example; a bare string counts as a single alias.
        """
        if len(preds) != len(targets):
            raise ValueError(f"preds: got {len(preds)} prediction(s) for {len(targets)} target(s)")
        scores = [
            self.score_fn(p, [t] if isinstance(t, str) else list(t), self.punctuation)
            for p, t in zip(preds, targets, strict=True)
        ]
        self.total += sum(scores)
        self.count += len(scores)

    def compute(self) -> torch.Tensor:
        """Mean score, or 0.0 when nothing was added."""
        return torch.where(self.count > 0, self.total / self.count.clamp(min=1), 0.0)


class ExactMatch(_MeanAnswerScore):
    """Mean normalized exact match (1 if the answer matches any alias).

    Example:
        >>> m = ExactMatch()
        >>> m.update(["The Louvre", "Rome"], [["Louvre"], ["Paris"]])
        >>> float(m.compute())
        0.5
    """

    score_fn = staticmethod(exact_match)


class TokenF1(_MeanAnswerScore):
    """Mean SQuAD token F1, best over the aliases (named to avoid torchmetrics' ``F1Score``).

    Example:
        >>> m = TokenF1()
        >>> m.update(["the city of Paris"], [["Paris France"]])  # P 1/3, R 1/2 -> F1 0.4
        >>> round(float(m.compute()), 4)
        0.4
    """

    score_fn = staticmethod(f1_score)
