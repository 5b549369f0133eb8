"""Each run-health detector (lit_rag/health/detectors.py) fires on the pattern it names and stays
quiet on long healthy runs, on simulated series (seeded numpy).

The reward-collapse figures print with ``python tests/health/test_detectors.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_rag.health.detectors import DEFAULTS, detectors, noise, scan

STEPS = 1000
FALLS = (15, 20, 25)
SEEDS = range(5)
HEALTHY_RUNS = range(50)


def fired(name: str, values, **thresholds) -> list[int]:
    """The steps (from 0) where detector ``name`` fires over ``values``."""
    (d,) = [d for d in detectors(thresholds) if d.name == name]
    return [i for i, v in enumerate(values) if d.update(float(v)) is not None]


# ---- simulated reward series --------------------------------------------------------------
def collapsing_reward(fall: int, seed: int) -> np.ndarray:
    """60 steps at 0.4, a straight fall to 0 over ``fall`` steps (step 60 is the first lower
    one, 0.4 - 0.4 / fall), 20 steps at 0; noise sd 0.02 throughout."""
    level = np.concatenate([np.full(60, 0.4), np.linspace(0.4, 0.0, fall + 1)[1:], np.zeros(20)])
    return level + np.random.default_rng(seed).normal(0.0, 0.02, level.size)


def rising_reward(seed: int) -> np.ndarray:
    """A healthy run: 1,000 steps rising from 0.02 to 0.45 (0.02 + 0.43 (1 - e^(-t/200)),
    0.447 at the end), noise sd drawn from 0.01 to 0.02."""
    rng = np.random.default_rng(1000 + seed)
    t = np.arange(STEPS)
    level = 0.02 + 0.43 * (1 - np.exp(-t / 200))
    return level + rng.normal(0.0, rng.uniform(0.01, 0.02), STEPS)


def collapse_delays() -> dict[tuple[int, int], int | None]:
    """(fall, seed) -> steps into the fall when reward_collapse first fires (1: at the fall's
    first step, index 60), None if it never does."""
    delays = {}
    for fall in FALLS:
        for seed in SEEDS:
            steps = fired("reward_collapse", collapsing_reward(fall, seed))
            delays[fall, seed] = steps[0] - 59 if steps else None
    return delays


def false_alarms() -> list[int]:
    """The healthy runs where reward_collapse fires."""
    return [seed for seed in HEALTHY_RUNS if fired("reward_collapse", rising_reward(seed))]


def test_reward_collapse_catches_every_gradual_collapse_before_half_the_fall_plus_5() -> None:
    """All 15 falls are caught, none before the fall starts, and each by step 0.5 * fall + 5
    of it (the level is then still 0.4 * (1 - (0.5 fall + 5) / fall): 0.07 for a fall of 15,
    0.12 for 25). Why near the half: the rule fires once the 5-step mean has lost half the
    best 20-step mean, about 0.4 / 2 = 0.2; the 5-step mean lags its last step by 2 steps."""
    delays = collapse_delays()
    assert all(d is not None and 1 <= d <= 0.5 * fall + 5 for (fall, _), d in delays.items()), (
        delays
    )
    assert len(delays) == 15


def test_reward_collapse_is_quiet_on_50_healthy_rising_runs() -> None:
    assert false_alarms() == []


def test_an_abrupt_collapse_fires_at_its_third_step() -> None:
    """0.4 for 60 steps, then 0: no noise, so no margin; after k steps at 0 the 5-step mean is
    0.4 (5 - k) / 5 and has lost 0.08 k of the best 0.4; over half of it (0.2) from k = 3."""
    assert fired("reward_collapse", [0.4] * 60 + [0.0] * 10) == [62]
    noisy = np.concatenate([np.full(60, 0.4), np.zeros(10)])
    noisy += np.random.default_rng(0).normal(0.0, 0.02, noisy.size)
    assert fired("reward_collapse", noisy) == [62]  # noise sd 0.02: margin 6 * 0.02 * 0.5


def test_reward_collapse_waits_for_20_steps() -> None:
    """0.4 for 10 steps, then 0: nothing until 20 steps are in; at step 19 the best 20-step
    mean is 10 * 0.4 / 20 = 0.2 and the last 5 steps' is 0: all of it lost. The noise, from
    the 15 steps before the last 5 (one change of 0.4 in 14), is sqrt(pi) / 2 * 0.4 / 14 =
    0.025; the margin 6 * 0.025 * sqrt(1/5 + 1/20) = 0.076 < 0.2."""
    assert fired("reward_collapse", [0.4] * 10 + [0.0] * 20) == [19]


def test_the_margin_keeps_a_noisy_low_reward_quiet() -> None:
    """A reward alternating 0.1 and 0 (level 0.05) that then stays at 0 has lost all of its
    best 0.05, but its noise is sqrt(pi) / 2 * 0.1 = 0.089 and the margin 6 * 0.089 * 0.5 =
    0.27; a steady 0.05 that drops to 0 has no noise and fires: after k steps at 0 its 5-step
    mean has lost 0.01 k, over half of 0.05 from k = 3."""
    assert fired("reward_collapse", [0.1, 0.0] * 20 + [0.0] * 20) == []
    assert fired("reward_collapse", [0.05] * 40 + [0.0] * 20) == [42]
    assert noise([0.4, 0.44, 0.4, 0.44]) == pytest.approx(math.sqrt(math.pi) / 2 * 0.04)


def test_the_collapse_share_is_a_recipe_setting() -> None:
    """0.4 for 60 steps, then 0.26: after k steps the 5-step mean has lost 0.14 k / 5 =
    0.028 k, at most 0.14: never half of 0.4 (0.2), but over 0.3 of it (0.12) from k = 5
    (0.112 at k = 4): step 64."""
    drop = [0.4] * 60 + [0.26] * 10
    assert fired("reward_collapse", drop) == []
    assert fired("reward_collapse", drop, reward_collapse=0.3) == [64]
    with pytest.raises(ValueError, match="reward_collapse 3.0 is not a share; allowed: between"):
        detectors({"reward_collapse": 3.0})


# ---- every detector: its pattern, and a long healthy run ----------------------------------
def healthy_run(seed: int) -> dict[str, np.ndarray]:
    """1,000 steps of a healthy small run: 16 samples a step in 4 prompt groups, so the rates
    move in steps of 1/16 and the share of groups with reward variance in quarters."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)

    def share(p, n: int = 16) -> np.ndarray:
        return rng.binomial(n, p, STEPS) / n

    return {
        "reward/total": 0.02 + 0.43 * (1 - np.exp(-t / 200)) + rng.normal(0.0, 0.02, STEPS),
        # rises to 0.3 (a quickstart ends near it), a third of it noise
        "train/kl": 0.3 * (1 - np.exp(-t / 300)) * np.exp(rng.normal(0.0, 0.3, STEPS)),
        "rollout/logprob_diff_mean": 0.03 * np.exp(rng.normal(0.0, 0.2, STEPS)),
        # falls to 0.4 of its start as the policy sharpens; 30 % noise a step, as on the CPU
        "health/entropy": (0.4 + 0.6 * np.exp(-t / 300)) * np.exp(rng.normal(0.0, 0.3, STEPS)),
        "health/repeated_ngrams": np.clip(rng.normal(0.08, 0.04, STEPS), 0.0, 1.0),
        "health/non_ascii": np.clip(rng.normal(0.0005, 0.001, STEPS), 0.0, 1.0),
        "health/groups_with_variance": share(0.6, n=4),
        # a tight budget truncates most episodes at first, then fewer as the policy learns
        "rollout/truncated_fraction": share(0.1 + 0.6 * np.exp(-t / 100)),
        "rollout/example_copy_rate": share(0.05),
        "rollout/hedged_answers": share(0.02),
        "rollout/passage_copy_rate": share(0.1),
        "rollout/token_mismatch": np.zeros(STEPS),
        "rollout/template_mismatch": np.zeros(STEPS),
        # a timeout or a judge's empty reply now and then
        "rollout/environment_failed": share(0.005),
        "rollout/failed": share(0.005),
        "reward/judge_failures": share(0.005),
        "rollout/tool_error_rate": np.clip(rng.normal(0.1, 0.05, STEPS), 0.0, 1.0),
    }


