"""``CurriculumCallback``: a staged curriculum, as EVO-RAG's two stages (evo_rag.txt Sections
3.5, 3.7).

Named stages run in order (the reward's own, EVO-RAG's Discovery then Refinement, unless the
recipe names them). A stage ends after a number of
optimizer steps or epochs, or when a monitored validation metric has not improved for
``patience`` validations (the paper stops "if HotpotQA dev EM stalls for two cycles"). On a
switch the callback

- tells the :class:`~lit_rag.callbacks.RewardWeightScheduler` (or the reward itself) the new
  stage, so the reward's weight anchors change (EVO-RAG: Table 1's);
- optionally reloads the best checkpoint of the finished stage (``reload_best``: the weights
  with the best monitored value, from the run's ``ModelCheckpoint``);
- logs ``curriculum/stage`` (the stage's index) every step.

After the last stage, a plateau stops training when ``stop_on_final_plateau`` is set.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.callbacks.reward_schedule import RewardWeightScheduler


class CurriculumCallback(Callback):
    """Moves through named stages on a step / epoch count or a plateau.

    Args:
        stages: Stage names, in order; ``None``: the reward's ``stages``.
        switch_after_steps: Optimizer steps per stage (all but the last), or None.
        switch_after_epochs: Epochs per stage (all but the last), or None.
        monitor: Validation metric that decides plateaus (e.g. ``val/em``), or None.
        mode: ``max`` or ``min`` for ``monitor``.
        patience: Validations without improvement that make a plateau.
        min_delta: Smallest change that counts as an improvement.
        reload_best: On a switch, load the best checkpoint of the finished stage.
        stop_on_final_plateau: Stop training on a plateau in the last stage.
    """

    def __init__(
        self,
        stages: list[str] | None = None,
        switch_after_steps: int | None = None,
        switch_after_epochs: int | None = None,
        monitor: str | None = None,
        mode: str = "max",
        patience: int = 2,
        min_delta: float = 0.0,
        reload_best: bool = False,
        stop_on_final_plateau: bool = True,
    ) -> None:
        if stages is not None and not stages:
            raise ValueError("CurriculumCallback needs at least one stage")
        if mode not in ("max", "min"):
            raise ValueError(f"CurriculumCallback mode must be max or min, got '{mode}'")
        if switch_after_steps is None and switch_after_epochs is None and monitor is None:
            raise ValueError(
                "CurriculumCallback needs switch_after_steps, switch_after_epochs or monitor"
            )
        self.stages = list(stages) if stages is not None else None
        self.switch_after_steps, self.switch_after_epochs = switch_after_steps, switch_after_epochs
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.reload_best, self.stop_on_final_plateau = reload_best, stop_on_final_plateau
        self.index = 0
        self.stage_start_step = 0
        self.stage_start_epoch = 0
        self.best: float | None = None
        self.stale = 0
        self.switches: list[tuple[int, str, str]] = []  # (step, from, to)

    @property
    def stage(self) -> str:
        return self.stages[self.index]

    # ---- switching ------------------------------------------------------------------------
    def _apply_stage(self, trainer, pl_module) -> None:
        schedulers = [c for c in trainer.callbacks if isinstance(c, RewardWeightScheduler)]
        if schedulers:
            for s in schedulers:
                s.set_stage(pl_module, self.stage)
        elif pl_module.reward.stages:
            pl_module.reward.set_stage(self.stage)

    def switch(self, trainer, pl_module, reason: str) -> None:
        if self.index + 1 >= len(self.stages):
            return
        previous = self.stage
        if self.reload_best:
            self._reload_best(trainer, pl_module)
        self.index += 1
        self.stage_start_step, self.stage_start_epoch = trainer.global_step, trainer.current_epoch
        self.best, self.stale = None, 0
        self.switches.append((trainer.global_step, previous, self.stage))
        self._apply_stage(trainer, pl_module)

    def _reload_best(self, trainer, pl_module) -> None:
        # a monitored checkpoint's best; an unmonitored one's "best" is only its latest
        saved = [
            c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.best_model_path
        ]
        paths = [c.best_model_path for c in sorted(saved, key=lambda c: c.monitor is None)]
        if not paths:
            return
        state = torch.load(paths[0], map_location="cpu", weights_only=True)["state_dict"]
        pl_module.load_state_dict(state, strict=False)
        # an engine with its own copy (vllm), or the rollout workers, sample the reloaded weights
        workers = getattr(pl_module, "workers", None)
        engine = getattr(pl_module, "engine", None)
        if workers is not None:
            workers.resync()
        elif engine is not None:
            engine.sync_weights()

    # ---- hooks ------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.stages is None:
            self.stages = list(pl_module.reward.stages)
            if not self.stages:
                raise ValueError(
                    f"CurriculumCallback needs stages: the recipe's or the reward's, and "
                    f"{type(pl_module.reward).__name__} declares none"
                )

    def on_train_start(self, trainer, pl_module) -> None:
        self._apply_stage(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        pl_module.log("curriculum/stage", float(self.index), on_step=True, batch_size=1)
        if (
            self.switch_after_steps is not None
            and trainer.global_step - self.stage_start_step >= self.switch_after_steps
        ):
            self.switch(trainer, pl_module, "steps")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if (
            self.switch_after_epochs is not None
            and trainer.current_epoch + 1 - self.stage_start_epoch >= self.switch_after_epochs
        ):
            self.switch(trainer, pl_module, "epochs")

    def on_validation_end(self, trainer, pl_module) -> None:
        if (
            self.monitor is None
            or trainer.sanity_checking
            or self.monitor not in trainer.callback_metrics
        ):
            return
        value = float(trainer.callback_metrics[self.monitor])
        better = self.best is None or (
            value > self.best + self.min_delta
            if self.mode == "max"
            else value < self.best - self.min_delta
        )
        if better:
            self.best, self.stale = value, 0
            return
        self.stale += 1
        if self.stale < self.patience:
            return
        if self.index + 1 < len(self.stages):
            self.switch(trainer, pl_module, "plateau")
        elif self.stop_on_final_plateau:
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {
            "index": self.index,
            "stage_start_step": self.stage_start_step,
            "stage_start_epoch": self.stage_start_epoch,
            "best": self.best,
            "stale": self.stale,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.index = int(state_dict.get("index", 0))
        self.stage_start_step = int(state_dict.get("stage_start_step", 0))
        self.stage_start_epoch = int(state_dict.get("stage_start_epoch", 0))
        self.best, self.stale = state_dict.get("best"), int(state_dict.get("stale", 0))
