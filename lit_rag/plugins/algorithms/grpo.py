"""GRPO (DeepSeekMath Section 4.1) with the DAPO and Dr. GRPO options.

Objective per token t of sample i in a group of G samples of one prompt:

    A_i      = (r_i - mean(r_group)) / (std(r_group) + 1e-4)      group-normalized advantage
    ratio    = pi_theta(o_t) / pi_old(o_t)
    L_{i,t}  = -min(ratio * A_i, clip(ratio, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_{i,t}

ARENA (Section 3.2, Appendix E): G = 7, temperature 0.9, the "stabilized" KL estimator (k2,
see kl.py). The paper's values of beta, mu and eps were lost in our copy of Appendix E; the
recipe uses Open-R1's defaults (beta 0.04, mu 1, eps 0.2), ARENA's framework, and says so.

Aggregation (``loss_aggregation``), written as per-token weights so micro-batches just add up:
    ``sequence``  GRPO: mean over tokens of each sample, then over samples (1 / (|o_i| N)).
    ``token``     DAPO Section 3.3: mean over all tokens of the batch (1 / sum |o_i|).
    ``constant``  Dr. GRPO: sum over tokens divided by N x max_completion_length.
``scale_rewards``: ``group`` (GRPO), ``batch`` (std over the whole batch), ``none`` (Dr. GRPO).
DAPO options (Yu et al., 2025; R2AG Eq. 6 builds on them): asymmetric clip (``epsilon``,
``epsilon_high``), token-level aggregation, dynamic sampling (``drop_zero_variance_groups``
removes groups whose rewards are all equal, which carry no gradient; with
``dynamic_sampling_rounds`` > 0 the policy module samples extra prompts, as many as groups are
missing, in at most that many rounds, to keep the batch full (DAPO Algorithm 1 samples whole
batches; we sample the deficit), and ``prepare`` keeps at most the batch's number of groups),
and ``overlong``: ``keep`` truncated outputs in the loss, or ``mask`` them out of it (DAPO's
overlong filtering). R2AG instead zeroes their reward (the reward's job).
std is the sample std (Bessel-corrected), as TRL and Open-R1 compute it.

Truncated importance sampling (``importance_sampling_cap``, TIS; TRL's
``vllm_importance_sampling_correction``, verl's ``algorithm.rollout_correction``) weights the
policy-gradient term of each token by ``min(pi_old / pi_sampler, C)`` (detached; the KL term is
not weighted), with ``pi_sampler`` the engine's sampling log-prob: the distribution the token
was drawn from. The ratio corrects whatever makes the sampler differ from the trainer's pi_old:

- numerics: a rollout engine such as vLLM computes with its own kernels (and often another
  dtype), so pi_engine differs slightly from the trainer's pi_old even at equal weights;
- truncation: with top-p or top-k the sampler draws from the truncated, renormalized
  distribution, while pi_old is the full softmax at the temperature. For a kept token the
  ratio is the kept mass ``Z`` (top-p: ``Z`` in ``[top_p, 1]``): a real off-policy
  correction, not numerics, though only a partial one (tokens outside the nucleus are never
  sampled, which no weight can correct);
- age: samples from older weights (rollout workers ahead of the trainer).

A colocated engine at equal weights is thus corrected for numerics and truncation; the ``hf``
engine, which samples the live policy, mostly for truncation. The engine / trainer gap the run
logs (``rollout/logprob_diff_*``) counts only what truncation cannot explain.

Off by default in colocated runs, as verl ships it (``rollout_is: null``) and unlike TRL's GRPO
(``vllm_importance_sampling_correction=True``, sequence-level masking at 3.0): the paper recipes
train on the papers' objective, whose releases (ARENA's TRL 0.16, the verl Search-R1 vendors)
predate the correction, and a default-on cap would rescale their gradients by the truncation
(top-p 0.95: up to 5 % a token). Turn it on with ``importance_sampling_cap: 2`` (verl's and
ms-swift's threshold; TRL's is 3). Rollout workers that train on stale samples turn it on with
C = 2 (``accept_stale_samples``).

Variants are registered functions (docs/STYLE.md 13): ``advantage`` names the advantage estimator
(``grpo``, the group-normalized one above; ``rloo``, the leave-one-out baseline; see
:mod:`~lit_rag.plugins.algorithms.estimators`) and ``policy_loss`` the per-token surrogate
(``ppo_clip``, above; ``gspo``, the sequence-level ratio; see
:mod:`~lit_rag.plugins.algorithms.losses`). A third-party package adds its own under the entry-
point groups ``lit_rag.advantages`` / ``lit_rag.policy_losses`` and a recipe selects it by name.
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Algorithm,
    LossOutput,
    PolicyLossConfig,
    Prepared,
    RewardBreakdown,
    TrainBatch,
    Trajectory,
    advantage_estimator,
    collate,
)
from lit_rag.api import kl_estimator as kl_estimator_fn
from lit_rag.api import (
    policy_loss as policy_loss_fn,
)

AGGREGATIONS = ("sequence", "token", "constant")
SCALINGS = ("group", "batch", "none")


def _check_settings(
    *,
    overlong: str,
    dynamic_sampling_rounds: int,
    drop_zero_variance_groups: bool,
    loss_aggregation: str,
    scale_rewards: str,
    importance_sampling_cap: float | None,
    mu: int,
    mini_batches: int,
    beta: float,
    epsilon: float,
) -> None:
    """One line naming the bad ``grpo`` setting and what is allowed."""
    if overlong not in ("keep", "mask"):
        raise ValueError(f"grpo overlong '{overlong}' is not known; allowed: keep, mask")
    if dynamic_sampling_rounds < 0:
        raise ValueError(
            f"grpo dynamic_sampling_rounds must be >= 0, got {dynamic_sampling_rounds}"
        )
    if dynamic_sampling_rounds and not drop_zero_variance_groups:
        raise ValueError("grpo dynamic_sampling_rounds needs drop_zero_variance_groups: true")
    if loss_aggregation not in AGGREGATIONS:
        raise ValueError(
            f"grpo loss_aggregation '{loss_aggregation}' is not known; "
            f"allowed: {', '.join(AGGREGATIONS)}"
        )
    if scale_rewards not in SCALINGS:
        raise ValueError(
            f"grpo scale_rewards '{scale_rewards}' is not known; allowed: {', '.join(SCALINGS)}"
        )
    if importance_sampling_cap is not None and importance_sampling_cap < 1:
        raise ValueError(
            f"grpo importance_sampling_cap must be >= 1 (or null), got {importance_sampling_cap}"
        )
    if mu < 1 or mini_batches < 1:
        raise ValueError(f"grpo mu and mini_batches must be >= 1, got {mu}, {mini_batches}")
    if beta < 0 or epsilon < 0:
        raise ValueError(f"grpo beta and epsilon must be >= 0, got beta={beta}, epsilon={epsilon}")


class GRPO(Algorithm):
    """Group Relative Policy Optimization.

    Args:
        beta: KL coefficient; 0 turns the reference model off.
        kl_estimator: ``k1``, ``k2``, ``k3`` or ``stabilized`` (= k2, ARENA).
        epsilon: Lower clip range eps_low (and upper, unless ``epsilon_high`` is set).
        epsilon_high: Upper clip range (DAPO clip-higher: 0.28).
        mu: Optimization passes over each rollout batch.
        mini_batches: Optimizer steps per pass: the kept groups in this many consecutive parts
            of near-equal size (a group is never cut), each part's token weights normalized
            over the part (verl's ``train_batch_size / ppo_mini_batch_size``; Search-R1's
            script: 2,560 rows in mini-batches of 256, 10). pi_old is the sampling policy for
            every part. ``trainer.max_steps`` counts optimizer steps: ``mu x mini_batches``
            per rollout batch.
        loss_aggregation: ``sequence``, ``token`` or ``constant``.
        scale_rewards: ``group``, ``batch`` or ``none``.
        max_completion_length: Normalizer of ``constant`` aggregation (defaults to the
            batch's padded completion width).
        drop_zero_variance_groups: Remove groups whose rewards are all equal.
        dynamic_sampling_rounds: Most rounds of extra prompts to refill the groups that
            ``drop_zero_variance_groups`` removed; 0 disables refilling.
        overlong: ``keep`` or ``mask`` (truncated outputs contribute no loss).
        importance_sampling_cap: Truncated importance-sampling correction of the sampler /
            trainer gap (numerics, the sampler's top-p / top-k truncation, stale weights; see
            the module docstring): token weight ``min(pi_old / pi_sampler, C)`` with this C;
            ``None`` (the default, also in colocated runs: verl's choice, not TRL's) turns it
            off.
        advantage: Registered advantage estimator: ``grpo`` (group-normalized) or ``rloo``
            (leave-one-out baseline), or a third party's.
        policy_loss: Registered policy loss: ``ppo_clip`` (token ratio) or ``gspo``
            (sequence-level ratio), or a third party's.
        policy_loss_args: Further keyword settings a third-party policy loss reads.
    """

    corrects_stale_samples = True  # importance_sampling_cap, set by accept_stale_samples

    def __init__(
        self,
        beta: float = 0.04,
        kl_estimator: str = "k3",
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        mu: int = 1,
        mini_batches: int = 1,
        loss_aggregation: str = "sequence",
        scale_rewards: str = "group",
        max_completion_length: int | None = None,
        drop_zero_variance_groups: bool = False,
        dynamic_sampling_rounds: int = 0,
        overlong: str = "keep",
        importance_sampling_cap: float | None = None,
        advantage: str = "grpo",
        policy_loss: str = "ppo_clip",
        policy_loss_args: dict | None = None,
    ) -> None:
        _check_settings(
            overlong=overlong,
            dynamic_sampling_rounds=dynamic_sampling_rounds,
            drop_zero_variance_groups=drop_zero_variance_groups,
            loss_aggregation=loss_aggregation,
            scale_rewards=scale_rewards,
            importance_sampling_cap=importance_sampling_cap,
            mu=mu,
            mini_batches=mini_batches,
            beta=beta,
            epsilon=epsilon,
        )
        self.beta = beta
        self.kl_estimator = kl_estimator
        self.kl = kl_estimator_fn(kl_estimator)
        self.advantage, self.advantage_fn = advantage, advantage_estimator(advantage)
        self.policy_loss, self.policy_loss_fn = policy_loss, policy_loss_fn(policy_loss)
        self.epsilon_low = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.mu, self.mini_batches = mu, mini_batches
        self.loss_aggregation = loss_aggregation
        self.scale_rewards = scale_rewards
        self.max_completion_length = max_completion_length
        self.drop_zero_variance_groups = drop_zero_variance_groups
        self.dynamic_sampling_rounds = dynamic_sampling_rounds
        self.overlong = overlong
        self.importance_sampling_cap = importance_sampling_cap
        self.loss_config = PolicyLossConfig(
            self.epsilon_low, self.epsilon_high, dict(policy_loss_args or {})
        )

    @property
    def steps_per_pass(self) -> int:  # type: ignore[override]
        return self.mini_batches

    def informative_groups(self, trajectories: list[Trajectory], rewards: RewardBreakdown) -> int:
        """Number of groups whose rewards are not all equal (what dynamic sampling counts)."""
        flat = _flat_groups(rewards.total.float(), torch.tensor([t.group for t in trajectories]))
        return len({t.group for t, f in zip(trajectories, flat.tolist(), strict=True) if not f})

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self.beta > 0

    @property
    def kl_coef(self) -> float:  # type: ignore[override]
        return self.beta

    @kl_coef.setter
    def kl_coef(self, value: float) -> None:
        self.beta = float(value)

    def accept_stale_samples(self, default_cap: float) -> bool:
        """Samples from older weights: without a cap in the recipe, ``default_cap`` turns the
        truncated importance-sampling correction on (True when it did)."""
        if self.importance_sampling_cap is not None:
            return False
        self.importance_sampling_cap = default_cap
        return True

    def advantages(
        self, rewards: torch.Tensor, groups: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The estimator's advantages ``[N]`` and a ``[N]`` mask of zero-variance groups."""
        return self.advantage_fn(rewards, groups, self.scale_rewards), _flat_groups(rewards, groups)

    def prepare(
        self,
        trajectories: list[Trajectory],
        rewards: RewardBreakdown,
        max_groups: int | None = None,
    ) -> Prepared:
        """Advantages and token weights; with ``max_groups``, the first that many kept groups."""
        total = rewards.total.float()
        if total.dim() != 1:
            raise ValueError(
                f"grpo needs one reward per trajectory; got shape {tuple(total.shape)}"
            )
        groups = torch.tensor([t.group for t in trajectories])
        advantages, flat = self.advantages(total, groups)
        keep = ~flat if self.drop_zero_variance_groups else torch.ones_like(flat)
        if max_groups is not None:  # dynamic sampling: exactly the batch's number of groups
            kept_groups = list(
                dict.fromkeys(g for g, k in zip(groups.tolist(), keep.tolist(), strict=True) if k)
            )
            allowed = set(kept_groups[:max_groups])
            keep = keep & torch.tensor([g in allowed for g in groups.tolist()])
        metrics = {
            "zero_variance_group_fraction": flat.float().mean(),
            "reward_std_in_group": _mean_group_std(total, groups),
        }
        kept = [t for t, k in zip(trajectories, keep.tolist(), strict=True) if k]
        if not kept:
            return Prepared(batch=None, metrics=metrics)
        batch = collate(kept)
        if self.overlong == "mask":
            truncated = torch.tensor([t.truncated for t in kept])
            batch.completion_mask[truncated] = 0.0
            metrics["overlong_masked_fraction"] = truncated.float().mean()
        mask = batch.completion_mask  # [N, C]
        n, width = mask.shape
        lengths = mask.sum(-1).clamp(min=1)  # [N]
        # the loss is a mean over the batch's tokens (token), rows (sequence) or rows at a fixed
        # length (constant); ``normalizer`` is that count, which the policy module sums over
        # ranks, so the mean is over the global batch (DAPO Section 3.3's token-level loss)
        if self.loss_aggregation == "sequence":
            normalizer = float(n)
            weights = mask / (lengths.unsqueeze(-1) * normalizer)
        elif self.loss_aggregation == "token":
            normalizer = float(mask.sum().clamp(min=1))
            weights = mask / normalizer
        else:
            normalizer = float(n * (self.max_completion_length or width))
            weights = mask / normalizer
        batch.advantages, batch.token_weights = advantages[keep], weights
        batch.normalizer = normalizer
        if self.mini_batches > 1:
            batch.mini_batches = self._split(groups[keep], weights)
        return Prepared(batch=batch, metrics=metrics)

    def _split(
        self, groups: torch.Tensor, weights: torch.Tensor
    ) -> list[tuple[torch.Tensor, float]]:
        """``(rows, loss scale)`` of each mini-batch: consecutive whole groups, as equal in count
        as they divide; the scale makes a part's weights those :meth:`prepare` would give it
        alone (sequence and constant aggregation: rows / part rows; token: tokens / part
        tokens), so each optimizer step sees a mean over its own part."""
        order = list(dict.fromkeys(groups.tolist()))
        parts = [
            chunk
            for chunk in torch.tensor(order).tensor_split(min(self.mini_batches, len(order)))
            if len(chunk)
        ]
        out = []
        for chunk in parts:
            rows = torch.nonzero(torch.isin(groups, chunk)).flatten()
            if self.loss_aggregation == "token":
                scale = float(weights.sum() / weights[rows].sum().clamp(min=1e-12))
            else:
                scale = len(groups) / len(rows)
            out.append((rows, scale))
        return out

    def loss(self, batch: TrainBatch) -> LossOutput:
        mask = batch.completion_mask  # [B, C]
        # Tokens outside the loss (padding, text the environment inserted) are replaced by a
        # constant before any arithmetic: their gradient is exactly zero (a selection, not a
        # multiplication by 0 that an inf in exp(.) would turn into NaN).
        keep = mask > 0
        logp = torch.where(keep, batch.logprobs, 0.0)  # [B, C], with grad
        old = torch.where(keep, batch.old_logprobs, 0.0)  # [B, C]
        out = self.policy_loss_fn(logp, old, batch.advantages, mask, self.loss_config)
        per_token, metrics = out.per_token, dict(out.metrics)  # [B, C]
        tokens = mask.sum().clamp(min=1)
        if self.importance_sampling_cap is not None:  # TIS: min(pi_old / pi_engine, C) per token
            engine = torch.where(keep, batch.sampling_logprobs, 0.0)  # [B, C]
            weight = torch.exp(old.detach() - engine)  # [B, C]
            metrics["is_weight_capped_fraction"] = (
                (weight > self.importance_sampling_cap).float() * mask
            ).sum() / tokens
            weight = weight.clamp(max=self.importance_sampling_cap)
            metrics["is_weight_mean"] = (weight * mask).sum() / tokens
            per_token = per_token * weight
        if self.beta > 0:
            kl = self.kl(logp, torch.where(keep, batch.ref_logprobs, 0.0))  # [B, C]
            per_token = per_token + self.beta * kl
            metrics["kl"] = ((kl * mask).sum() / tokens).detach()
        loss = (torch.where(keep, per_token, 0.0) * batch.token_weights).sum()
        return LossOutput(loss=loss, metrics=metrics)


def _flat_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``[N]`` True on the rows of groups whose rewards are all equal (or that have one sample)."""
    flat = torch.zeros_like(rewards, dtype=torch.bool)
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]  # [G]
        flat[idx] = r.numel() == 1 or bool(r.std() < 1e-6)
    return flat


def _mean_group_std(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    stds = [rewards[groups == g].std() for g in groups.unique() if int((groups == g).sum()) > 1]
    return torch.stack(stds).mean() if stds else rewards.new_tensor(0.0)
