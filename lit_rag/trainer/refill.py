"""DAPO's dynamic sampling (DAPO, Yu et al. 2025, Section 3.2): when a step's groups carry
no gradient (every sample of a group got the same reward), sample more prompts until enough
groups vary.

The prompts come from whatever the run's datamodule offers as a pool: a datamodule with a
``pool()`` method (the training examples) and a ``seed`` refills; another has nothing to draw
from and the step trains on what it has. Nothing here knows the datamodule's class.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lit_rag.types import Example, RewardBreakdown, Trajectory


def draw_from_pool(datamodule, n: int, key: str) -> list[Example]:
    """``n`` examples drawn from ``datamodule.pool()`` with an RNG seeded by the datamodule's
    seed and ``key`` (step, round, rank), so a resumed run draws the same; ``[]`` when the
    datamodule offers no pool."""
    pool = getattr(datamodule, "pool", None)
    if not callable(pool):
        return []
    examples = pool()
    rng = random.Random(f"{getattr(datamodule, 'seed', 0)}-refill-{key}")
    return rng.sample(examples, min(n, len(examples)))


@dataclass
class Refill:
    """One step's refill rounds.

    Args:
        rollout: Examples -> their groups of trajectories (the step's sampling settings).
        score: The reward.
        informative: ``(trajectories, rewards) -> groups with reward variance`` (the
            algorithm's ``informative_groups``).
        draw: ``(n, round_index) -> up to n extra examples``.
        any_rank: Whether a flag holds on any rank (ranks refill together).
    """

    rollout: Callable[[list[Example]], list[Trajectory]]
    score: Callable[[list[Trajectory]], RewardBreakdown]
    informative: Callable[[list[Trajectory], RewardBreakdown], int]
    draw: Callable[[int, int], list[Example]]
    any_rank: Callable[[bool], bool]

    def run(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown, target: int, rounds: int
    ) -> tuple[list[Trajectory], RewardBreakdown, int]:
        """Sample extra prompts until ``target`` groups have reward variance, at most ``rounds``
        extra rounds, each drawing as many prompts as groups are missing; returns the grown
        trajectories and rewards and the rounds used.

        Ranks refill together: a round runs on every rank while any rank still draws, a rank
        with nothing to draw rolling out no prompt (an engine shared by a tensor-parallel group
        of ranks needs every rank in every rollout)."""
        used = 0
        while True:
            missing = 0
            if used < rounds:
                missing = max(0, target - self.informative(trajectories, rewards))
            extra = self.draw(missing, used) if missing else []
            if not self.any_rank(bool(extra)):
                return trajectories, rewards, used
            more = self.rollout(extra)
            used += 1
            if more:
                trajectories, rewards = self._append(trajectories, rewards, more)

    def _append(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown, more: list[Trajectory]
    ) -> tuple[list[Trajectory], RewardBreakdown]:
        """``more`` after ``trajectories``, its groups numbered after theirs (never merged)."""
        offset = max(t.group for t in trajectories) + 1
        for t in more:
            t.group += offset
        more_rewards = self.score(more)
        return trajectories + more, RewardBreakdown(
            total=torch.cat([rewards.total, more_rewards.total]),
            components={
                k: torch.cat([v, more_rewards.components[k]]) for k, v in rewards.components.items()
            },
            failed=_either_failed(rewards, more_rewards),
        )


def _either_failed(first: RewardBreakdown, second: RewardBreakdown) -> torch.Tensor | None:
    """The ``failed`` flags of ``first`` then ``second`` (None when neither has any)."""
    if first.failed is None and second.failed is None:
        return None
    flags = [
        r.failed if r.failed is not None else torch.zeros(len(r.total), dtype=torch.bool)
        for r in (first, second)
    ]
    return torch.cat(flags)