#: detector -> (its metric's level for 60 steps, its level from step 60 on, the steps into the
#: pattern when it fires: 0 at step 60)
PATTERNS: dict[str, tuple[float, float, int]] = {
    # 0.4, then 0: the 5-step mean has lost 0.08 k of 0.4 after k steps, over half from k = 3
    "reward_collapse": (0.4, 0.0, 2),
    # median 0.05: 10 times it is 0.5, the floor 0.5; 5.0 is over both at once (and over 10
    # times the healthy run's median, near 0.25)
    "kl_blowup": (0.05, 5.0, 0),
    "logprob_gap_blowup": (0.03, 0.8, 0),
    # start 1.0; the 5-step mean after k steps at 0.1 is (5 - 0.9 k) / 5, under 0.2 from k = 5
    "entropy_collapse": (1.0, 0.1, 4),
    "degenerate_text": (0.05, 0.8, 1),  # over 0.5 for 2 steps
    "non_ascii_text": (0.001, 0.4, 1),  # over 0.2 for 2 steps
    # the 10-step mean after k steps at 0 is 0.75 (10 - k) / 10, under 0.25 from k = 7; 3 steps
    "no_variance": (0.75, 0.0, 8),
    "truncation": (0.2, 1.0, 2),  # over 0.9 for 3 steps
    "example_copying": (0.05, 0.9, 1),  # over 0.5 for 2 steps
    "hedging": (0.0, 0.5, 1),  # over 0.2 for 2 steps
    "passage_copying": (0.1, 0.8, 2),  # over 0.5 for 3 steps
    "token_mismatch": (0.0, 2.0, 0),  # over 0 at once
    "template_mismatch": (0.0, 0.25, 0),  # over 0 at once
    "environment_failures": (0.0, 0.5, 0),  # the 3-step mean is 0.17 at once
    "tool_failures": (0.0, 0.5, 1),  # the 5-step mean is 0.1, then 0.2
    "tool_errors": (0.1, 0.8, 2),  # over 0.5 for 3 steps
    "judge_failures": (0.0, 0.5, 0),  # the 3-step mean is 0.17 at once
}


