"""Resuming from a mid-run checkpoint reproduces the uninterrupted run's per-step metrics.

Checkpoints carry the model (or LoRA adapters), optimizer, scheduler and its plan (kind, warm-up,
length), RNG states, the data position and the KL monitor's adapted beta; on CPU with the same
seed, steps 3-4 of a run resumed from step 2 must equal steps 3-4 of a run that never stopped,
sampled text, learning rate and beta included.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from kit import CharacterReward, Recorder
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.callbacks import KLMonitor
from lit_rag.data.datamodule import QADataModule
from lit_rag.errors import InputError
from lit_rag.models.loading import LoraSettings, ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.trainer.schedule import lr_factor


def build(
    lora: bool,
    mu: int = 2,
    lr_schedule: str = "cosine",
    warmup_steps: int = 2,
    mini_batches: int = 1,
    warmup_ratio: float = 0.0,
) -> tuple[PolicyModule, QADataModule]:
    policy = ModelConfig(
        tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2),
        lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None,
    )
    module = PolicyModule(
        policy=policy,
        environment=SingleTurnEnvironment(),
        reward=CharacterReward(),
        algorithm=GRPO(beta=0.04, mu=mu, mini_batches=mini_batches),
        group_size=3,
        micro_batch_size=4,
        optimizer=OptimizerSettings(
            lr=1e-2,
            warmup_steps=warmup_steps,
            lr_schedule=lr_schedule,
            warmup_ratio=warmup_ratio,
        ),
        sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
    )
    data = QADataModule(num_train=40, num_val=2, batch_size=2, num_distractors=1, hops=[2])
    return module, data


def fit(
    tmp_path,
    max_steps: int,
    lora: bool = False,
    ckpt: str | None = None,
    callbacks: tuple = (),
    **settings,
) -> Recorder:
    seed_everything(7)
    module, data = build(lora, **settings)
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[
            recorder,
            *callbacks,
            ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1),
        ],
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
    for a, b in zip(full.steps[2:], resumed.steps, strict=True):
        assert a["ids"] == b["ids"]  # data position restored
        assert a["texts"] == b["texts"]  # RNG restored: same samples
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)  # weights + optimizer restored
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["lr"] == b["lr"]  # scheduler and its plan restored
    if lora:  # adapters only in the checkpoint
        state = torch.load(checkpoint, weights_only=False)["state_dict"]
        assert state and all("lora_" in key for key in state)


def test_adapted_kl_beta_survives_resume(tmp_path):
    """KLMonitor(target=...) adapts GRPO's beta every step; a run resumed from step 4 continues
    from the adapted beta (not the recipe's 0.04) and so reproduces the losses."""

    def monitor():  # target far below the tiny model's KL: beta grows 2% a step (e = +0.2)
        return KLMonitor(warn_above=None, target=1e-6)

    full = fit(tmp_path / "a", max_steps=8, callbacks=(monitor(),))
    checkpoint = tmp_path / "a" / "ckpt" / "epoch=0-step=4.ckpt"
    stored = torch.load(checkpoint, weights_only=True)["callbacks"]["KLMonitor"]
    assert stored["beta"] == pytest.approx(full.steps[2]["beta"]) and len(stored["history"]) == 2
    resumed = fit(tmp_path / "b", max_steps=8, ckpt=str(checkpoint), callbacks=(monitor(),))
    assert full.steps[2]["beta"] > 0.04  # adapted: 0.04 x 1.02^2 = 0.041616 before batch 3
    assert full.steps[2]["beta"] == pytest.approx(0.04 * 1.02**2)
    for a, b in zip(full.steps[2:], resumed.steps, strict=True):
        assert a["beta"] == b["beta"]
        assert a["texts"] == b["texts"] and a["lr"] == b["lr"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_schedule_resume_is_exact_and_keeps_its_plan(tmp_path, kind):
    """mu = 2, warm-up 2, max_steps 6: optimizer steps 0-5, two per batch, factors (lr_factor)

        cosine: 0.5, 1 | 1, 0.5 (1 + cos(pi/4)) = 0.8536 | 0.5, 0.5 (1 + cos(3 pi/4)) = 0.1464
        linear: 0.5, 1 | 1, 0.75                         | 0.5, 0.25

    (p = (step - 2) / (6 - 2)); train/lr is the batch mean x lr 1e-2. Resumed from step 4 with
    max_steps 6 or 8, batch 3 has the uninterrupted run's rates; with 8, batch 4 (steps 6-7)
    is past the stored plan: rate 0, and a warning says the schedule keeps 6 steps.
    """
    full = fit(tmp_path / "a", max_steps=6, lr_schedule=kind)
    factors = {
        "cosine": [
            0.5,
            1.0,
            1.0,
            0.5 * (1 + math.cos(math.pi / 4)),
            0.5,
            0.5 * (1 + math.cos(3 * math.pi / 4)),
        ],
        "linear": [0.5, 1.0, 1.0, 0.75, 0.5, 0.25],
    }[kind]
    means = [1e-2 * (factors[i] + factors[i + 1]) / 2 for i in (0, 2, 4)]
    assert [s["lr"] for s in full.steps] == pytest.approx(means, rel=1e-6)
    checkpoint = str(tmp_path / "a" / "ckpt" / "epoch=0-step=4.ckpt")
    assert torch.load(checkpoint, weights_only=True)["lit_rag"]["schedule"] == {
        "kind": kind,
        "warmup": 2,
        "total": 6,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same = fit(tmp_path / "b", max_steps=6, ckpt=checkpoint, lr_schedule=kind)
    assert not [
        w for w in caught if "learning-rate schedule" in str(w.message)
    ]  # same plan: no warning
    assert [s["lr"] for s in same.steps] == [full.steps[2]["lr"]]
    with pytest.warns(
        UserWarning,
        match=f"resuming a {kind} learning-rate schedule planned for 6 optimizer steps "
        r"\(warm-up 2\); this run's settings plan .*8 steps.* keeps the checkpoint's plan, "
        "so the rate is 0 after step 6",
    ):
        longer = fit(tmp_path / "c", max_steps=8, ckpt=checkpoint, lr_schedule=kind)
    assert [s["lr"] for s in longer.steps] == [full.steps[2]["lr"], 0.0]


def test_train_lr_is_the_rate_the_step_used(tmp_path):
    """Warm-up 2, constant, mu 1, lr 1e-2: optimizer step 1 uses factor (0 + 1) / 2 = 1/2, step 2
    uses (1 + 1) / 2 = 1 -> train/lr 0.5e-2 then 1e-2 (read after scheduler.step() it was 1e-2
    twice: the next step's rate). With mu 2 a batch makes steps 0 and 1: mean (1/2 + 1) / 2 =
    0.75."""
    one = fit(tmp_path / "a", max_steps=2, mu=1, lr_schedule="constant", warmup_steps=2)
    assert [s["lr"] for s in one.steps] == pytest.approx([0.5e-2, 1e-2])
    two = fit(tmp_path / "b", max_steps=4, mu=2, lr_schedule="constant", warmup_steps=2)
    assert [s["lr"] for s in two.steps] == pytest.approx([0.75e-2, 1e-2])


def test_stored_plan_holds_whichever_restores_first():
    """Lightning restores the module before configure_optimizers on most strategies and after
    it under FSDP and DeepSpeed; the factor LambdaLR calls must read the stored plan either way."""

    def module(max_steps: int) -> PolicyModule:
        m, _ = build(lora=False, lr_schedule="linear", warmup_steps=1)
        m.configure_model()
        m._trainer = SimpleNamespace(estimated_stepping_batches=max_steps, max_steps=max_steps)
        return m

    stored = {"lit_rag": {"schedule": {"kind": "linear", "warmup": 1, "total": 5}}}
    before, after = module(9), module(9)
    before.on_load_checkpoint(stored)
    with pytest.warns(UserWarning, match="planned for 5 optimizer steps"):
        first = before.configure_optimizers()["lr_scheduler"]["scheduler"]
    second = after.configure_optimizers()["lr_scheduler"]["scheduler"]
    with pytest.warns(UserWarning, match="planned for 5 optimizer steps"):
        after.on_load_checkpoint(stored)
    # linear, warm-up 1, total 5: step 0 -> 1/1; step s >= 1 -> 1 - (s - 1) / 4; step 3 -> 0.5
    for scheduler in (first, second):
        assert [scheduler.lr_lambdas[0](s) for s in range(6)] == [1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_factor(3, "linear", 1, 9) == 0.75  # this run's own plan would differ


def test_schedule_length_counts_optimizer_steps():
    """Lightning's max_steps counts optimizer steps here (manual optimization: global_step is one
    per optimizer.step()); estimated_stepping_batches = min(batches x epochs, max_steps)."""

    def total(batches: float, max_steps: int, kind: str = "cosine") -> int:
        m, _ = build(lora=False, mu=2, lr_schedule=kind)
        m.model = torch.nn.Linear(1, 1)
        m._trainer = SimpleNamespace(estimated_stepping_batches=batches, max_steps=max_steps)
        return m.optim.plan(m._trainer, m.algorithm.mu * m.algorithm.steps_per_pass)["total"]

    assert total(8, 8) == 8  # bounded by max_steps 8: 8 optimizer steps (it was 8 x mu = 16)
    assert total(5, -1) == 10  # 5 batches, no max_steps: 5 x mu 2
    assert total(5, 7) == 7  # 5 batches x 2 = 10 optimizer steps, but max_steps stops at 7
    assert total(float("inf"), -1, "constant") == 1  # endless: a constant rate needs no length
    with pytest.raises(InputError, match="model lr_schedule 'cosine' needs a run of known length"):
        total(float("inf"), -1)


def test_mini_batches_step_twice_from_the_sampling_policy_and_warmup_ratio(tmp_path, monkeypatch):
    """GRPO mini_batches 2, mu 1: each batch (2 groups of 3) makes two optimizer steps, one per
    group. max_steps 4 = 2 batches; warmup_ratio 0.5 of the 4 planned steps = int(2.0) = 2
    steps, then constant: factors 1/2, 1 | 1, 1 -> train/lr 0.75e-2, 1e-2 (lr 1e-2).
    pi_old is the policy that sampled for both parts: the second part's log-probs (after one
    update) differ from its pi_old; the first part's equal it."""
    gaps: list[float] = []
    original = GRPO.loss

    def recording(self, batch):
        gaps.append(float((batch.logprobs.detach() - batch.old_logprobs).abs().max()))
        return original(self, batch)

    monkeypatch.setattr(GRPO, "loss", recording)
    run = fit(
        tmp_path,
        max_steps=4,
        mu=1,
        mini_batches=2,
        lr_schedule="constant",
        warmup_steps=0,
        warmup_ratio=0.5,
    )
    assert [s["optimizer_steps"] for s in run.steps] == [2.0, 2.0]
    assert [s["lr"] for s in run.steps] == pytest.approx([0.75e-2, 1e-2])
    assert (
        len(gaps) == 4
    )  # 2 batches x 2 parts, one micro-batch each (3 rows <= micro_batch_size 4)
    assert gaps[0] < 1e-5 and gaps[2] < 1e-5  # first part: pi_old is the current policy
    assert gaps[1] > 1e-4 and gaps[3] > 1e-4  # second part: updated policy against pi_old
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        build(lora=False, warmup_steps=2, warmup_ratio=0.1)


def test_warmup_ratio_counts_the_planned_optimizer_steps():
    """int(ratio x length), as verl rounds it: 0.285 of 2,000 optimizer steps = 570 (Search-R1's
    script on 200 batches of 10 mini-batches: 57 batches); an endless run has no length."""
    from lit_rag.trainer.schedule import plan_schedule

    def trainer(batches, max_steps):
        return SimpleNamespace(estimated_stepping_batches=batches, max_steps=max_steps)

    assert plan_schedule(trainer(2000, 2000), "constant", 0, 10, 0.285) == {
        "kind": "constant",
        "warmup": 570,
        "total": 2000,
    }
    assert plan_schedule(trainer(7, -1), "cosine", 0, 1, 0.5)["warmup"] == 3  # int(3.5)
    with pytest.raises(InputError, match="model warmup_ratio 0.1 needs a run of known length"):
        plan_schedule(trainer(float("inf"), -1), "constant", 0, 1, 0.1)
