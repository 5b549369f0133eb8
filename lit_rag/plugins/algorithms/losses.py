"""Policy losses for GRPO-family algorithms (``policy_loss:`` in a recipe).

Each is a registered function ``(logprobs, old_logprobs, advantages, mask, config) -> TokenLoss``
(entry-point group ``lit_rag.policy_losses``; :data:`lit_rag.api.PolicyLossFn`). Inputs:
``logprobs`` ``[B, C]`` under the current policy (with grad), ``old_logprobs`` ``[B, C]`` under
the policy that sampled, ``advantages`` ``[B]``, ``mask`` ``[B, C]`` (1 on tokens in the loss;
the caller has already set the other tokens' log-probs to 0). The per-token loss comes back
unaggregated: the algorithm weights it (its ``loss_aggregation``) and adds its KL term.
"""

from __future__ import annotations

import torch

from lit_rag.api import PolicyLossConfig, TokenLoss


def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig,
) -> TokenLoss:
    """PPO's clipped surrogate per token (GRPO, DeepSeekMath Eq. 3; DAPO's asymmetric clip):

        ratio_t = pi(o_t) / pi_old(o_t),
        L_t = -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A)

    Example:
        ratio 1.5 with A = 1 and eps 0.2: L = -min(1.5, 1.2) = -1.2 (clipped: no gradient);
        with A = -1: L = -min(-1.5, -1.2) = 1.5 (not clipped: the pessimistic side).
    """
    adv = advantages.unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(logprobs - old_logprobs)  # [B, C]
    clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)  # [B, C]
    tokens = mask.sum().clamp(min=1)
    clip_fraction = (((ratio - clipped).abs() > 0).float() * mask).sum().detach() / tokens
    return TokenLoss(per_token=per_token, metrics={"clip_fraction": clip_fraction})


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig,
) -> TokenLoss:
    """GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization", Section 4.1-4.2): one
    importance ratio per sequence, the length-normalized sequence likelihood ratio

        s_i = (pi(y_i) / pi_old(y_i)) ^ (1 / |y_i|)
            = exp(mean_t (log pi(y_i,t) - log pi_old(y_i,t))),

    clipped at the sequence level:
    ``L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``. Written per token as
    GSPO-token (Section 4.3) with ``s_i,t = sg[s_i] pi(y_i,t) / sg[pi(y_i,t)]``: every token's
    value is s_i and its gradient s_i grad log pi(y_i,t), so with ``sequence`` aggregation
    (1 / |y_i| per token, GSPO's own) the loss and gradient are the paper's.
    Section 5.1 clips at eps_low 3e-4, eps_high 4e-4 (set ``epsilon`` / ``epsilon_high``).

    Example:
        token log-ratios ``[0.2, 0.0]`` on a 2-token sequence with A = 1: s = exp(0.1) = 1.105;
        with eps 0.2 the loss per token is -1.105 (inside the clip range); with eps_high 4e-4 it
        is -1.0004 and the sequence counts as clipped.
    """
    adv = advantages.unsqueeze(-1)  # [B, 1]
    lengths = mask.sum(-1).clamp(min=1)  # [B]
    log_s = ((logprobs - old_logprobs) * mask).sum(-1) / lengths  # [B]
    # [B, C], value s_i
    ratio = torch.exp(log_s.detach().unsqueeze(-1) + logprobs - logprobs.detach())
    clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)  # [B, C]
    s = log_s.detach().exp()  # [B]
    was_clipped = ((s < 1 - config.epsilon_low) | (s > 1 + config.epsilon_high)).float()
    rows = (mask.sum(-1) > 0).float()  # sequences with tokens in the loss
    return TokenLoss(
        per_token=per_token,
        metrics={
            "clip_fraction": (was_clipped * rows).sum() / rows.sum().clamp(min=1),
            "sequence_ratio_mean": (s * rows).sum() / rows.sum().clamp(min=1),
        },
    )
