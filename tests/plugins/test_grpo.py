"""GRPO advantages and loss on small tensors worked by hand, and the aggregation modes."""

from functools import partial

import pytest
import torch
from helpers import train_batch
from kit import trajectory

from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.types import Example, RewardBreakdown

EX = Example(id="q", question="?", answers=["a"])


traj = partial(trajectory, example=EX, prompt=[5, 6], logprob=-1.0)


def test_group_advantages_by_hand():
    # group 0 rewards [1, 3]: mean 2, sample std sqrt(((1-2)^2 + (3-2)^2) / 1) = 1.4142
    #   A = [-1, 1] / (1.4142 + 1e-4) = [-0.70706, 0.70706]
    # group 1 rewards [5, 5]: std 0 -> A = [0, 0], flagged zero-variance
    algo = GRPO()
    adv, flat = algo.advantages(torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1]))
    assert adv.tolist() == pytest.approx([-1 / 1.4143136, 1 / 1.4143136, 0, 0], abs=1e-5)
    assert flat.tolist() == [False, False, True, True]


def test_scale_rewards_none_is_dr_grpo():
    adv, _ = GRPO(scale_rewards="none").advantages(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    assert adv.tolist() == [-1.0, 1.0]  # mean-centred only


def test_drop_zero_variance_groups():
    trajs = [
        traj(group=0, tokens=2),
        traj(group=0, tokens=2),
        traj(group=1, tokens=3),
        traj(group=1, tokens=3),
    ]
    rewards = RewardBreakdown(total=torch.tensor([0.0, 1.0, 2.0, 2.0]))
    kept = GRPO(drop_zero_variance_groups=True).prepare(trajs, rewards)
    assert kept.size == 2
    assert kept.metrics["zero_variance_group_fraction"].item() == 0.5
    all_flat = GRPO(drop_zero_variance_groups=True).prepare(
        trajs[2:], RewardBreakdown(total=torch.tensor([2.0, 2.0]))
    )
    assert all_flat.size == 0 and all_flat.batch is None


def test_token_weights_per_aggregation():
    # two samples with 2 and 4 completion tokens; padded width C = 4; N = 2
    trajs = [traj(group=0, tokens=2), traj(group=0, tokens=4)]
    rewards = RewardBreakdown(total=torch.tensor([0.0, 1.0]))
    seq = GRPO(loss_aggregation="sequence").prepare(trajs, rewards).batch.token_weights
    # sequence: 1 / (|o_i| * N) -> row 0: 1/(2*2) = 0.25 on 2 tokens; row 1: 1/(4*2) = 0.125 on 4
    assert seq.tolist() == [[0.25, 0.25, 0, 0], [0.125] * 4]
    tok = GRPO(loss_aggregation="token").prepare(trajs, rewards).batch.token_weights
    # token: 1 / sum |o_i| = 1/6 on every real token
    assert torch.allclose(tok, torch.tensor([[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4]))
    const = (
        GRPO(loss_aggregation="constant", max_completion_length=8)
        .prepare(trajs, rewards)
        .batch.token_weights
    )
    # constant (Dr. GRPO): 1 / (N * L_max) = 1 / (2 * 8) = 0.0625
    assert const.tolist() == [[0.0625, 0.0625, 0, 0], [0.0625] * 4]
    for w in (seq, tok):  # both normalize to a mean: weights sum to 1 over the batch
        assert w.sum().item() == pytest.approx(1.0)


def test_loss_by_hand_on_policy():
    # ratio = 1 (on-policy), A = [1, -1], one token each, sequence aggregation (weights 1/2):
    # per-token = -A * 1 -> [-1, 1]; loss = 0.5 * -1 + 0.5 * 1 = 0; with beta: + beta * k2
    algo = GRPO(beta=0.1, kl_estimator="k2")
    logp = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    batch = train_batch(
        torch.ones(2, 1),
        logprobs=logp,
        old_logprobs=logp.detach(),
        advantages=torch.tensor([1.0, -1.0]),
        token_weights=torch.full((2, 1), 0.5),
        ref_logprobs=torch.tensor([[-1.5], [-2.0]]),
    )
    out = algo.loss(batch)
    # k2 row 0 = 0.5 * (-1.5 + 1)^2 = 0.125; row 1 = 0 -> loss = 0 + 0.1 * 0.5 * 0.125 = 0.00625
    assert out.loss.item() == pytest.approx(0.00625)
    assert out.metrics["kl"].item() == pytest.approx(0.0625)  # mean of [0.125, 0]
    out.loss.backward()
    # d/dlogp of -A*exp(logp - old) * w at ratio 1 = -A * w -> [-0.5, 0.5];
    # plus beta * w * d k2/d logp = 0.1 * 0.5 * (logp - ref) = 0.05 * 0.5 = 0.025 on row 0
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5 + 0.025, 0.5])


