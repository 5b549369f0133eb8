"""``logprob_gap_blowup`` does not fire on the sampler's truncation alone: the gap it watches
(``rollout/logprob_diff_mean``, :class:`~lit_rag.trainer.phases.Mismatch`) leaves out what
top-p explains, while a real engine / trainer gap still fires it."""

from __future__ import annotations

import math

import torch

from lit_rag.health.detectors import detectors
from lit_rag.trainer.phases import Mismatch

TOP_P = 0.5


def _step(mismatch: Mismatch, trainer: float, engine: float) -> float:
    """One step's ``rollout/logprob_diff_mean`` over 8 sampled tokens alike."""
    mismatch.add(torch.full((1, 8), trainer), torch.full((1, 8), engine), torch.ones(1, 8))
    return float(mismatch.metrics()["rollout/logprob_diff_mean"])


def _fired(series: list[float]) -> list[int]:
    (gap,) = [d for d in detectors() if d.name == "logprob_gap_blowup"]
    return [step for step, value in enumerate(series) if gap.update(value) is not None]


def test_truncation_alone_does_not_fire_the_detector() -> None:
    """Equal weights, top-p 0.5. Steps 0-3: the policy is sure (top token 0.99, kept alone and
    renormalized to 1): engine log 1 = 0, trainer log 0.99, d = -0.01. Step 4: it hesitates
    among four tokens at 0.25 each; the sampler keeps two (mass 0.5) at 0.5 each: engine
    log 0.5, trainer log 0.25, d = log 0.5 = -0.69. Before, |d| went from 0.01 to 0.69, over ten
    times its median and the 0.5-nat floor: a blow-up with nothing wrong. Now both are inside
    [log 0.5, 0]: 0 every step. Step 5, a real gap (the engine's weights behind: d = -1.5) fires
    it: 1.5 - 0.69 = 0.81 nats beyond what truncation explains."""
    steps = [(math.log(0.99), 0.0)] * 4 + [(math.log(0.25), math.log(0.5))]
    before = [_step(Mismatch(), t, e) for t, e in steps]
    assert math.isclose(before[-1], -math.log(0.5), rel_tol=1e-6) and _fired(before) == [4]
    now = [_step(Mismatch(1.0, TOP_P), t, e) for t, e in steps]
    assert max(now) < 1e-6 and _fired(now) == []
    real = _step(Mismatch(1.0, TOP_P), -2.0, -0.5)
    assert math.isclose(real, 1.5 + math.log(TOP_P), rel_tol=1e-6)
    assert _fired([*now, real]) == [5]
