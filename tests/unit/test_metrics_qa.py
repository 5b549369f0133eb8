"""ExactMatch and TokenF1 torchmetrics."""

from __future__ import annotations

import pytest
import torch

from lit_rag.metrics import ExactMatch, TokenF1


def test_exact_match_two_updates() -> None:
    metric = ExactMatch()
    metric.update(["The Louvre", "Rome"], [["Louvre", "Musee du Louvre"], ["Paris"]])  # 1 + 0
    metric.update(["paris!"], ["Paris"])  # bare string target is one alias: 1
    # (1 + 0 + 1) / 3 = 2/3
    assert metric.compute().item() == pytest.approx(2 / 3)
    assert metric.total.item() == 2.0 and metric.count.item() == 3


def test_token_f1_two_updates() -> None:
    metric = TokenF1()
    # [city, of, paris] vs [paris, france]: P 1/3, R 1/2 -> F1 0.4
    metric.update(["the city of Paris"], [["Paris France"]])
    # exact: 1.0; no common token: 0.0
    metric.update(["Paris France", "Rome"], [["paris, france"], ["Paris"]])
    # (0.4 + 1.0 + 0.0) / 3 = 1.4 / 3
    assert metric.compute().item() == pytest.approx(1.4 / 3)


def test_compute_with_no_examples_is_zero() -> None:
    for metric in (ExactMatch(), TokenF1()):
        metric.update([], [])  # count stays 0: 0 / 0 is reported as 0.0, not nan
        assert metric.compute().item() == 0.0


def test_reset_and_length_mismatch() -> None:
    metric = ExactMatch()
    metric.update(["a"], [["a"]])
    metric.reset()
    assert metric.count.item() == 0
    with pytest.raises(ValueError, match="preds"):
        metric.update(["a", "b"], [["a"]])


def test_merge_states_like_ddp() -> None:
    # two "ranks" each see half the data; summing states gives the global mean
    a, b = ExactMatch(), ExactMatch()
    a.update(["x", "y"], [["x"], ["z"]])  # 1 + 0
    b.update(["w"], [["w"]])  # 1
    a.merge_state(b)
    # (1 + 0 + 1) / 3
    assert a.compute().item() == pytest.approx(2 / 3)
    assert a.compute().dtype == torch.float32