def test_clipping_asymmetric():
    # ratio = e^0.5 = 1.6487 with A = +1: clipped at 1 + eps_high
    algo = GRPO(beta=0.0, epsilon=0.2, epsilon_high=0.28)
    batch = train_batch(
        torch.ones(1, 1),
        logprobs=torch.tensor([[0.0]], requires_grad=True),
        old_logprobs=torch.tensor([[-0.5]]),
        advantages=torch.tensor([1.0]),
        token_weights=torch.ones(1, 1),
    )
    out = algo.loss(batch)
    assert out.loss.item() == pytest.approx(-1.28)  # -min(1.6487, 1.28) * 1
    assert out.metrics["clip_fraction"].item() == 1.0
    # ratio = e^-0.5 = 0.6065 with A = -1: -min(-0.6065, -0.8) = 0.8 (lower clip binds)
    batch.advantages = torch.tensor([-1.0])
    batch.logprobs = torch.tensor([[-0.5]], requires_grad=True)
    batch.old_logprobs = torch.tensor([[0.0]])
    assert algo.loss(batch).loss.item() == pytest.approx(0.8)


def test_truncated_importance_sampling_by_hand():
    # on-policy in the trainer (old = new), but the engine sampled with other log-probs:
    #   token 0: old -1.0, engine -1.5 -> pi_old / pi_engine = e^0.5  = 1.6487 (under C = 2)
    #   token 1: old -1.0, engine -2.0 -> e^1.0 = 2.7183, capped at C = 2
    #   token 2: old -2.0, engine -1.0 -> e^-1  = 0.3679
    # A = 1 for the row, token weights 1/3 each: loss = -(1.6487 + 2 + 0.3679) / 3 = -1.3389
    algo = GRPO(beta=0.1, kl_estimator="k2", importance_sampling_cap=2.0)
    logp = torch.tensor([[-1.0, -1.0, -2.0]], requires_grad=True)
    batch = train_batch(
        torch.ones(1, 3),
        logprobs=logp,
        old_logprobs=logp.detach(),
        sampling_logprobs=torch.tensor([[-1.5, -2.0, -1.0]]),
        advantages=torch.tensor([1.0]),
        token_weights=torch.full((1, 3), 1 / 3),
        ref_logprobs=logp.detach(),  # KL 0: not weighted
    )
    out = algo.loss(batch)
    assert out.loss.item() == pytest.approx(-(1.6487213 + 2.0 + 0.3678794) / 3, abs=1e-5)
    assert out.metrics["is_weight_capped_fraction"].item() == pytest.approx(1 / 3)
    assert out.metrics["is_weight_mean"].item() == pytest.approx(
        (1.6487213 + 2.0 + 0.3678794) / 3, abs=1e-5
    )
    # off (the default): the same batch is plain GRPO, -1 per token -> loss -1
    assert GRPO(beta=0.1, kl_estimator="k2").loss(batch).loss.item() == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="importance_sampling_cap must be >= 1"):
        GRPO(importance_sampling_cap=0.5)


