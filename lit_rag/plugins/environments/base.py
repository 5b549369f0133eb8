"""Environment base (DESIGN.md step 2): examples -> trajectories. Never computes rewards."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lit_rag.rollout.base import RolloutEngine, SamplingParams
from lit_rag.types import Example, Trajectory


class Environment(ABC):
    """Builds prompts, drives the engine (and retriever for tool turns), returns trajectories."""

    @abstractmethod
    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """``group_size`` trajectories per example, grouped contiguously (``group`` = index)."""

    @abstractmethod
    def extract_answer(self, trajectory: Trajectory) -> str:
        """The final answer the trajectory gave ("" when it gave none)."""
