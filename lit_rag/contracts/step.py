"""What one training step hands to callbacks (docs/DESIGN.md step 6).

``PolicyModule.training_step`` returns ``{"step": StepOutput(...)}``; Lightning passes that
mapping to every callback's ``on_train_batch_end`` as ``outputs``, and
:meth:`StepOutput.of` reads it back::

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = StepOutput.of(outputs)
        if step is not None:
            ...  # step.trajectories, step.rewards, step.metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from lit_rag.types import RewardBreakdown, Trajectory


@dataclass
class StepOutput:
    """One training step's rollout, its rewards and the metrics it logged.

    Args:
        trajectories: Every trajectory the step sampled (refilled groups included, numbered
            after the batch's ``batch_size`` prompt groups).
        rewards: Their rewards, row for row.
        metrics: What the step logged, by key (``reward/total``, ``train/kl``, ...), this
            rank's values before any reduction across ranks.
        batch_size: Prompts in the step's batch (groups ``0 .. batch_size - 1``).
    """

    trajectories: list[Trajectory]
    rewards: RewardBreakdown
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    batch_size: int = 0

    @staticmethod
    def of(outputs: object) -> StepOutput | None:
        """The step output inside Lightning's ``outputs`` of ``on_train_batch_end``, or None."""
        if isinstance(outputs, Mapping):
            step = outputs.get("step")
            return step if isinstance(step, StepOutput) else None
        return None

    def as_outputs(self) -> dict[str, StepOutput]:
        """What ``training_step`` returns (manual optimization accepts a mapping)."""
        return {"step": self}
