"""``AlternatingRewardModel``: EVO-RAG's reward-model epochs between policy epochs
(evo_rag.txt Section 3.3, 3.4 and Algorithm 1).

Algorithm 1 rolls out episodes under the current stage, stores sibling preferences, and
fine-tunes the policy with DPO; Section 3.4 alternates "one reward-model epoch with one policy
epoch". In Lightning terms:

- a policy epoch is an epoch of the ``PolicyModule`` fit (rollout -> DPO on sibling pairs,
  every step);
- after every training step this callback takes the step's rollout (the
  :class:`~lit_rag.contracts.step.StepOutput` in ``outputs``) and keeps the sibling pairs that took
  different actions at their state and whose weighted returns differ by at least ``threshold``
  (Delta = 0.3, Section 3.3); a pair's texts are the
  trajectory prefixes ``(s_t, a_t)`` (``view: prefix``; ``branch`` adds the rest of the
  branch), with per-component signs for the ``per_component`` objective;
- at the end of every policy epoch it fits the :class:`RewardModelModule` for ``epochs`` epochs
  on every pair collected so far (a nested ``Trainer.fit``: the reward model is a
  LightningModule of its own, with its own optimizer), holding out the pairs of a fraction of
  the questions for its validation loss and pairwise accuracy (logged as ``reward_model/*``);
- from then on, if the algorithm selects pairs by ``reward_model`` (``dpo`` with
  ``selection: reward_model``, an option: the paper's default selects on the reward with
  delta = 0.2), the trained model ranks the siblings of the next policy epoch.

The pairs of each epoch are also written to ``<log dir>/preference_pairs/epoch<N>.jsonl``, the
format ``recipes/evo_rag_reward_model.yaml`` trains from. The heads, the pairs and the cycle
count are in the checkpoint, so a resumed run continues the same reward model.

Decisions where the paper is silent: the reward model trains on all pairs gathered so far (not
only the last epoch's); its optimizer restarts every cycle; held-out questions are chosen by a
hash of their id. With several ranks, each epoch's pairs are gathered from all ranks and every
rank fits the same model on them (same data, same batch order, same initial heads).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader

from lit_rag.contracts.step import StepOutput
from lit_rag.trainer.reward_model import (
    VIEWS,
    RewardModelModule,
    sibling_pairs,
    trajectory_text,
    write_pairs,
)
from lit_rag.types import Trajectory


class AlternatingRewardModel(Callback):
    """Collects sibling preference pairs and trains the reward model once per policy epoch.

    Args:
        reward_model: The multi-head preference model (its frozen encoder and heads).
        threshold: Least weighted-return gap of a reward-model pair (Delta = 0.3).
        epochs: Reward-model epochs per policy epoch (the paper: 1).
        batch_size: Pairs per reward-model batch.
        val_fraction: Fraction of questions whose pairs are held out for validation.
        max_pairs: Keep at most this many pairs (the newest); None keeps all.
        score_batch_size: Trajectories per forward pass when scoring for pair selection.
        view: What the model reads: ``prefix`` (state and action, the paper) or ``branch``.
    """

    def __init__(
        self,
        reward_model: RewardModelModule,
        threshold: float = 0.3,
        epochs: int = 1,
        batch_size: int = 16,
        val_fraction: float = 0.2,
        max_pairs: int | None = None,
        score_batch_size: int = 16,
        view: str = "prefix",
    ) -> None:
        if epochs < 1 or batch_size < 1 or not 0.0 <= val_fraction < 1.0:
            raise ValueError(
                "AlternatingRewardModel epochs and batch_size must be >= 1 "
                "and val_fraction in [0, 1); "
                f"got {epochs}, {batch_size}, {val_fraction}"
            )
        if view not in VIEWS:
            raise ValueError(
                f"AlternatingRewardModel view '{view}' is not known; allowed: {', '.join(VIEWS)}"
            )
        self.reward_model, self.view = reward_model, view
        self.threshold, self.epochs, self.batch_size = threshold, epochs, batch_size
        self.val_fraction, self.max_pairs, self.score_batch_size = (
            val_fraction,
            max_pairs,
            score_batch_size,
        )
        self.pairs: list[dict] = []
        self.epoch_start = 0  # index in ``pairs`` where this policy epoch's pairs start
        self.cycles = 0
        self.history: list[dict[str, float]] = []
        self._pending_heads: dict[str, torch.Tensor] | None = None

    # ---- scoring ---------------------------------------------------------------------------
    def score(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """``[N]`` reward-model scores (sum of the heads) of trajectories, for pair selection."""
        texts = [trajectory_text(t, self.view) for t in trajectories]
        out = [
            self.reward_model.score(texts[i : i + self.score_batch_size])
            for i in range(0, len(texts), self.score_batch_size)
        ]
        return torch.cat(out).float().cpu() if out else torch.zeros(0)

    def _attach(self, pl_module) -> None:
        if self.cycles > 0 and pl_module.algorithm.wants_scorer:  # DPO with selection: reward_model
            pl_module.algorithm.scorer = self.score

    # ---- hooks -----------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self.reward_model.configure_model()
        if self._pending_heads is not None:
            self.reward_model.heads.load_state_dict(self._pending_heads)
            self._pending_heads = None
        self._attach(pl_module)

    def on_train_start(self, trainer, pl_module) -> None:
        self._attach(pl_module)  # after a resume restored ``cycles``

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = StepOutput.of(outputs)
        if step is None:
            return
        trajectories, rewards = step.trajectories, step.rewards
        new = sibling_pairs(trajectories, rewards, self.threshold, self.view)
        self.pairs.extend(new)
        if self.max_pairs is not None and len(self.pairs) > self.max_pairs:
            cut = len(self.pairs) - self.max_pairs
            self.pairs = self.pairs[cut:]
            self.epoch_start = max(0, self.epoch_start - cut)
        pl_module.log("reward_model/pairs_collected", float(len(new)), on_step=True, batch_size=1)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._gather_epoch_pairs(trainer)
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank asks
        if trainer.is_global_zero and log_dir and len(self.pairs) > self.epoch_start:
            write_pairs(
                self.pairs[self.epoch_start :],
                Path(log_dir) / "preference_pairs" / f"epoch{trainer.current_epoch}.jsonl",
            )
        self.epoch_start = len(self.pairs)
        if not self.pairs:
            return
        metrics = self.fit_reward_model(trainer)
        self.cycles += 1
        self.history.append(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self._attach(pl_module)

    def _gather_epoch_pairs(self, trainer) -> None:
        """With several ranks, every rank gets every rank's pairs of this epoch (in rank order),
        so all ranks fit the same reward model on the same pairs and rank siblings alike."""
        import torch.distributed as dist

        if trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return
        mine = self.pairs[self.epoch_start :]
        gathered: list[list[dict]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, mine)
        self.pairs = self.pairs[: self.epoch_start] + [p for rank in gathered for p in rank]

    # ---- the reward-model epoch -----------------------------------------------------------
    def split(self) -> tuple[list[dict], list[dict]]:
        """(train, val) pairs; a question's pairs all go to one side."""
        cut = int(self.val_fraction * 1000)
        train: list[dict] = []
        val: list[dict] = []
        for pair in self.pairs:
            held_out = zlib.crc32(str(pair.get("question", "")).encode()) % 1000 < cut
            (val if held_out else train).append(pair)
        return (train or val), val

    def fit_reward_model(self, trainer) -> dict[str, float]:
        """``epochs`` epochs of the reward model on the pairs so far (a nested Lightning fit)."""
        train, val = self.split()
        order = torch.Generator().manual_seed(self.cycles)  # the same batches on every rank

        def loader(rows, shuffle):
            return DataLoader(
                rows,
                batch_size=self.batch_size,
                shuffle=shuffle,
                collate_fn=lambda b: b,
                generator=order,
            )

        inner = L.Trainer(
            accelerator="gpu" if trainer.strategy.root_device.type == "cuda" else "cpu",
            devices=1,
            precision=trainer.precision,
            max_epochs=self.epochs,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            log_every_n_steps=1,
        )
        with torch.enable_grad():
            inner.fit(self.reward_model, loader(train, True), loader(val, False) if val else None)
        got = inner.callback_metrics
        metrics = {
            "reward_model/pairs": float(len(self.pairs)),
            "reward_model/train_pairs": float(len(train)),
            "reward_model/cycle": float(self.cycles + 1),
        }
        for key in ("train/loss", "train/pair_accuracy", "val/loss", "val/pair_accuracy"):
            if key in got:
                metrics[f"reward_model/{key.replace('/', '_')}"] = float(got[key])
        self.reward_model.eval()
        return metrics

    # ---- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        heads = self.reward_model.heads
        return {
            "pairs": self.pairs,
            "epoch_start": self.epoch_start,
            "cycles": self.cycles,
            "history": self.history,
            "heads": {k: v.detach().cpu() for k, v in heads.state_dict().items()}
            if heads is not None
            else None,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.pairs = list(state_dict.get("pairs", []))
        self.epoch_start = int(state_dict.get("epoch_start", len(self.pairs)))
        self.cycles = int(state_dict.get("cycles", 0))
        self.history = list(state_dict.get("history", []))
        heads = state_dict.get("heads")
        if heads is not None:
            if self.reward_model.heads is not None:
                self.reward_model.heads.load_state_dict(heads)
            else:
                self._pending_heads = heads
