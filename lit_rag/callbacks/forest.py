"""``ProgressiveForest``: R2AG's RR-Forest iterations (r2ag.md Algorithm 1) as a callback.

After every training step the environment prunes the step's trees (``next_contexts``) and the
pruned ones go into the next pool of the datamodule (``data.forest: true``); at the end
of an epoch (one iteration) training stops when nothing is left to expand or ``max_iterations``
iterations have run. In multi-process runs each rank adds its own samples' trees; each rank
then trains on its own shard of its pool.

Refilled prompts. The paper: Algorithm 1 expands every tree of RR-Forest^j once per iteration,
adds each sample's pruned tree to RR-Forest^{j+1}, and only *filters* the groups with
``std{R_i} = 0`` out of the update; nothing is refilled. DAPO's dynamic sampling
(``algorithm.dynamic_sampling_rounds``) draws extra prompts from the pool to replace such
groups: what we do by default is train on them but keep their trees out of the next pool, so
the forest grows as in Algorithm 1 (each tree expanded once per iteration). Why an option:
``include_refills: true`` adds them too (the earlier behaviour), a tree drawn again by a refill
then contributes its samples' trees twice.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback

from lit_rag.contracts.step import StepOutput


class ProgressiveForest(Callback):
    """Feeds pruned retrieval trees back into the training pool.

    Args:
        max_iterations: Stop after this many iterations (epochs); None: only when the forest is
            exhausted. The environment also stops pruning past its ``max_iterations`` (L_MAX-I).
        include_refills: Also add the trees of prompts that dynamic sampling refilled; False
            (default, Algorithm 1): only the batch's own prompts feed the next iteration.
    """

    def __init__(self, max_iterations: int | None = None, include_refills: bool = False) -> None:
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(
                f"ProgressiveForest max_iterations must be >= 1 or null; got {max_iterations}"
            )
        self.max_iterations = max_iterations
        self.include_refills = include_refills
        self.added = 0

    def _datamodule(self, trainer):
        datamodule = trainer.datamodule
        if datamodule is None or not getattr(datamodule, "forest", False):
            raise ValueError(
                "ProgressiveForest needs data.forest: true "
                "(and trainer.reload_dataloaders_every_n_epochs: 1)"
            )
        return datamodule

    def on_train_start(self, trainer, pl_module) -> None:
        self._datamodule(trainer)
        if not pl_module.environment.grows_forest:
            raise ValueError(
                "ProgressiveForest needs an environment with next_contexts (retrieval_tree)"
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = StepOutput.of(outputs)
        if step is None:
            return
        trajectories = step.trajectories
        if not self.include_refills:
            # the batch's prompts are groups 0..len(batch)-1; the refill
            # (lit_rag.trainer.refill) numbers the refilled groups after them
            trajectories = [t for t in trajectories if t.group < len(batch)]
        datamodule = self._datamodule(trainer)
        self.added += datamodule.add_contexts(pl_module.environment.next_contexts(trajectories))
        pl_module.log("forest/iteration", float(datamodule.iteration), on_step=True, batch_size=1)
        pl_module.log("forest/next_pool", float(len(datamodule.next)), on_step=True, batch_size=1)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        datamodule = self._datamodule(trainer)
        remaining = torch.tensor(float(len(datamodule.next)), device=pl_module.device)
        if trainer.world_size > 1:  # every rank stops together
            remaining = trainer.strategy.reduce(remaining, reduce_op="sum")
        done = datamodule.iteration + 1
        if float(remaining) == 0 or (
            self.max_iterations is not None and done >= self.max_iterations
        ):
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"added": self.added}

    def load_state_dict(self, state_dict: dict) -> None:
        self.added = int(state_dict.get("added", 0))