def test_every_detector_has_a_pattern() -> None:
    assert set(PATTERNS) == set(DEFAULTS)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_each_detector_fires_when_its_pattern_starts(name: str) -> None:
    before, after, steps_in = PATTERNS[name]
    assert fired(name, [before] * 60 + [after] * 20) == [60 + steps_in]


@pytest.mark.parametrize("seed", range(10))
def test_no_detector_fires_on_a_long_healthy_run(seed: int) -> None:
    run = {metric: values.tolist() for metric, values in healthy_run(seed).items()}
    assert scan(run) == []


@pytest.mark.parametrize("name", list(PATTERNS))
def test_each_detector_still_fires_after_a_long_healthy_run(name: str) -> None:
    """The healthy run's 1,000 steps, then 30 steps of the pattern's level: the detector fires
    within them, and only there (its median, start and best come from the healthy steps)."""
    metric = DEFAULTS[name][0]
    series = healthy_run(0)[metric].tolist() + [PATTERNS[name][1]] * 30
    steps = fired(name, series)
    assert steps and all(STEPS <= s < STEPS + 30 for s in steps), steps


if __name__ == "__main__":
    delays = collapse_delays()
    caught = sum(d is not None for d in delays.values())
    print(f"reward_collapse: collapses detected {caught}/{len(delays)}; steps into the fall:")
    for fall in FALLS:
        print(f"  fall of {fall}: {[delays[fall, seed] for seed in SEEDS]}")
    print(f"healthy false alarms {len(false_alarms())}/{len(HEALTHY_RUNS)}")
