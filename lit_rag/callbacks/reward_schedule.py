"""``RewardWeightScheduler``: EVO-RAG's time-based reward weights (evo_rag.txt Section 3.6).

Inside every episode the reward interpolates ``w_k(t) = (1 - p) w_k^early + p w_k^late`` with
``p = t / T_max``; the (early, late) anchors depend on the curriculum stage: Table 1's start ->
mid for Discovery, mid -> end for Refinement (any ``table`` from the recipe replaces Table 1).
This callback owns the table and the stage and pushes the anchors to the reward; a curriculum
callback changes the stage with :meth:`set_stage`.
"""

from __future__ import annotations

from lightning.pytorch import Callback

from lit_rag.plugins.rewards.evo_rag import TABLE_1, stage_anchors


class RewardWeightScheduler(Callback):
    """Keeps the reward's weight anchors on the current stage's row of a (start, mid, end) table.

    Args:
        table: Component -> [start, mid, end]; Table 1 of the paper by default.
        stage: Stage at the start of training, ``discovery`` or ``refinement``.
    """

    def __init__(
        self, table: dict[str, list[float]] | None = None, stage: str = "discovery"
    ) -> None:
        self.table = {k: tuple(float(x) for x in v) for k, v in (table or TABLE_1).items()}
        bad = [k for k, v in self.table.items() if len(v) != 3]
        if bad:
            raise ValueError(f"RewardWeightScheduler table rows need [start, mid, end]; bad: {bad}")
        stage_anchors(stage, self.table)  # validates the stage name
        self.stage = stage

    def set_stage(self, pl_module, stage: str) -> None:
        early, late = stage_anchors(stage, self.table)
        self.stage = stage
        reward = pl_module.reward
        if not reward.time_weighted:
            raise ValueError(
                "RewardWeightScheduler needs a reward with time-dependent weights (evo_rag)"
            )
        reward.set_anchors(early, late)

    def on_train_start(self, trainer, pl_module) -> None:
        self.set_stage(pl_module, self.stage)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        reward = pl_module.reward
        for k, w in reward.weights_at(0).items():
            pl_module.log(f"weights/{k}_t0", w, on_step=True, batch_size=1)

    def state_dict(self) -> dict:
        return {"stage": self.stage}

    def load_state_dict(self, state_dict: dict) -> None:
        self.stage = state_dict.get("stage", self.stage)
