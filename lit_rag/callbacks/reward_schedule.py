"""``RewardWeightScheduler``: a time-weighted reward's anchors follow the curriculum stage
(EVO-RAG, evo_rag.txt Section 3.6).

Inside every episode a time-weighted reward interpolates ``w_k(t) = (1 - p) w_k^early +
p w_k^late`` with ``p = t / T_max``; which (early, late) anchors a stage uses is the reward's
own table (EVO-RAG's Table 1: start -> mid for Discovery, mid -> end for Refinement) unless the
recipe gives ``table``. This callback holds the stage and pushes it to the reward; a curriculum
callback changes the stage with :meth:`set_stage`. The callback knows no method's numbers.
"""

from __future__ import annotations

from lightning.pytorch import Callback


class RewardWeightScheduler(Callback):
    """Keeps a time-weighted reward's weight anchors on the current stage's row of its table.

    Args:
        table: Component -> anchor row (EVO-RAG: [start, mid, end]) replacing the reward's own
            table; ``None``: the reward's (EVO-RAG: Table 1).
        stage: Stage at the start of training; ``None``: the reward's first stage.
    """

    def __init__(
        self, table: dict[str, list[float]] | None = None, stage: str | None = None
    ) -> None:
        self.table = None
        if table is not None:
            self.table = {k: tuple(float(x) for x in v) for k, v in table.items()}
            widths = {len(v) for v in self.table.values()}
            if len(widths) != 1 or min(widths) < 2:
                raise ValueError(
                    "RewardWeightScheduler table rows need one length of at least 2 anchors "
                    f"(EVO-RAG: [start, mid, end]); got {table}"
                )
        self.stage = stage

    def set_stage(self, pl_module, stage: str) -> None:
        reward = pl_module.reward
        if not reward.time_weighted:
            raise ValueError(
                f"RewardWeightScheduler needs a reward with time-dependent weights (evo_rag); "
                f"{type(reward).__name__} has none"
            )
        if self.table is None:
            reward.set_stage(stage)
        else:
            reward.set_stage(stage, table=self.table)
        self.stage = stage

    def on_train_start(self, trainer, pl_module) -> None:
        self.set_stage(pl_module, self.stage or pl_module.reward.stages[0])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        reward = pl_module.reward
        for k, w in reward.weights_at(0).items():
            pl_module.log(f"weights/{k}_t0", w, on_step=True, batch_size=1)

    def state_dict(self) -> dict:
        return {"stage": self.stage}

    def load_state_dict(self, state_dict: dict) -> None:
        self.stage = state_dict.get("stage", self.stage)
