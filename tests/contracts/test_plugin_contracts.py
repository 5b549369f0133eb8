"""The typed contracts between the policy module, plugins and callbacks.

- ``training_step`` hands callbacks a :class:`StepOutput` through Lightning's ``outputs``;
- ``state_dict`` / ``load_state_dict`` of the algorithm, the reward and the environment travel
  in the checkpoint under ``lit_rag``;
- optional capabilities are declared on the bases (defaults) and read without getattr.
"""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from lit_rag.api import Algorithm, Environment, Reward, StepOutput
from lit_rag.callbacks import KLMonitor
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.dpo import DPO
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from tests.helpers import EvenTokenReward, ScriptedPolicy

TINY = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))


class CountingReward(EvenTokenReward):
    """A stateful reward: counts the trajectories it scored."""

    def __init__(self) -> None:
        super().__init__()
        self.scored = 0

    def __call__(self, trajectories):
        self.scored += len(trajectories)
        return super().__call__(trajectories)

    def state_dict(self) -> dict:
        return {"scored": self.scored}

    def load_state_dict(self, state: dict) -> None:
        self.scored = int(state["scored"])


class CountingEnvironment(SingleTurnEnvironment):
    """A stateful environment: counts its rollouts."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts = 0

    def rollout(self, examples, engine, group_size, params):
        self.rollouts += 1
        return super().rollout(examples, engine, group_size, params)

    def state_dict(self) -> dict:
        return {"rollouts": self.rollouts}

    def load_state_dict(self, state: dict) -> None:
        self.rollouts = int(state["rollouts"])


def _module() -> PolicyModule:
    return PolicyModule(
        policy=TINY,
        environment=CountingEnvironment(),
        reward=CountingReward(),
        algorithm=GRPO(beta=0.04),
        group_size=2,
        sampling=SamplingParams(max_new_tokens=4),
        micro_batch_size=4,
        optimizer=OptimizerSettings(lr=1e-3),
    )


def test_callbacks_get_a_step_output_and_plugin_state_is_checkpointed(tmp_path):
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": ["x"]} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen: list[StepOutput | None] = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(StepOutput.of(outputs))

    module = _module()
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[Watch()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(
        module, datamodule=QADataModule(train=str(tmp_path / "train.jsonl"), val=None, batch_size=2)
    )
    # 2 steps x 2 prompts x G = 2 samples: each step's output carries its own 4 trajectories
    assert [len(s.trajectories) for s in seen] == [4, 4]
    assert all(s.batch_size == 2 and s.rewards.total.shape == (4,) for s in seen)
    assert {"reward/total", "train/loss", "train/kl"} <= set(seen[-1].metrics)
    assert float(seen[-1].metrics["reward/total"]) == pytest.approx(
        float(seen[-1].rewards.total.mean())
    )

    trainer.save_checkpoint(tmp_path / "last.ckpt")
    stored = torch.load(tmp_path / "last.ckpt", weights_only=True)["lit_rag"]
    assert stored["reward"] == {"scored": 8} and stored["environment"] == {"rollouts": 2}
    assert "algorithm" not in stored  # GRPO keeps no state: nothing stored
    fresh = _module()
    fresh.on_load_checkpoint({"lit_rag": stored})
    assert fresh.reward.scored == 8 and fresh.environment.rollouts == 2


def test_declared_capabilities_have_defaults():
    class Minimal(Algorithm):
        def prepare(self, trajectories, rewards, max_groups=None):
            raise NotImplementedError

        def loss(self, batch):
            raise NotImplementedError

    algorithm = Minimal()
    assert (algorithm.row_group, algorithm.dynamic_sampling_rounds, algorithm.wants_scorer) == (
        1,
        0,
        False,
    )
    assert algorithm.kl_coef is None and algorithm.state_dict() == {}
    with pytest.raises(AttributeError, match="no KL coefficient"):
        algorithm.kl_coef = 0.1
    assert not algorithm.corrects_stale_samples and not algorithm.accept_stale_samples(2.0)
    assert DPO().row_group == 2 and DPO().kl_coef is None
    grpo = GRPO(importance_sampling_cap=3.0)  # the recipe's cap stands
    assert grpo.corrects_stale_samples and not grpo.accept_stale_samples(2.0)
    assert grpo.importance_sampling_cap == 3.0
    grpo = GRPO()  # no cap: it takes the default one
    assert grpo.accept_stale_samples(2.0) and grpo.importance_sampling_cap == 2.0
    assert DPO(selection="reward_model").wants_scorer and not DPO().wants_scorer
    grpo = GRPO(beta=0.04)
    grpo.kl_coef = 0.5  # what a KL controller sets
    assert grpo.beta == 0.5 and grpo.kl_coef == 0.5
    reward = EvenTokenReward()
    assert reward.stages == () and not reward.time_weighted and reward.state_dict() == {}
    with pytest.raises(ValueError, match="no curriculum stages"):
        reward.set_stage("refinement")
    assert isinstance(reward, Reward)
    environment = SingleTurnEnvironment()
    assert isinstance(environment, Environment) and not environment.grows_forest
    engine = ScriptedPolicy(None, [])  # declares none of them
    assert (engine.seed, engine.model_path, engine.lora_sync) == (None, None, "merge")
    assert not engine.serves_pushed_weights
    with pytest.raises(ValueError, match="does not grow a forest"):
        environment.next_contexts([])


def test_kl_monitor_adapts_only_a_declared_kl_coefficient():
    # DPO's beta is an inverse temperature, not a KL weight: an adaptive KL target leaves it alone
    class Module:
        device = torch.device("cpu")

        def __init__(self, algorithm):
            self.algorithm, self.logged = algorithm, []

        def all_gather(self, tensor):
            return tensor

        def log_dict(self, values, **kwargs):
            self.logged.append(values)

    outputs = StepOutput([], None, {"train/kl": torch.tensor(0.2)}).as_outputs()  # type: ignore[arg-type]
    trainer = type("T", (), {"should_stop": False, "global_step": 0})()
    dpo = Module(DPO(beta=0.1))
    KLMonitor(warn_above=None, target=0.1).on_train_batch_end(trainer, dpo, outputs, None, 0)
    assert dpo.algorithm.beta == 0.1 and "kl/beta" not in dpo.logged[-1]
    grpo = Module(GRPO(beta=0.1))
    # target 0.1, KL 0.2: e = clip(0.2 / 0.1 - 1, -0.2, 0.2) = 0.2;
    # beta <- 0.1 * (1 + 0.1 * 0.2) = 0.102
    KLMonitor(warn_above=None, target=0.1, adapt_rate=0.1).on_train_batch_end(
        trainer, grpo, outputs, None, 0
    )
    assert grpo.algorithm.beta == pytest.approx(0.102) and grpo.logged[-1][
        "kl/beta"
    ] == pytest.approx(0.102)
