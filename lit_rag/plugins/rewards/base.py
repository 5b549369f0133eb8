"""Reward plugin base (DESIGN.md step 3): trajectories + their examples -> RewardBreakdown."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lit_rag.types import RewardBreakdown, Trajectory


class Reward(ABC):
    """Scores trajectories. Pure: no model, no GPU, never raises on model text.

    Subclasses with weighted components keep them in ``self.weights`` (component -> weight),
    which schedule callbacks may change between steps through :meth:`set_weights`.
    """

    weights: dict[str, float]

    @abstractmethod
    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory against ``trajectory.example``."""

    def set_weights(self, weights: dict[str, float]) -> None:
        """Replace some component weights; unknown names are an error."""
        unknown = sorted(set(weights) - set(getattr(self, "weights", {})))
        if unknown:
            known = ", ".join(sorted(getattr(self, "weights", {}))) or "none"
            raise ValueError(f"unknown reward component(s) {unknown}; this reward has: {known}")
        self.weights.update(weights)
