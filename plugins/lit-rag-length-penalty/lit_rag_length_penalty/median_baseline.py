"""An advantage estimator: registered in ``lit_rag.advantages`` as ``median_baseline``
(pyproject.toml); a GRPO-family recipe selects it with ``advantage: median_baseline``."""

from __future__ import annotations

import torch


def median_baseline(
    rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "none"
) -> torch.Tensor:
    """``A_i = r_i - median(r_group)``: a baseline one outlier in the group does not move.

    The median of an even group is the mean of its two middle values (``torch.quantile``;
    ``torch.median`` would take the lower one). ``scale_rewards`` (the recipe's) divides by the
    group's sample std (``group``) or the batch's (``batch``) plus 1e-4, as GRPO's estimator does.

    Example:
        rewards ``[0, 1, 3, 10]`` in one group: median (1 + 3) / 2 = 2, so ``A = [-2, -1, 1, 8]``
        (the mean, 3.5, would give ``[-3.5, -2.5, -0.5, 6.5]``). A group of one gets 0.
    """
    advantages = torch.zeros_like(rewards)  # [N]
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]  # [G]
        centered = r - r.quantile(0.5)  # [G]
        if scale_rewards == "group" and r.numel() > 1:
            centered = centered / (r.std() + 1e-4)
        advantages[idx] = centered
    if scale_rewards == "batch" and rewards.numel() > 1:
        advantages = advantages / (rewards.std() + 1e-4)
    return advantages
