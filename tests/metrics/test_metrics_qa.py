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


def test_empty_normalized_answers_never_match() -> None:
    # "A" and "the" both normalize to "": neither EM nor F1 counts it (SQuAD v2 gave F1 1)
    for metric in (ExactMatch(), TokenF1()):
        metric.update(["A", "Paris"], [["the"], ["Paris"]])  # 0 + 1
        # (0 + 1) / 2 = 0.5
        assert metric.compute().item() == pytest.approx(0.5)


def test_validation_metrics_normalize_punctuation_as_the_recipe_says():
    # ARENA's release turns punctuation into spaces: "jean paul sartre" == "jean paul sartre" -> 1;
    # the SQuAD rule deletes it: "jeanpaul sartre" != "jean paul sartre" -> EM 0, F1: 1 of 2
    # predicted tokens in 3 gold tokens -> P 1/2, R 1/3, F1 = 2 * (1/6) / (5/6) = 0.4
    from lit_rag.metrics.qa import ExactMatch, TokenF1

    for cls, space, delete in ((ExactMatch, 1.0, 0.0), (TokenF1, 1.0, 0.4)):
        m_space, m_delete = cls(punctuation="space"), cls()
        m_space.update(["Jean-Paul Sartre"], [["Jean Paul Sartre"]])
        m_delete.update(["Jean-Paul Sartre"], [["Jean Paul Sartre"]])
        assert float(m_space.compute()) == pytest.approx(space) and float(
            m_delete.compute()
        ) == pytest.approx(delete)


def test_policy_module_refuses_an_unknown_answer_punctuation():
    from lit_rag.models.loading import ModelConfig, TinyConfig
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.qa import ExactMatchReward
    from lit_rag.trainer.policy import PolicyModule

    with pytest.raises(
        ValueError, match="answer_punctuation 'strip' is not known; allowed: delete, space"
    ):
        PolicyModule(
            policy=ModelConfig(tiny=TinyConfig()),
            environment=SingleTurnEnvironment(),
            reward=ExactMatchReward(),
            algorithm=GRPO(),
            answer_punctuation="strip",
        )
