"""``reinforce_loo``: REINFORCE with a leave-one-out baseline (RLOO).

Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs" (arXiv:2402.14740), its RLOO estimator (from Kool et al., 2019,
"Buy 4 REINFORCE Samples, Get a Baseline for Free!"). The whole
completion is one action. Each of the k samples of a prompt is baselined by the mean reward of
the other k - 1, and the policy follows the plain REINFORCE gradient of the sequence's
log-probability:

    A_i  = r_i - 1/(k-1) sum_{j != i} r_j
    loss = -1/N sum_i A_i log pi(y_i | x),        log pi(y_i | x) = sum_t log pi(y_i,t | x, y_i,<t)

Where this departs from the paper, and why:

- The paper puts the KL penalty in the reward, ``r_i = R(x, y_i) - beta log(pi(y_i) /
  pi_ref(y_i))``, and baselines that. An algorithm sees the reference log-probs only in
  :meth:`~ReinforceLOO.loss` (the policy module adds them per micro-batch, after
  :meth:`~ReinforceLOO.prepare`), and a micro-batch need not hold a whole group. So the
  leave-one-out baseline is taken over the task reward, and each row's own KL estimate
  ``beta * sum_t (log pi - log pi_ref)`` is subtracted from its advantage without one. The
  gradient stays unbiased (a baseline that does not depend on the sample it scores adds no
  bias); its variance is a little higher when ``beta > 0``.
- It is on-policy by construction: one pass and one optimizer step per rollout batch, no
  importance ratio, no clipping (the paper finds PPO's clipping rarely active when fine-tuning a
  pretrained model, and drops it).

This is not ``grpo`` with ``advantage: rloo``: that keeps GRPO's per-token clipped ratio, its
per-sequence length normalization and its KL term in the loss; here each token's gradient is
weighted by its sequence's advantage over N rows, with no length normalization.
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Algorithm,
    LossOutput,
    Prepared,
    RewardBreakdown,
    TrainBatch,
    Trajectory,
    collate,
)

__all__ = ["ReinforceLOO", "leave_one_out"]


def leave_one_out(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``A_i = r_i - mean(r_j for the other j of i's group)``; 0 for a group of one.

    Example:
        rewards ``[1, 2, 3, 6]`` in one group: A_0 = 1 - (2 + 3 + 6) / 3 = -8/3,
        A_1 = 2 - 10/3 = -4/3, A_2 = 3 - 3 = 0, A_3 = 6 - 2 = 4. They sum to 0.

    Args:
        rewards: ``[N]`` one reward per sample.
        groups: ``[N]`` the prompt group of each sample.

    Returns:
        ``[N]`` advantages.
    """
    advantages = torch.zeros_like(rewards)  # [N]
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]  # [k]
        if r.numel() > 1:
            advantages[idx] = r - (r.sum() - r) / (r.numel() - 1)
    return advantages


class ReinforceLOO(Algorithm):
    """REINFORCE with a leave-one-out baseline over each prompt's group of samples.

    Example:
        A group of 4 with rewards ``[1, 2, 3, 6]`` gets advantages ``[-8/3, -4/3, 0, 4]``; with
        ``beta = 0`` the loss of the batch is ``-1/4 sum_i A_i sum_t log pi(y_i,t)``.

    Args:
        beta: KL coefficient (0 turns the reference model off). Each row's advantage loses
            ``beta`` times its sequence KL to the reference, ``sum_t (log pi - log pi_ref)``
            (a sum over tokens: keep ``beta`` small for long completions).
    """

    mu = 1  # on-policy: one pass, one optimizer step per rollout batch

    def __init__(self, beta: float = 0.05) -> None:
        if beta < 0:
            raise ValueError(f"reinforce_loo beta: got {beta}; expected >= 0")
        self.beta = float(beta)

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self.beta > 0

    @property
    def kl_coef(self) -> float:  # type: ignore[override]
        return self.beta

    @kl_coef.setter
    def kl_coef(self, value: float) -> None:  # a KL controller (KLMonitor target) adapts it
        self.beta = float(value)

    def prepare(
        self,
        trajectories: list[Trajectory],
        rewards: RewardBreakdown,
        max_groups: int | None = None,
    ) -> Prepared:
        """Leave-one-out advantages; token weights ``mask / N`` (sum over tokens, mean over
        rows), so micro-batch losses add up to the batch's."""
        total = rewards.total.float()  # [N]
        if total.dim() != 1:
            raise ValueError(
                f"reinforce_loo needs one reward per trajectory; got shape {tuple(total.shape)}"
            )
        if not trajectories:
            return Prepared(batch=None)
        advantages = leave_one_out(total, torch.tensor([t.group for t in trajectories]))
        batch = collate(trajectories)
        batch.advantages = advantages  # [N]
        batch.token_weights = batch.completion_mask / len(trajectories)  # [N, C]
        batch.normalizer = float(len(trajectories))  # a mean over rows, global over ranks
        metrics = {"advantage_abs_mean": advantages.abs().mean()}
        return Prepared(batch=batch, metrics=metrics)

    def loss(self, batch: TrainBatch) -> LossOutput:
        mask = batch.completion_mask  # [B, C]
        keep = mask > 0
        # tokens outside the loss become a constant: exactly zero gradient there
        logp = torch.where(keep, batch.logprobs, 0.0)  # [B, C], with grad
        advantages = batch.advantages  # [B]
        metrics: dict[str, torch.Tensor] = {}
        if self.beta > 0:
            ref = torch.where(keep, batch.ref_logprobs, 0.0)  # [B, C]
            kl = (logp.detach() - ref).sum(-1)  # [B], k1 estimate of the sequence KL
            advantages = advantages - self.beta * kl
            metrics["kl"] = kl.sum() / mask.sum().clamp(min=1)  # per token, as GRPO logs it
            metrics["kl_sequence"] = kl.mean()
        per_token = -advantages.unsqueeze(-1) * logp  # [B, C]
        return LossOutput(loss=(per_token * batch.token_weights).sum(), metrics=metrics)
