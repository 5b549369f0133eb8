"""A two-process DDP fit on gloo that counts the collectives of every training step; run by
``test_collectives.py``.

    python tests/scripts/collectives_fit.py OUT_DIR MICRO_BATCH_SIZE

Every ``torch.distributed`` collective a Python caller makes (Lightning's ``reduce``, a
``sync_dist`` log, ``all_gather_object``, a barrier) goes through a recording wrapper; DDP's
gradient all-reduce runs in its C++ reducer and is not counted (it is the gradient's own). The
reducer's buckets are counted separately through a communication hook: one per bucket per
all-reduce. Rank 1 rolls out more prompts than rank 0 (uneven micro-batches). Each rank writes
``OUT_DIR/rank<r>.json``: per step, the collectives of the whole step and of the update, by name,
the gradient all-reduces, and the rank's micro-batches.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections import Counter
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch import Callback

from lit_rag.api import Reward
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer import update as update_module
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import RewardBreakdown

warnings.filterwarnings("ignore")

NAMES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
)
CALLS: Counter = Counter()
GRADIENT = Counter()


def record() -> None:
    for name in NAMES:
        original = getattr(dist, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            CALLS[_name] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, wrapped)


class EvenTokens(Reward):
    def __call__(self, trajectories):
        total = torch.tensor([float((t.completion_ids % 2 == 0).sum()) for t in trajectories])
        return RewardBreakdown(total=total, components={"even": total})


class Steps(Callback):
    def __init__(self) -> None:
        self.rows, self.hooked = [], False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.hooked:  # DDP's reducer exists once the strategy wrapped the module
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting(state, bucket):
                GRADIENT["buckets"] += 1
                return allreduce_hook(state, bucket)

            trainer.strategy.model.register_comm_hook(None, counting)
            self.hooked = True
        CALLS.clear()
        GRADIENT.clear()
        update_module.SEEN.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rows.append(
            {
                "step": trainer.global_step,
                "step_collectives": dict(CALLS),
                "update_collectives": dict(update_module.SEEN),
                "gradient_buckets": GRADIENT["buckets"],
                "micro_batches": update_module.SEEN.get("micro_batches", 0),
                "rows": update_module.SEEN.get("rows", 0),
            }
        )


def count_update() -> None:
    """The update's own collectives and micro-batches (a wrapper around ``Update.__call__``)."""
    update_module.SEEN = Counter()
    call, train = update_module.Update.__call__, update_module.Update._train_micro

    def counted(self, prepared):
        update_module.SEEN["rows"] += prepared.size
        before = Counter(CALLS)
        try:
            return call(self, prepared)
        finally:
            update_module.SEEN.update(Counter(CALLS) - before)

    def micro(self, *args, **kwargs):
        update_module.SEEN["micro_batches"] += 1
        return train(self, *args, **kwargs)

    update_module.Update.__call__, update_module.Update._train_micro = counted, micro


class Uneven(QADataModule):
    """Rank 1 gets one prompt more per step than rank 0."""

    def train_dataloader(self):
        rank = self.trainer.global_rank if self.trainer else 0
        self.batch_size = 2 + rank
        return super().train_dataloader()


def main(out: Path, micro_batch_size: int) -> None:
    record()
    count_update()
    L.seed_everything(0)
    module = PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2)),
        environment=SingleTurnEnvironment(),
        reward=EvenTokens(),
        algorithm=GRPO(beta=0.1),
        group_size=3,
        sampling=SamplingParams(max_new_tokens=8),
        micro_batch_size=micro_batch_size,
        optimizer=OptimizerSettings(lr=5e-2),
    )
    data = Uneven(num_train=16, num_val=2, batch_size=2, hops=[2], num_distractors=0)
    steps = Steps()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_steps=3,
        callbacks=[steps],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=data)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(steps.rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
