"""Resuming from a mid-run checkpoint reproduces the uninterrupted run's per-step metrics.

Checkpoints carry the model (or LoRA adapters), optimizer, scheduler, RNG states and the data
position; on CPU with the same seed, steps 3-4 of a run resumed from step 2 must equal steps
3-4 of a run that never stopped, sampled text included.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.data.datamodule import QADataModule
from lit_rag.modules.loading import LoraSettings, ModelConfig, TinyConfig
from lit_rag.modules.policy import PolicyModule
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.rewards.base import Reward
from lit_rag.rollout.base import SamplingParams
from lit_rag.types import RewardBreakdown


class CharacterReward(Reward):
    """Share of 'a' characters in the completion: varies between samples of a random model."""

    weights = {"a": 1.0}

    def __call__(self, trajectories):
        scores = torch.tensor([t.text.count("a") / max(1, len(t.text)) for t in trajectories])
        return RewardBreakdown(total=scores, components={"a": scores})


class Recorder(Callback):
    def __init__(self):
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        trajectories, _ = pl_module.last_rollout
        self.steps.append({
            "step": trainer.global_step,
            "ids": [ex.id for ex in batch],
            "texts": [t.text for t in trajectories],
            "loss": float(pl_module.last_metrics["train/loss"]),
            "reward": float(pl_module.last_metrics["reward/total"]),
        })


def build(lora: bool) -> tuple[PolicyModule, QADataModule]:
    policy = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2),
                         lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None)
    module = PolicyModule(
        policy=policy, environment=SingleTurnEnvironment(), reward=CharacterReward(),
        algorithm=GRPO(beta=0.04, mu=2), group_size=3, micro_batch_size=4, lr=1e-2,
        warmup_steps=2, lr_schedule="cosine",
        sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
    )
    data = QADataModule(num_train=40, num_val=2, batch_size=2, num_distractors=1, hops=[2])
    return module, data


def fit(tmp_path, max_steps: int, lora: bool, ckpt: str | None = None) -> Recorder:
    seed_everything(7)
    module, data = build(lora)
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[recorder, ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)],
    )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    return recorder


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_equals_uninterrupted(tmp_path, lora):
    # mu = 2: every batch makes two optimizer steps, so global steps 4 and 8 end batches 2 and 4
    full = fit(tmp_path / "a", max_steps=8, lora=lora)
    checkpoint = tmp_path / "a" / "ckpt" / "epoch=0-step=4.ckpt"
    assert checkpoint.exists()
    resumed = fit(tmp_path / "b", max_steps=8, lora=lora, ckpt=str(checkpoint))
    assert len(full.steps) == 4 and len(resumed.steps) == 2
    for a, b in zip(full.steps[2:], resumed.steps):
        assert a["ids"] == b["ids"]  # data position restored
        assert a["texts"] == b["texts"]  # RNG restored: same samples
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)  # weights + optimizer restored
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
    if lora:  # adapters only in the checkpoint
        state = torch.load(checkpoint, weights_only=False)["state_dict"]
        assert state and all("lora_" in key for key in state)
