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

import time

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
#: reach ``max_steps`` while a server stays down) ...
OUTAGE_STEPS = 3
#: ... once that has also lasted this long (seconds): a step of failures is quick, and a
#: server that reconnects (MCP: up to 30 s between tries) gets the time to come back
OUTAGE_SECONDS = 120.0


class Outage:
    """Counts steps in a row in which every episode failed for the environment's fault; the
    run stops with one line once there are ``limit`` of them over at least ``seconds``."""

    def __init__(self, limit: int = OUTAGE_STEPS, seconds: float = OUTAGE_SECONDS) -> None:
        if seconds < 0:
            raise ValueError(f"model environment_outage_s must be >= 0, got {seconds}")
        self.limit, self.seconds = limit, seconds
        self.steps, self.since = 0, 0.0

    def record(self, everything_failed: bool, now: float | None = None) -> None:
        """One step: ``everything_failed`` on every rank (the caller agrees it across ranks)."""
        now = time.monotonic() if now is None else now
        if not everything_failed:
            self.steps = 0
        elif self.steps == 0:
            self.steps, self.since = 1, now
        else:
            self.steps += 1
        self.now = now

    def due(self) -> bool:
        """Whether the run should stop (on this rank's clock: the caller agrees across ranks)."""
        return self.steps >= self.limit and self.now - self.since >= self.seconds

    def error(self, why: str):
        """The one line the run stops with."""
        from lit_rag.errors import InputError

        return InputError(
            f"model: the environment failed every episode of the last {self.steps} steps "
            f"({self.now - self.since:.0f} s; first: {why or 'the reward could not score them'}),"
            " so nothing trains; check the tools' servers and the judge, or train on them as "
            "scored with model.environment_failures: keep"
        )


def first_failure(trajectories: list[Trajectory]) -> str:
    """Why the first failed episode failed ("" when none says)."""
    return next((t.failed for t in trajectories if t.failed), "")
