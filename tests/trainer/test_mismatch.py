"""The trainer / engine log-prob gap (``rollout/logprob_diff_*``, :class:`Mismatch`) compares like
with like when the sampler truncates: the engine reports log-probs under the truncated
distribution it drew from, the trainer under the full softmax, and the gap counts only what the
truncation cannot explain.

Before, the metric was the plain mean of ``|log pi_trainer - log pi_engine|``, so at equal
weights it measured the truncation: in the worked example below, 0.223 nats a token.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from lit_rag.trainer.phases import Mismatch


def _metrics(mismatch: Mismatch, trainer: list[float], engine: list[float]) -> dict[str, float]:
    t, e = torch.tensor([trainer]), torch.tensor([engine])
    mismatch.add(t, e, torch.ones_like(t))
    return {k: float(v) for k, v in mismatch.metrics().items()}


def test_top_p_truncation_at_equal_weights_is_no_gap() -> None:
    """A 4-token vocabulary with probabilities 0.5 / 0.3 / 0.15 / 0.05 and top-p 0.8: the
    sampler keeps tokens 0 and 1 (mass Z = 0.8) and renormalizes them to 0.625 / 0.375.

    Sampled tokens 0 and 1 at equal weights: the engine reports log 0.625 and log 0.375, the
    trainer log 0.5 and log 0.3; both differences are log 0.8 = -0.223. Before, the metric was
    their mean absolute value, 0.223 nats of "mismatch" that is the truncation alone; now each
    is measured from the interval truncation explains, [log 0.8, 0]: 0.
    """
    trainer = [math.log(0.5), math.log(0.3)]
    engine = [math.log(0.625), math.log(0.375)]
    before = _metrics(Mismatch(), trainer, engine)
    assert before["rollout/logprob_diff_mean"] == pytest.approx(-math.log(0.8), abs=1e-6)
    assert before["rollout/logprob_diff_mean"] == pytest.approx(0.2231, abs=1e-4)
    now = _metrics(Mismatch(temperature=1.0, top_p=0.8), trainer, engine)
    assert now["rollout/logprob_diff_mean"] == pytest.approx(0.0, abs=1e-6)
    assert now["rollout/logprob_diff_max"] == pytest.approx(0.0, abs=1e-6)


def test_a_gap_outside_what_truncation_explains_counts_exactly() -> None:
    """top-p 0.8: truncation puts d = log pi_trainer - log pi_engine in [log 0.8, 0] =
    [-0.2231, 0]. d = +0.1 (the trainer finds the token likelier: never truncation) counts 0.1;
    d = -0.1 counts 0; d = -0.5 counts -0.2231 - (-0.5) = 0.2769. Mean (0.1 + 0 + 0.2769) / 3 =
    0.1256, max 0.2769."""
    engine = [-1.0, -1.0, -1.0]
    trainer = [-0.9, -1.1, -1.5]
    now = _metrics(Mismatch(1.0, 0.8), trainer, engine)
    assert now["rollout/logprob_diff_mean"] == pytest.approx((0.1 + 0.5 + math.log(0.8)) / 3)
    assert now["rollout/logprob_diff_max"] == pytest.approx(0.5 + math.log(0.8))
    # no truncation (top-p 1, or greedy whatever top-p says): |d|, mean (0.1 + 0.1 + 0.5) / 3
    for plain in (Mismatch(), Mismatch(0.0, 0.8, 5)):
        assert _metrics(plain, trainer, engine)["rollout/logprob_diff_mean"] == pytest.approx(
            0.7 / 3
        )


def test_top_k_counts_only_the_side_truncation_never_produces() -> None:
    """Top-k keeps a mass with no lower bound (top-k 1 keeps the top token alone), so
    d = -2.0 may be truncation and counts 0; d = +0.3 counts 0.3: mean 0.15."""
    now = _metrics(Mismatch(1.0, 1.0, top_k=1), [-3.0, -0.7], [-1.0, -1.0])
    assert now == pytest.approx(
        {"rollout/logprob_diff_mean": 0.15, "rollout/logprob_diff_max": 0.3}
    )


def test_transformers_top_p_sampling_at_equal_weights() -> None:
    """The ``hf`` engine's own truncation (transformers' temperature and top-p warpers, which
    keep the smallest set of mass >= top-p as vLLM does) over 64 random positions of a
    1,000-token vocabulary at temperature 0.7, top-p 0.9; the trainer's log-probs carry numerics
    noise of at most 1e-4. Before: the truncation, about 0.1 nats a token; now: under 1e-4."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=generator) * 3  # [positions, V]
    warped = TopPLogitsWarper(0.9)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
    sampled = torch.multinomial(warped.softmax(-1), 1, generator=generator)  # [positions, 1]
    engine = warped.log_softmax(-1).gather(-1, sampled).squeeze(-1)
    full = (logits / 0.7).log_softmax(-1).gather(-1, sampled).squeeze(-1)
    trainer = full + (torch.rand(64, generator=generator) - 0.5) * 2e-4
    mask = torch.ones(64)
    before, now = Mismatch(), Mismatch(0.7, 0.9)
    before.add(trainer, engine, mask)
    now.add(trainer, engine, mask)
    assert before.metrics()["rollout/logprob_diff_mean"] > 0.05
    assert now.metrics()["rollout/logprob_diff_max"] < 1e-4
