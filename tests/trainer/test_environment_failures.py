"""Episodes the environment failed (a dead tool server, a timeout, a judge with no verdict) leave
the loss and their group's baseline by default; ``environment_failures: keep`` trains on them
as scored; either way the step logs their share and a health detector watches it."""

from __future__ import annotations

import pytest
import torch
from kit import trajectory

from lit_rag.health.detectors import detectors
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.rewards.composite import CompositeReward
from lit_rag.plugins.rewards.qa import ExactMatchReward
from lit_rag.trainer.failures import environment_failed, keep_rows
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import RewardBreakdown


def module(setting: str = "drop") -> PolicyModule:
    return PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2)),
        environment=SingleTurnEnvironment(),
        reward=ExactMatchReward(),
        algorithm=GRPO(),
        environment_failures=setting,
    )


def batch():
    """Two groups of three; in group 0 the sample that searched met a dead server (scored 0),
    in group 1 the judge gave no verdict for one sample."""
    trajectories = [trajectory(group=g, tokens=4) for g in (0, 0, 0, 1, 1, 1)]
    trajectories[2].failed = "search is unavailable: connection refused"
    rewards = RewardBreakdown(
        total=torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
        components={"em": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])},
        failed=torch.tensor([False, False, False, False, False, True]),
    )
    return trajectories, rewards


def test_failed_episodes_leave_the_batch_and_their_groups_baseline():
    trajectories, rewards = batch()
    out, _, prepared = module("drop").prepare(trajectories, rewards, prompts=2)
    assert out is trajectories  # every episode is still logged
    assert prepared.batch.size == 4
    # each group's baseline is the mean of its two remaining samples (0.5); kept, the failed
    # 0 would lower it to 1/3
    expected = torch.tensor([1.0, -1.0, 1.0, -1.0]) * 0.5 / torch.tensor([1.0, 0.0]).std()
    assert torch.allclose(prepared.batch.advantages, expected, atol=1e-3)
    assert prepared.metrics["environment_failed"].item() == pytest.approx(2 / 6)


def test_keep_trains_on_them_as_scored():
    trajectories, rewards = batch()
    _, _, prepared = module("keep").prepare(trajectories, rewards, prompts=2)
    assert prepared.batch.size == 6
    assert prepared.metrics["environment_failed"].item() == pytest.approx(2 / 6)


def test_a_step_whose_episodes_all_failed_trains_on_nothing():
    trajectories, rewards = batch()
    for t in trajectories:
        t.failed = "the judge endpoint is down"
    _, _, prepared = module().prepare(trajectories, rewards, prompts=2)
    assert prepared.batch is None and prepared.metrics["environment_failed"].item() == 1.0


def test_the_setting_is_checked_in_one_line():
    with pytest.raises(ValueError, match="environment_failures: got 'skip'; allowed: drop, keep"):
        module("skip")


def test_flags_come_from_episodes_and_rewards_and_rows_stay_aligned():
    trajectories, rewards = batch()
    flags = environment_failed(trajectories, rewards)
    assert flags.tolist() == [False, False, True, False, False, True]
    kept, kept_rewards = keep_rows(trajectories, rewards, ~flags)
    assert len(kept) == 4 and kept_rewards.components["em"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert kept_rewards.failed.tolist() == [False] * 4


def test_a_composite_reward_fails_a_sample_any_child_failed():
    class Failing(ExactMatchReward):
        def __call__(self, trajectories):
            out = super().__call__(trajectories)
            out.failed = torch.tensor([True] + [False] * (len(trajectories) - 1))
            return out

    trajectories, _ = batch()
    out = CompositeReward([ExactMatchReward(), Failing()])(trajectories)
    assert out.failed.tolist() == [True] + [False] * 5


def test_the_detectors_watch_failures_and_template_mismatches():
    chosen = {d.name: d for d in detectors()}
    assert chosen["environment_failures"].update(0.05) is None
    assert "environment failures" in chosen["environment_failures"].update(0.3)
    assert "template mismatch" in chosen["template_mismatch"].update(0.25)
    assert chosen["judge_failures"].update(0.5).startswith("judge failures")
    tool_errors = chosen["tool_errors"]
    assert [tool_errors.update(0.8) for _ in range(3)][-1].startswith("tool errors")


def test_steps_in_a_row_where_everything_failed_stop_the_run_in_one_line():
    from lit_rag.trainer.failures import Outage

    outage = Outage(limit=3, seconds=60.0)
    for now, everything in enumerate((True, True, False, True, True, True)):
        outage.record(everything, now=float(now))  # a step with one success resets it
    assert outage.steps == 3 and not outage.due()  # three steps, but within a minute
    outage.record(True, now=63.0)
    assert outage.due()
    line = str(outage.error("search is unavailable"))
    assert "last 4 steps (60 s; first: search is unavailable)" in line
    assert "\n" not in line and "environment_failures: keep" in line
