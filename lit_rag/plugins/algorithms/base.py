"""Algorithm base (DESIGN.md step 4): trajectories + rewards -> batch; log-probs -> loss.

An algorithm never generates text and imports nothing from Lightning (STYLE.md 1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from lit_rag.types import RewardBreakdown, Trajectory


@dataclass
class LossOutput:
    """What an algorithm's loss returns.

    Args:
        loss: Scalar to backpropagate.
        metrics: Detached scalars to log (name -> value).
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Algorithm(ABC):
    """Turns a rollout batch into training rows and computes the policy loss.

    Attributes:
        mu: Optimization passes over each rollout batch (GRPO's mu).
        needs_reference: Whether reference log-probs must be computed for the batch.
    """

    mu: int = 1
    needs_reference: bool = True

    @abstractmethod
    def prepare(self, trajectories: list[Trajectory], rewards: RewardBreakdown) -> dict:
        """Advantages (or pairs), filtering; returns per-trajectory fields for :meth:`loss`."""

    @abstractmethod
    def loss(self, batch: dict) -> LossOutput:
        """Loss of one micro-batch; ``batch`` holds ``logprobs`` [B, L] with grad and the
        fields :meth:`prepare` produced, sliced to the micro-batch."""
