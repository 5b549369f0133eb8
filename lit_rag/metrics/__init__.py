"""torchmetrics ``Metric`` classes for answers and retrieval."""

from lit_rag.metrics.qa import ExactMatch, TokenF1
from lit_rag.metrics.retrieval import FullRecallAtK, MeanAveragePrecision, RecallAtK

__all__ = [
    "ExactMatch",
    "FullRecallAtK",
    "MeanAveragePrecision",
    "RecallAtK",
    "TokenF1",
]
