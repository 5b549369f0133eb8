"""ReinforceLOO: the leave-one-out advantages, the loss and its gradient worked by hand, the
KL term, and its entry point."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from lit_rag_reinforce_loo import ReinforceLOO, leave_one_out

from lit_rag.api import Algorithm, Example, RewardBreakdown, TrainBatch, Trajectory

EXAMPLE = Example(id="q", question="?", answers=["Paris"])


def traj(group: int, completion: list[int]) -> Trajectory:
    ids = torch.tensor(completion)
    return Trajectory(
        EXAMPLE, group, torch.tensor([7, 8]), ids, torch.ones_like(ids), torch.zeros(len(ids)), ""
    )


def test_leave_one_out_by_hand() -> None:
    # [1, 2, 3, 6]: A_0 = 1 - 11/3 = -8/3, A_1 = 2 - 10/3 = -4/3, A_2 = 3 - 9/3 = 0, A_3 = 6 - 2
    adv = leave_one_out(torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.zeros(4, dtype=torch.long))
    assert adv.tolist() == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0])


def test_interleaved_groups_and_a_group_of_one() -> None:
    # group 0 (rows 0, 2): [1, 0] -> [1 - 0, 0 - 1] = [1, -1]
    # group 1 (row 1):     [5]    -> no other sample: 0
    # group 2 (rows 3, 4, 5): [3, 0, 0] -> [3 - 0, 0 - 1.5, 0 - 1.5]
    rewards = torch.tensor([1.0, 5.0, 0.0, 3.0, 0.0, 0.0])
    groups = torch.tensor([0, 1, 0, 2, 2, 2])
    assert leave_one_out(rewards, groups).tolist() == [1.0, 0.0, -1.0, 3.0, -1.5, -1.5]


def test_prepare_sets_advantages_and_sum_over_tokens_weights() -> None:
    trajectories = [traj(0, [1, 2, 3]), traj(0, [4])]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0]), components={})
    prepared = ReinforceLOO(beta=0.0).prepare(trajectories, rewards)
    batch = prepared.batch
    assert batch.advantages.tolist() == [1.0, -1.0]  # 1 - 0, 0 - 1
    # weights mask / N, N = 2: every real token 0.5, padding 0 (no length normalization)
    assert batch.token_weights.tolist() == [[0.5, 0.5, 0.5], [0.5, 0.0, 0.0]]
    assert prepared.metrics["advantage_abs_mean"].item() == 1.0


def test_empty_rollout_has_nothing_to_learn() -> None:
    empty = RewardBreakdown(total=torch.zeros(0), components={})
    assert ReinforceLOO().prepare([], empty).batch is None


def micro_batch(beta: float) -> tuple[ReinforceLOO, TrainBatch, torch.Tensor]:
    """Two rows: row 0 has 2 tokens, row 1 has 1 (its second column is padding, NaN)."""
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    batch = TrainBatch(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4, dtype=torch.long),
        completion_mask=mask,
        sampling_logprobs=torch.zeros(2, 2),
        advantages=torch.tensor([1.0, -1.0]),
        token_weights=mask / 2,
        ref_logprobs=torch.tensor([[-1.5, -2.0], [-0.5, 0.0]]),
        logprobs=logprobs,
    )
    return ReinforceLOO(beta=beta), batch, logprobs


def test_loss_and_gradient_by_hand() -> None:
    algorithm, batch, logprobs = micro_batch(beta=0.0)
    out = algorithm.loss(batch)
    # per token -A * logp: row 0 -1 * [-1, -2] = [1, 2]; row 1 -(-1) * -0.5 = -0.5
    # weighted by 1/2: (1 + 2) / 2 - 0.5 / 2 = 1.25
    assert out.loss.item() == pytest.approx(1.25)
    assert out.metrics == {}
    out.loss.backward()
    # d loss / d logp = -A / N on real tokens, exactly 0 on padding (even where it is NaN)
    assert logprobs.grad.tolist() == [[-0.5, -0.5], [0.5, 0.0]]


def test_kl_is_subtracted_from_each_rows_advantage() -> None:
    algorithm, batch, _ = micro_batch(beta=0.1)
    out = algorithm.loss(batch)
    # sequence KL (k1): row 0 (-1 + 1.5) + (-2 + 2) = 0.5; row 1 -0.5 + 0.5 = 0
    # advantages [1 - 0.1 * 0.5, -1 - 0] = [0.95, -1]; loss 0.95 * 3 / 2 - 0.25 = 1.175
    assert out.loss.item() == pytest.approx(1.175)
    assert out.metrics["kl"].item() == pytest.approx(0.5 / 3)  # per token: 3 real tokens
    assert out.metrics["kl_sequence"].item() == pytest.approx(0.25)  # (0.5 + 0) / 2


def test_declared_capabilities() -> None:
    algorithm = ReinforceLOO(beta=0.0)
    assert algorithm.mu == 1 and algorithm.steps_per_pass == 1
    assert not algorithm.needs_reference
    algorithm.kl_coef = 0.02  # what a KL controller does
    assert algorithm.beta == 0.02 and algorithm.needs_reference
    with pytest.raises(ValueError, match="reinforce_loo beta: got -1"):
        ReinforceLOO(beta=-1)


def test_registered_as_reinforce_loo() -> None:
    (ep,) = [
        ep for ep in metadata.entry_points(group="lit_rag.algorithms") if ep.name == "reinforce_loo"
    ]
    assert ep.dist.metadata["Name"] == "lit-rag-reinforce-loo"
    assert ep.load() is ReinforceLOO
    assert issubclass(ReinforceLOO, Algorithm)
