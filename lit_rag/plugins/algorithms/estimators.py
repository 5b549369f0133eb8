"""Advantage estimators for GRPO-family algorithms (``advantage:`` in a recipe).

Each is a registered function ``(rewards [N], groups [N], scale_rewards) -> advantages [N]``
(entry-point group ``lit_rag.advantages``; :data:`lit_rag.api.AdvantageFn`). ``groups`` holds
each row's prompt group; ``scale_rewards`` divides the centered rewards by the group's std
(``group``), the whole batch's std (``batch``) or nothing (``none``). std is the sample std
(Bessel-corrected), as TRL and Open-R1 compute it; 1e-4 keeps a flat group finite.
"""

from __future__ import annotations

import torch


def _scaled(
    centered: torch.Tensor, group_std: torch.Tensor, batch_std: torch.Tensor, scale_rewards: str
) -> torch.Tensor:
    if scale_rewards == "group":
        return centered / (group_std + 1e-4)
    if scale_rewards == "batch":
        return centered / (batch_std + 1e-4)
    return centered


def _std(values: torch.Tensor) -> torch.Tensor:
    return values.std() if values.numel() > 1 else values.new_tensor(0.0)


def grpo(rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """Group-relative advantage (DeepSeekMath Section 4.1.2): ``A_i = (r_i - mean(r_group)) / std``.

    Example:
        rewards ``[1, 0, 0, 1]`` in one group: mean 0.5, sample std sqrt(1/3) = 0.577, so
        ``A = [0.866, -0.866, -0.866, 0.866]`` (0.5 / (0.577 + 1e-4)).
    """
    advantages = torch.zeros_like(rewards)  # [N]
    batch_std = _std(rewards)
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]  # [G]
        advantages[idx] = _scaled(r - r.mean(), _std(r), batch_std, scale_rewards)
    return advantages


def rloo(rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "none") -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al., 2019; Ahmadian et al., 2024, "Back to Basics",
    Section 3.2): each sample's baseline is the mean reward of the *other* samples of its group,

        A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean(r_group)),

    an unbiased baseline (it does not depend on the sample it scores). A group of one has no
    other sample: its advantage is 0. The recipe's ``scale_rewards`` applies after (the paper
    uses none; ``group`` / ``batch`` divide by the std as for GRPO).

    Example:
        rewards ``[1, 2, 3, 6]`` in one group: A_0 = 1 - (2 + 3 + 6) / 3 = -8/3,
        A_1 = 2 - 10/3 = -4/3, A_2 = 3 - 3 = 0, A_3 = 6 - 2 = 4.
    """
    advantages = torch.zeros_like(rewards)  # [N]
    batch_std = _std(rewards)
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]  # [G]
        if r.numel() < 2:
            continue
        baseline = (r.sum() - r) / (r.numel() - 1)  # [G], the mean of the others
        advantages[idx] = _scaled(r - baseline, _std(r), batch_std, scale_rewards)
    return advantages
