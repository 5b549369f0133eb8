"""Episodes the environment failed, not the policy: they leave the loss and their group's
baseline.

A tool server that died, a tool that timed out or a judge that gave no verdict says nothing
about the policy's text. Scored 0 (or a judge's ``failure_reward``) and kept in its GRPO
group, such an episode pushes the group's baseline down and gets a negative advantage for the
environment's fault; the episodes of a search agent that did search are the ones that meet a
dead search server. So by default (``model.environment_failures: drop``) they are taken out
before the algorithm sees the batch: the group's baseline is the mean of its other samples,
and a group left with one sample carries no gradient. ``keep`` trains on them as scored.
Either way the step logs their share (``rollout/environment_failed``), which the
``environment_failures`` health detector watches.
"""

from __future__ import annotations

import torch

from lit_rag.types import RewardBreakdown, Trajectory

#: what ``model.environment_failures`` may say
ENVIRONMENT_FAILURES = ("drop", "keep")


def check_setting(value: str) -> str:
    """``value`` when it is one of :data:`ENVIRONMENT_FAILURES` (else one line)."""
    if value not in ENVIRONMENT_FAILURES:
        raise ValueError(
            f"model environment_failures: got {value!r}; allowed: {', '.join(ENVIRONMENT_FAILURES)}"
        )
    return value


def environment_failed(trajectories: list[Trajectory], rewards: RewardBreakdown) -> torch.Tensor:
    """``[N]`` bool: the episodes the environment failed (:attr:`Trajectory.failed`) or the
    reward could not score (:attr:`RewardBreakdown.failed`)."""
    flags = torch.tensor([bool(t.failed) for t in trajectories], dtype=torch.bool)
    if rewards.failed is not None:
        flags = flags | rewards.failed.to(torch.bool).reshape(-1)[: len(trajectories)].cpu()
    return flags


def keep_rows(
    trajectories: list[Trajectory], rewards: RewardBreakdown, keep: torch.Tensor
) -> tuple[list[Trajectory], RewardBreakdown]:
    """The trajectories where ``keep`` ([N] bool) holds, with their rewards."""
    kept = [t for t, k in zip(trajectories, keep.tolist(), strict=True) if k]
    return kept, RewardBreakdown(
        total=rewards.total[keep],
        components={name: value[keep] for name, value in rewards.components.items()},
        failed=None if rewards.failed is None else rewards.failed[keep],
    )


#: steps in a row in which the environment failed every episode on every rank before the run
#: stops (``environment_failures: drop``: such a step trains on nothing, so the run would never
#: reach ``max_steps`` while a server stays down)
OUTAGE_STEPS = 3


class Outage:
    """Counts steps in a row in which every episode failed for the environment's fault and
    stops the run with one line at :data:`OUTAGE_STEPS`."""

    def __init__(self, limit: int = OUTAGE_STEPS) -> None:
        self.limit, self.steps = limit, 0

    def update(self, everything_failed: bool, why: str) -> None:
        """One step: ``everything_failed`` on every rank (the caller agrees it across ranks).

        Raises:
            InputError: The limit is reached (one line naming the last failure).
        """
        from lit_rag.errors import InputError

        self.steps = self.steps + 1 if everything_failed else 0
        if self.steps >= self.limit:
            raise InputError(
                f"model: the environment failed every episode of the last {self.steps} steps "
                f"(first: {why or 'the reward could not score them'}), so nothing trains; check "
                "the tools' servers and the judge, or train on them as scored with "
                "model.environment_failures: keep"
            )


def first_failure(trajectories: list[Trajectory]) -> str:
    """Why the first failed episode failed ("" when none says)."""
    return next((t.failed for t in trajectories if t.failed), "")
