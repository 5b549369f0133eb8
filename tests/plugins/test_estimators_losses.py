"""Advantage estimators (``rloo``, ``grpo``) and policy losses (``gspo``, ``ppo_clip``) worked by
hand, GRPO selecting them by name, and a third-party estimator registered in this process."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from kit import trajectory

from lit_rag import registry
from lit_rag.api import (
    PolicyLossConfig,
    Prepared,
    RewardBreakdown,
    TrainBatch,
    advantage_estimator,
    policy_loss,
    register_advantage,
)
from lit_rag.plugins.algorithms.estimators import grpo, rloo
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.algorithms.losses import gspo, ppo_clip
from lit_rag.registry import PluginError
from lit_rag.types import Example

EX = Example(id="q", question="?", answers=["a"])
EPS = PolicyLossConfig(epsilon_low=0.2, epsilon_high=0.2)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    """``actual`` equals the nested list ``expected`` to ``atol``."""
    torch.testing.assert_close(
        actual.detach(), torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


traj = partial(trajectory, example=EX, prompt=[5, 6], logprob=-1.0)


# ---------------------------------------------------------------- advantage estimators


def test_estimators_are_registered_by_name() -> None:
    assert advantage_estimator("rloo") is rloo
    assert advantage_estimator("grpo") is grpo
    assert policy_loss("gspo") is gspo
    assert policy_loss("ppo_clip") is ppo_clip


def test_rloo_one_group_by_hand() -> None:
    # rewards [1, 2, 3, 6], G = 4; baseline of i = mean of the other three:
    #   A_0 = 1 - (2 + 3 + 6) / 3 = 1 - 11/3 = -8/3
    #   A_1 = 2 - (1 + 3 + 6) / 3 = 2 - 10/3 = -4/3
    #   A_2 = 3 - (1 + 2 + 6) / 3 = 3 - 3    = 0
    #   A_3 = 6 - (1 + 2 + 3) / 3 = 6 - 2    = 4
    # (= G/(G-1) (r_i - mean) = 4/3 * [-2, -1, 0, 3])
    adv = rloo(torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0, 0, 0, 0]))
    assert adv.tolist() == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0], abs=1e-6)


def test_rloo_two_interleaved_groups_and_a_group_of_one() -> None:
    # group 0 (rows 0, 2): rewards [1, 3]     -> A = [1 - 3, 3 - 1] = [-2, 2]
    # group 1 (rows 1, 3, 4): rewards [0, 0, 3] -> A = [0 - 1.5, 0 - 1.5, 3 - 0] = [-1.5, -1.5, 3]
    # group 2 (row 5): one sample, no other to compare with -> 0
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.0, 3.0, 7.0])
    groups = torch.tensor([0, 1, 0, 1, 1, 2])
    adv = rloo(rewards, groups)
    assert adv.tolist() == pytest.approx([-2.0, -1.5, 2.0, -1.5, 3.0, 0.0])


def test_rloo_scale_rewards_group_and_batch() -> None:
    # one group [1, 2, 3, 6]: mean 3, sample std sqrt((4 + 1 + 0 + 9) / 3) = sqrt(14/3) = 2.16025
    #   group: A = [-8/3, -4/3, 0, 4] / (2.16025 + 1e-4)
    r = torch.tensor([1.0, 2.0, 3.0, 6.0])
    std = math.sqrt(14 / 3)
    adv = rloo(r, torch.zeros(4, dtype=torch.long), "group")
    assert adv.tolist() == pytest.approx(
        [v / (std + 1e-4) for v in (-8 / 3, -4 / 3, 0, 4)], abs=1e-6
    )
    # two groups [1, 3] and [0, 4]: unscaled A = [-2, 2] and [-4, 4]
    #   batch: mean of [1, 3, 0, 4] is 2, std sqrt((1 + 1 + 4 + 4) / 3) = sqrt(10/3) = 1.82574
    #          -> A / (1.82574 + 1e-4)
    #   group: group stds sqrt(2) and sqrt(8) -> [-2, 2] / 1.41431, [-4, 4] / 2.82853
    r = torch.tensor([1.0, 3.0, 0.0, 4.0])
    g = torch.tensor([0, 0, 1, 1])
    sb = math.sqrt(10 / 3) + 1e-4
    assert rloo(r, g, "batch").tolist() == pytest.approx([v / sb for v in (-2, 2, -4, 4)], abs=1e-6)
    s2, s8 = math.sqrt(2) + 1e-4, math.sqrt(8) + 1e-4
    assert rloo(r, g, "group").tolist() == pytest.approx(
        [-2 / s2, 2 / s2, -4 / s8, 4 / s8], abs=1e-6
    )
    assert rloo(r, g, "none").tolist() == [-2.0, 2.0, -4.0, 4.0]


def _old_grpo_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str
) -> torch.Tensor:
    """GRPO.advantages as it was before the estimators were split out (commit d965faa)."""
    advantages = torch.zeros_like(rewards)
    batch_std = rewards.std() if rewards.numel() > 1 else rewards.new_tensor(0.0)
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]
        std = r.std() if r.numel() > 1 else r.new_tensor(0.0)
        centered = r - r.mean()
        if scale_rewards == "group":
            centered = centered / (std + 1e-4)
        elif scale_rewards == "batch":
            centered = centered / (batch_std + 1e-4)
        advantages[idx] = centered
    return advantages


def test_grpo_estimator_by_hand() -> None:
    # group 0 [1, 3]: mean 2, sample std sqrt(2) = 1.41421 ->
    #   [-1, 1] / 1.41431 = [-0.70706, 0.70706]
    # group 1 [5, 5]: std 0 -> [0, 0] / 1e-4 = [0, 0]
    adv = grpo(torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1]))
    assert adv.tolist() == pytest.approx([-1 / 1.4143136, 1 / 1.4143136, 0, 0], abs=1e-5)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_grpo_estimator_reproduces_the_old_grpo_advantages(scale_rewards: str) -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(12, generator=gen)
    rewards[9:11] = 0.5  # a flat group
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4])  # and a group of one (4)
    new = grpo(rewards, groups, scale_rewards)
    assert torch.equal(new, _old_grpo_advantages(rewards, groups, scale_rewards))
    # through GRPO as well: the default estimator
    algo_adv, _ = GRPO(scale_rewards=scale_rewards).advantages(rewards, groups)
    assert torch.equal(algo_adv, new)


# ---------------------------------------------------------------- policy losses


def test_gspo_value_is_the_sequence_ratio_on_every_token() -> None:
    # row 0, 2 tokens + 1 padding: log-ratios [0.2, 0.0] -> s = exp(0.1) = 1.10517; A = 1
    #   eps 0.2: s in [0.8, 1.2] -> per token -min(1.10517, 1.10517) = -1.10517
    # row 1, 1 token: log-ratio -0.5 -> s = exp(-0.5) = 0.60653; A = -2
    #   -min(0.60653 * -2, 0.8 * -2) = -min(-1.21306, -1.6) = 1.6 (clipped)
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.5, 0.0, 0.0]])
    old = torch.tensor([[-1.2, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = gspo(logp, old, torch.tensor([1.0, -2.0]), mask, EPS)
    s0 = math.exp(0.1)
    close(out.per_token * mask, [[-s0, -s0, 0.0], [1.6, 0.0, 0.0]])
    # sequences: row 0 inside the range, row 1 outside -> 1 of 2
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.5)
    assert out.metrics["sequence_ratio_mean"].item() == pytest.approx(
        (s0 + math.exp(-0.5)) / 2, abs=1e-6
    )


def _paper_gspo_objective(logp, old, adv, mask, eps):
    """GSPO Eq. 5-7 written directly: one ratio per sequence, its full gradient (no stop-grad),
    mean over sequences."""
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))  # [B]
    return -torch.min(s * adv, s.clamp(1 - eps, 1 + eps) * adv).mean()


def test_gspo_gradient_matches_the_paper_and_is_zero_when_clipped() -> None:
    # row 0, 3 tokens + 1 padding: log-ratios [0.1, 0.2, 0.0] -> s = exp(0.1) = 1.10517, A = 2
    #   not clipped: d loss / d logp_t = -A * s * w_t with w_t = 1 / (|y| N) = 1 / (3 * 2)
    #   = -2 * 1.10517 / 6 = -0.36839 on each real token; 0 on the padding
    # row 1, 2 tokens: log-ratios [0.5, 0.5] -> s = exp(0.5) = 1.64872 > 1.2, A = 1
    #   -min(1.64872, 1.2) = -1.2, a constant: gradient 0
    logp = torch.tensor([[-1.0, -1.0, -1.0, 9.0], [-1.0, -1.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.2, -1.0, 0.0], [-1.5, -1.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, 1.0])
    weights = mask / (mask.sum(-1, keepdim=True) * 2)  # GRPO's "sequence" aggregation, N = 2
    out = gspo(logp, old, adv, mask, EPS)
    loss = (out.per_token * weights).sum()
    loss.backward()
    g0 = -2 * math.exp(0.1) / 6
    close(logp.grad, [[g0, g0, g0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # value: (3 * -2 * 1.10517 / 6) + (2 * -1.2 / 4) = -1.10517 - 0.6
    assert loss.item() == pytest.approx(-math.exp(0.1) - 0.6, abs=1e-6)
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.5)
    # the sequence-level objective of the paper has the same value and gradient
    paper_logp = logp.detach().clone().requires_grad_(True)
    paper = _paper_gspo_objective(paper_logp, old, adv, mask, 0.2)
    paper.backward()
    assert paper.item() == pytest.approx(loss.item(), abs=1e-6)
    assert torch.allclose(paper_logp.grad, logp.grad, atol=1e-6)


def test_gspo_clip_fraction_counts_sequences_not_tokens() -> None:
    # row 0: 3 tokens, log-ratio 0.5 each -> s = 1.64872, outside [0.8, 1.2]: clipped
    # row 1: 1 token, log-ratio 0     -> s = 1: inside
    # row 2: 1 token, log-ratio 0.1   -> s = 1.10517: inside
    # row 3: no token in the loss: not a sequence
    # sequences: 1 clipped of 3 = 1/3 (a token count would say 3 of 5)
    logp = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.zeros(4, 3)
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 0, 0], [0, 0, 0]])
    out = gspo(logp, old, torch.ones(4), mask, EPS)
    assert out.metrics["clip_fraction"].item() == pytest.approx(1 / 3)
    # mean ratio over the 3 sequences: (1.64872 + 1 + 1.10517) / 3
    assert out.metrics["sequence_ratio_mean"].item() == pytest.approx(
        (math.exp(0.5) + 1 + math.exp(0.1)) / 3, abs=1e-6
    )


def test_gspo_and_ppo_clip_differ_on_mixed_token_ratios() -> None:
    # one sequence, 2 tokens, token ratios 1.5 and 0.5, A = 1, eps 0.2, weights 1/2 each
    # ppo_clip, per token: -min(1.5, 1.2) = -1.2 (clipped: no gradient)
    #                      -min(0.5, 0.8) = -0.5 (gradient -A * 0.5 * 1/2 = -0.25)
    #   both ratios lie outside [0.8, 1.2]: clip_fraction 2/2 = 1
    # gspo: s = exp((ln 1.5 + ln 0.5) / 2) = sqrt(0.75) = 0.86603, inside [0.8, 1.2]
    #   every token -0.86603, gradient -A * 0.86603 * 1/2 = -0.43301 each; clip_fraction 0
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    weights = torch.full((1, 2), 0.5)
    results = {}
    for name, fn in (("ppo_clip", ppo_clip), ("gspo", gspo)):
        logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
        out = fn(logp, old, adv, mask, EPS)
        (out.per_token * weights).sum().backward()
        results[name] = (out.per_token, logp.grad, out.metrics["clip_fraction"].item())
    s = math.sqrt(0.75)
    close(results["ppo_clip"][0], [[-1.2, -0.5]])
    close(results["ppo_clip"][1], [[0.0, -0.25]])
    assert results["ppo_clip"][2] == 1.0
    close(results["gspo"][0], [[-s, -s]])
    close(results["gspo"][1], [[-s / 2, -s / 2]])
    assert results["gspo"][2] == 0.0


# ---------------------------------------------------------------- GRPO selecting them by name


def test_grpo_with_rloo_and_gspo_end_to_end() -> None:
    # one group of 3 with 1, 2 and 3 completion tokens (width C = 3), rewards [3, 0, 0]
    # rloo, no scaling: A = [3 - 0, 0 - 1.5, 0 - 1.5] = [3, -1.5, -1.5]
    # sequence aggregation: w_i = 1 / (|y_i| * 3)
    # log-ratios (logp - old) and s_i:
    #   row 0: [0]             -> s = 1                A = 3:    L_0 = -3
    #   row 1: [0.2, 0.0]      -> s = exp(0.1) = 1.10517, A = -1.5: inside [0.8, 1.2]
    #                             L_1 = -min(-1.65776, -1.65776) = 1.65776
    #   row 2: [-0.3] * 3      -> s = exp(-0.3) = 0.74082 < 0.8, A = -1.5:
    #                             L_2 = -min(0.74082 * -1.5, 0.8 * -1.5)
    #                                 = -min(-1.11123, -1.2) = 1.2
    # loss = (L_0 + L_1 + L_2) / 3 = (-3 + 1.65776 + 1.2) / 3 = -0.04741
    # gradient on each token: -A * s * w = row 0: -3 * 1 / 3 = -1;
    #   row 1: 1.5 * 1.10517 / 6 = 0.27629;
    #   row 2: clipped, 0; padding: 0 (even where its log-prob is -inf)
    algo = GRPO(advantage="rloo", policy_loss="gspo", scale_rewards="none", beta=0.0)
    prepared = algo.prepare(
        [traj(group=0, tokens=1), traj(group=0, tokens=2), traj(group=0, tokens=3)],
        RewardBreakdown(total=torch.tensor([3.0, 0.0, 0.0])),
    )
    assert isinstance(prepared, Prepared) and isinstance(prepared.batch, TrainBatch)
    batch = prepared.batch
    assert batch.advantages.tolist() == pytest.approx([3.0, -1.5, -1.5])
    inf = float("-inf")
    batch.logprobs = torch.tensor(
        [[-1.0, inf, inf], [-1.0, -1.0, inf], [-1.0, -1.0, -1.0]], requires_grad=True
    )
    batch.old_logprobs = torch.tensor([[-1.0, 0.0, 0.0], [-1.2, -1.0, 0.0], [-0.7, -0.7, -0.7]])
    out = algo.loss(batch)
    s1 = math.exp(0.1)
    assert out.loss.item() == pytest.approx((-3 + 1.5 * s1 + 1.2) / 3, abs=1e-6)
    assert out.metrics["clip_fraction"].item() == pytest.approx(1 / 3)
    out.loss.backward()
    g1 = 1.5 * s1 / 6
    close(batch.logprobs.grad, [[-1.0, 0, 0], [g1, g1, 0], [0, 0, 0]])


def test_unknown_estimator_or_loss_is_one_line_listing_installed() -> None:
    with pytest.raises(
        PluginError, match=r"unknown advantage 'rlo'; installed: .*grpo, .*rloo"
    ) as info:
        GRPO(advantage="rlo")
    assert "\n" not in str(info.value)
    with pytest.raises(
        PluginError, match=r"unknown policy_loss 'gpso'; installed: gspo, ppo_clip"
    ) as info:
        GRPO(policy_loss="gpso")
    assert "\n" not in str(info.value)


@pytest.fixture
def best_only():
    """A third-party estimator registered in this process: 1 for each group's best, else 0."""
    seen: list[str] = []

    @register_advantage("test_best_only")
    def best_only(
        rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "none"
    ) -> torch.Tensor:
        seen.append(scale_rewards)
        best = torch.stack([rewards[groups == g].max() for g in groups.tolist()])  # [N]
        return (rewards == best).float()

    yield seen
    registry.unregister("advantage", "test_best_only")


def test_third_party_estimator_registered_in_process(best_only) -> None:
    # group 0 rewards [0, 2, 1] -> best is row 1: A = [0, 1, 0]; group 1 [4, 4] -> both best: [1, 1]
    assert "test_best_only" in registry.available("advantage")
    assert registry.available("advantage")["test_best_only"].package == "<this process>"
    algo = GRPO(advantage="test_best_only", scale_rewards="batch")
    trajs = [
        traj(group=0, tokens=1),
        traj(group=0, tokens=1),
        traj(group=0, tokens=1),
        traj(group=1, tokens=2),
        traj(group=1, tokens=2),
    ]
    prepared = algo.prepare(trajs, RewardBreakdown(total=torch.tensor([0.0, 2.0, 1.0, 4.0, 4.0])))
    assert prepared.batch.advantages.tolist() == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert best_only == ["batch"]  # GRPO passes the recipe's scale_rewards on


def test_unregister_forgets_the_in_process_estimator(best_only) -> None:
    registry.unregister("advantage", "test_best_only")
    with pytest.raises(PluginError, match="unknown advantage 'test_best_only'"):
        GRPO(advantage="test_best_only")
