"""``KLMonitor``: watch the policy's KL to its reference across all ranks; warn, stop or adapt.

Every rank computes the same global mean and max (a collective reduce), so every rank takes
the same decision at the same step: no rank stops alone. The adaptive controller is the
proportional one of Ziegler et al. 2019 (Section 2.2): beta <- beta * (1 + K_beta * e),
e = clip(KL / target - 1, -0.2, 0.2), K_beta = 0.1.

The adapted beta, the steps above ``stop_above`` and the KL history are checkpointed: a resumed
run continues from the beta it had reached, not from the recipe's.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lit_rag.contracts.step import StepOutput


class KLMonitor(Callback):
    """Reduces the step's KL across ranks and acts on the global value.

    Args:
        warn_above: Warn when the global mean KL exceeds this.
        stop_above: Stop training when the global max KL exceeds this for ``patience`` steps.
        patience: Consecutive steps above ``stop_above`` before stopping.
        target: Adapt the algorithm's ``beta`` towards this mean KL (None: fixed beta).
        adapt_rate: Proportional gain K_beta of the controller.
        min_beta: Lower bound on the adapted beta.
        max_beta: Upper bound on the adapted beta.
        metric: Key of the per-step KL in the module's ``last_metrics``.
    """

    def __init__(
        self,
        warn_above: float | None = 1.0,
        stop_above: float | None = None,
        patience: int = 1,
        target: float | None = None,
        adapt_rate: float = 0.1,
        min_beta: float = 1e-4,
        max_beta: float = 1.0,
        metric: str = "train/kl",
    ) -> None:
        self.warn_above, self.stop_above, self.patience = warn_above, stop_above, patience
        self.target, self.adapt_rate = target, adapt_rate
        self.min_beta, self.max_beta, self.metric = min_beta, max_beta, metric
        self.above = 0
        self.history: list[tuple[float, float]] = []
        self.beta: float | None = None  # the adapted beta (None until the first adaptation)
        # from a checkpoint, set on the algorithm at train start
        self._restored_beta: float | None = None

    def global_kl(
        self, pl_module: LightningModule, step: StepOutput | None
    ) -> tuple[float, float] | None:
        """(mean, max) of the KL over ranks (a collective: every rank calls it); None when no
        rank's step computed a KL."""
        local = None if step is None else step.metrics.get(self.metric)
        present = torch.tensor(0.0 if local is None else 1.0, device=pl_module.device)
        value = torch.tensor(0.0 if local is None else float(local), device=pl_module.device)
        gathered = pl_module.all_gather(torch.stack([value, present]))  # [world, 2] or [2]
        gathered = gathered.reshape(-1, 2)
        valid = gathered[gathered[:, 1] > 0, 0]
        if valid.numel() == 0:
            return None
        return float(valid.mean()), float(valid.max())

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning restores callback state after the module's (and after configure_optimizers
        # under FSDP / DeepSpeed) and never hands the module to load_state_dict: the restored
        # beta goes onto the algorithm here, after every restore and before the first step
        algorithm = pl_module.algorithm
        if (
            self._restored_beta is not None
            and self.target is not None
            and algorithm.kl_coef is not None
        ):
            algorithm.kl_coef = self._restored_beta
            self.beta = self._restored_beta
        self._restored_beta = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        stats = self.global_kl(pl_module, StepOutput.of(outputs))
        if stats is None:
            return
        mean, peak = stats
        self.history.append((mean, peak))
        logs = {"kl/global_mean": mean, "kl/global_max": peak}
        if self.warn_above is not None and mean > self.warn_above:
            rank_zero_warn(
                f"KL to the reference is {mean:.4f} (> warn_above {self.warn_above}) "
                f"at step {trainer.global_step}"
            )
        if self.stop_above is not None:
            self.above = self.above + 1 if peak > self.stop_above else 0
            if self.above >= self.patience:
                rank_zero_warn(
                    f"stopping: max KL {peak:.4f} > stop_above {self.stop_above} "
                    f"for {self.above} step(s)"
                )
                trainer.should_stop = True
        algorithm = pl_module.algorithm
        # the algorithm declares a KL coefficient
        if self.target is not None and algorithm.kl_coef is not None:
            error = max(-0.2, min(0.2, mean / self.target - 1.0))
            algorithm.kl_coef = min(
                self.max_beta, max(self.min_beta, algorithm.kl_coef * (1 + self.adapt_rate * error))
            )
            self.beta = float(algorithm.kl_coef)
        if algorithm.kl_coef is not None:
            logs["kl/beta"] = float(algorithm.kl_coef)
        pl_module.log_dict(logs, on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict:
        """Plain numbers (loadable with ``torch.load(weights_only=True)``)."""
        return {
            "above": self.above,
            "beta": self.beta,
            "history": [list(pair) for pair in self.history],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores the counters; the adapted beta reaches the algorithm at train start, and only
        when this run adapts too (``target`` set): with a fixed beta the recipe's value holds."""
        self.above = state_dict.get("above", 0)
        self.history = [tuple(pair) for pair in state_dict.get("history", [])]
        self.beta = self._restored_beta = state_dict.get("beta")
