"""torchmetrics ``Metric`` classes for answers and retrieval."""

from lit_rag.metrics.qa import ExactMatch, TokenF1

__all__ = ["ExactMatch", "TokenF1"]
