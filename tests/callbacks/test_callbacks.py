"""KLMonitor decisions and RolloutSampleLogger output, with stand-in trainer and module."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lit_rag.callbacks import KLMonitor, RolloutSampleLogger
from lit_rag.contracts.step import StepOutput
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.types import Example, RewardBreakdown, Trajectory


class FakeModule:
    """Single process: all_gather returns the tensor itself, like Lightning on one device."""

    device = torch.device("cpu")

    def __init__(self, beta: float = 0.1):
        self.algorithm = GRPO(beta=beta)
        self.logged: list[dict] = []

    def all_gather(self, tensor):
        return tensor

    def log_dict(self, values, **kwargs):
        self.logged.append(values)


def step(monitor, trainer, module, kl):
    metrics = {} if kl is None else {"train/kl": torch.tensor(kl)}
    outputs = StepOutput([], RewardBreakdown(total=torch.zeros(0)), metrics).as_outputs()
    monitor.on_train_batch_end(trainer, module, outputs, None, 0)


def test_stop_after_patience_and_reset():
    trainer, module = SimpleNamespace(should_stop=False, global_step=0), FakeModule()
    monitor = KLMonitor(warn_above=None, stop_above=0.5, patience=2)
    step(monitor, trainer, module, 0.6)
    assert not trainer.should_stop  # 1 step above: patience 2 not reached
    step(monitor, trainer, module, 0.1)  # back below: the count resets
    step(monitor, trainer, module, 0.7)
    assert not trainer.should_stop
    step(monitor, trainer, module, 0.8)
    assert trainer.should_stop
    assert module.logged[-1]["kl/global_max"] == pytest.approx(0.8)


def test_warns_above_threshold():
    trainer, module = SimpleNamespace(should_stop=False, global_step=3), FakeModule()
    with pytest.warns(UserWarning, match="KL to the reference is 2.0000"):
        step(KLMonitor(warn_above=1.0), trainer, module, 2.0)


def test_adaptive_beta_by_hand():
    # target 0.1, KL 0.2: e = clip(0.2/0.1 - 1, -0.2, 0.2) = 0.2;
    # beta <- 0.1 * (1 + 0.1 * 0.2) = 0.102
    trainer, module = SimpleNamespace(should_stop=False, global_step=0), FakeModule(beta=0.1)
    monitor = KLMonitor(warn_above=None, target=0.1, adapt_rate=0.1)
    step(monitor, trainer, module, 0.2)
    assert module.algorithm.beta == pytest.approx(0.102)
    # KL 0.05: e = 0.05/0.1 - 1 = -0.5 -> clipped to -0.2; beta <- 0.102 * (1 - 0.02) = 0.09996
    step(monitor, trainer, module, 0.05)
    assert module.algorithm.beta == pytest.approx(0.09996)
    assert module.logged[-1]["kl/beta"] == pytest.approx(0.09996)


def test_no_kl_this_step_is_ignored():
    trainer, module = SimpleNamespace(should_stop=False, global_step=0), FakeModule()
    monitor = KLMonitor(stop_above=0.0)
    step(monitor, trainer, module, None)
    assert not trainer.should_stop and module.logged == []


def test_global_mean_and_max_over_ranks():
    class TwoRanks(FakeModule):
        def all_gather(self, tensor):  # rank 0 saw 0.2, rank 1 saw 0.6
            return torch.stack([tensor, torch.tensor([0.6, 1.0])])

    module = TwoRanks()
    monitor = KLMonitor(warn_above=None)
    local = StepOutput([], RewardBreakdown(total=torch.zeros(0)), {"train/kl": torch.tensor(0.2)})
    assert monitor.global_kl(module, local) == pytest.approx((0.4, 0.6))  # mean (0.2+0.6)/2


def test_sample_logger_writes_jsonl(tmp_path):
    ex = Example(id="q1", question="?", answers=["Kessa"])
    trajs = [
        Trajectory(
            ex,
            0,
            torch.tensor([1]),
            torch.tensor([2, 3]),
            torch.ones(2),
            torch.zeros(2),
            text=f"<answer>{a}</answer>",
            prompt_text="P",
        )
        for a in ("Kessa", "Rome")
    ]
    rewards = RewardBreakdown(
        total=torch.tensor([1.0, 0.0]), components={"accuracy": torch.tensor([1.0, 0.0])}
    )
    module = SimpleNamespace()
    outputs = StepOutput(trajs, rewards).as_outputs()
    trainer = SimpleNamespace(
        is_global_zero=True, global_step=5, log_dir=str(tmp_path), default_root_dir=str(tmp_path)
    )
    logger = RolloutSampleLogger(every_n_steps=2, max_per_step=1, include_prompt=True)
    for _ in range(3):  # written on calls 1 and 3
        logger.on_train_batch_end(trainer, module, outputs, None, 0)
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert rows[0] == {
        "step": 5,
        "example_id": "q1",
        "group": 0,
        "completion": "<answer>Kessa</answer>",
        "answers": ["Kessa"],
        "truncated": False,
        "reward": 1.0,
        "components": {"accuracy": 1.0},
        "prompt": "P",
    }


def test_adapted_beta_round_trips_through_a_checkpoint(tmp_path):
    # target 0.1, KL 0.2 twice: e = +0.2 each step; beta 0.1 -> 0.102 -> 0.102 x 1.02 = 0.10404
    trainer, module = SimpleNamespace(should_stop=False, global_step=0), FakeModule(beta=0.1)
    monitor = KLMonitor(warn_above=None, stop_above=0.5, patience=3, target=0.1)
    step(monitor, trainer, module, 0.2)
    step(monitor, trainer, module, 0.6)  # also above stop_above: above = 1
    # e = clip(0.6 / 0.1 - 1) = +0.2 again: 0.102 x 1.02 = 0.10404
    torch.save(monitor.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # plain numbers only
    assert state["beta"] == pytest.approx(0.10404) and state["above"] == 1
    resumed, fresh = (
        KLMonitor(warn_above=None, stop_above=0.5, patience=3, target=0.1),
        FakeModule(beta=0.1),
    )
    resumed.load_state_dict(state)
    assert fresh.algorithm.beta == 0.1  # the module is not at hand in load_state_dict...
    resumed.on_train_start(trainer, fresh)  # ...Lightning has restored everything by train start
    assert fresh.algorithm.beta == pytest.approx(0.10404)
    assert resumed.above == 1 and resumed.history == monitor.history
    # a resumed run that no longer adapts (target None) keeps the recipe's beta
    fixed, other = KLMonitor(warn_above=None), FakeModule(beta=0.1)
    fixed.load_state_dict(state)
    fixed.on_train_start(trainer, other)
    assert other.algorithm.beta == 0.1