def test_bad_options_name_key_and_allowed():
    with pytest.raises(
        ValueError, match="loss_aggregation 'mean'.*allowed: sequence, token, constant"
    ):
        GRPO(loss_aggregation="mean")
    with pytest.raises(ValueError, match="scale_rewards"):
        GRPO(scale_rewards="rank")
    assert GRPO(beta=0.0).needs_reference is False


def test_token_aggregation_loss_by_hand_and_across_micro_batches():
    # ARENA's release (TRL 0.16 GRPOTrainer) averages over tokens: sum(loss * mask) / sum(mask).
    # One group, rewards [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.70711,
    #   A = [0.5, -0.5] / (0.70711 + 1e-4) = [a, -a], a = 0.70701.
    # Sample 0 has 1 token, sample 1 has 3; on-policy (ratio 1), beta 0: per-token loss = -A,
    #   row 0: [-a], row 1: [a, a, a].
    #   sequence: 1/2 * (-a) + 1/2 * (3a / 3) = 0
    #   token:    (-a + a + a + a) / 4 = a / 2 = 0.35350
    trajs = [traj(group=0, tokens=1), traj(group=0, tokens=3)]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0]))
    a = 0.5 / (0.5**0.5 + 1e-4)
    losses = {}
    for mode in ("sequence", "token"):
        algo = GRPO(beta=0.0, loss_aggregation=mode)
        full = algo.prepare(trajs, rewards).batch
        full.logprobs = full.old_logprobs = torch.full((2, 3), -1.0)
        losses[mode] = algo.loss(full).loss.item()
        # two micro-batches of one row each add up to the whole batch (weights are global)
        parts = [algo.loss(full.rows(torch.tensor([i]))).loss.item() for i in (0, 1)]
        assert sum(parts) == pytest.approx(losses[mode], abs=1e-6)
    assert losses["sequence"] == pytest.approx(0.0, abs=1e-6)
    assert losses["token"] == pytest.approx(a / 2, abs=1e-5)


def test_mini_batches_split_whole_groups_and_renormalize():
    """Three groups of 2 rows (completion lengths 1, 3 | 2, 2 | 4, 4), mini_batches 2: the groups
    split as torch's tensor_split does, [0, 1] and [2] (a group is never cut).
    sequence: every row weighs 1/N = 1/6 in the batch; part 1 holds 4 rows -> scale 6/4 = 1.5,
    part 2 holds 2 rows -> scale 6/2 = 3, so each part's row weights are 1/4 and 1/2: a mean
    over the part, as prepare() would give it alone.
    token: 16 tokens in the batch; part 1 has 1+3+2+2 = 8 -> scale 16/8 = 2; part 2 has 8 -> 2."""
    trajs = [
        traj(group=0, tokens=1),
        traj(group=0, tokens=3),
        traj(group=1, tokens=2),
        traj(group=1, tokens=2),
        traj(group=2, tokens=4),
        traj(group=2, tokens=4),
    ]
    rewards = RewardBreakdown(total=torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    seq = GRPO(mini_batches=2).prepare(trajs, rewards).batch
    assert [(rows.tolist(), scale) for rows, scale in seq.mini_batches] == [
        ([0, 1, 2, 3], 1.5),
        ([4, 5], 3.0),
    ]
    tok = GRPO(mini_batches=2, loss_aggregation="token").prepare(trajs, rewards).batch
    assert [(rows.tolist(), scale) for rows, scale in tok.mini_batches] == [
        ([0, 1, 2, 3], 2.0),
        ([4, 5], 2.0),
    ]
    for batch in (seq, tok):  # each part's scaled weights sum to 1, as a whole batch's do
        for rows, scale in batch.mini_batches:
            assert float(batch.token_weights[rows].sum()) * scale == pytest.approx(1.0)
    # more parts than groups: one per group; one part: no split (the whole batch, scale 1)
    assert len(GRPO(mini_batches=5).prepare(trajs, rewards).batch.mini_batches) == 3
    assert GRPO().prepare(trajs, rewards).batch.mini_batches is None
    with pytest.raises(ValueError, match="mini_batches must be >= 1"):
        GRPO(mini_batches=0)
