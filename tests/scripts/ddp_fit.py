"""A two-process fit on CPU (gloo) of a tiny random policy; run by ``test_ddp.py``.

    python tests/scripts/ddp_fit.py OUT_DIR [ddp | fsdp | fsdp-lora]

Lightning starts the second rank by running this script again. ``fsdp`` uses Lightning's
``FSDPStrategy`` through :class:`~lit_rag.models.cpu_strategies.CPUFSDP` (Lightning accepts FSDP on
CUDA only; everything else is the real strategy). Each rank writes
``OUT_DIR/rank<r>.json``: per step, the examples it rolled out (with their group ids), its own
reward and KL means, the values logged for the step (reduced across ranks by ``sync_dist``), the
KL monitor's global values and whether it decided to stop.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from cpu_strategies import CPUFSDP  # lit-rag's CPU subclass of Lightning's FSDPStrategy
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.api import Reward
from lit_rag.callbacks import KLMonitor
from lit_rag.contracts.step import StepOutput
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import LoraSettings, ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import RewardBreakdown

warnings.filterwarnings("ignore")


class EvenTokens(Reward):
    """Even token ids per completion: random samples differ, so groups have variance."""

    def __call__(self, trajectories):
        total = torch.tensor([float((t.completion_ids % 2 == 0).sum()) for t in trajectories])
        return RewardBreakdown(total=total, components={"even": total})


class Recorder(Callback):
    def __init__(self, monitor: KLMonitor) -> None:
        self.monitor, self.rows = monitor, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = StepOutput.of(outputs)
        trajectories, local = step.trajectories, step.metrics
        logged = trainer.callback_metrics
        self.rows.append(
            {
                "step": trainer.global_step,
                "rank": trainer.global_rank,
                "examples": [t.example.id for t in trajectories],
                "groups": [t.group for t in trajectories],
                "local_reward": float(local["reward/total"]),
                "logged_reward": float(logged["reward/total"]),
                "local_kl": float(local["train/kl"]) if "train/kl" in local else None,
                "logged_kl": float(logged["train/kl"]) if "train/kl" in logged else None,
                "global_kl": list(self.monitor.history[-1]) if self.monitor.history else None,
                "should_stop": bool(trainer.should_stop),
            }
        )


def main(out: Path, kind: str) -> None:
    L.seed_everything(0)
    lora = LoraSettings(r=4, alpha=8, dropout=0.0) if kind.endswith("lora") else None
    module = PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2), lora=lora),
        environment=SingleTurnEnvironment(),
        reward=EvenTokens(),
        algorithm=GRPO(beta=0.1),
        group_size=3,
        sampling=SamplingParams(max_new_tokens=8),
        micro_batch_size=3,
        optimizer=OptimizerSettings(lr=5e-2),
    )
    data = QADataModule(num_train=16, num_val=2, batch_size=2, hops=[2], num_distractors=0)
    # stop once the global max KL exceeds a small threshold: step 0 has KL 0 (policy = reference)
    monitor = KLMonitor(warn_above=None, stop_above=1e-6, patience=1)
    recorder = Recorder(monitor)
    strategy = "ddp" if kind == "ddp" else CPUFSDP(process_group_backend="gloo")
    checkpoint = ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0)
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_steps=6,
        callbacks=[monitor, recorder, checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=data)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(recorder.rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp")
