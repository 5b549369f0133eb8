"""Micro-batches are cut to their own longest prompt and completion before the forward pass;
the log-probs must equal those of the fully padded batch on every real token."""

import torch

from lit_rag.api import collate
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.rewards.qa import ExactMatchReward
from lit_rag.trainer.logprobs import completion_logprobs
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import Example, Trajectory


def test_trimmed_micro_batch_logprobs_match_the_padded_batch():
    torch.manual_seed(0)
    module = PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2)),
        environment=SingleTurnEnvironment(),
        reward=ExactMatchReward(),
        algorithm=GRPO(),
    )
    module.configure_model()
    model = module.model.eval()
    ex = Example(id="q", question="?", answers=["a"])
    shapes = [(5, 30), (12, 3), (7, 9), (3, 1)]  # (prompt, completion) lengths
    trajectories = [
        Trajectory(
            ex,
            0,
            torch.randint(3, 200, (p,)),
            torch.randint(3, 200, (c,)),
            torch.ones(c, dtype=torch.long),
            torch.zeros(c),
            "",
        )
        for p, c in shapes
    ]
    batch = collate(trajectories)
    width = batch.width
    with torch.no_grad():
        full = completion_logprobs(model, batch.input_ids, batch.attention_mask, width)
        for rows in (torch.tensor([1, 3]), torch.tensor([2]), torch.tensor([0, 1, 2, 3])):
            micro = batch.rows(rows)
            trimmed = module.update.logprobs(model, micro, width)
            mask = micro.completion_mask > 0
            assert trimmed.shape == (len(rows), width)
            assert torch.allclose(trimmed[mask], full[rows][mask], atol=1e-5)
            used = int(micro.attention_mask[:, -width:].sum(-1).max())
            assert torch.all(trimmed[:, used:] == 0)  # columns cut off: padded back with zeros
