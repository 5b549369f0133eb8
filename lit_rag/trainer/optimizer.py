"""The optimizer settings of :class:`~lit_rag.trainer.policy.PolicyModule`, checked in one place
(as litgpt's ``TrainArgs``), and what they build: AdamW, the learning-rate schedule whose plan
the checkpoint carries (:mod:`lit_rag.trainer.schedule`), and one optimizer step (clip, step,
clear, advance the schedule)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lit_rag.models.strategies import is_sharded
from lit_rag.trainer.schedule import keep_stored_plan, lr_factor, plan_schedule

SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW, its learning-rate schedule and gradient clipping: the recipe's ``model.optimizer``
    group.

    Attributes:
        lr: Peak learning rate (AdamW).
        weight_decay: AdamW weight decay (default 0: TRL's, which ARENA's release keeps; verl's
            is 0.01).
        betas: AdamW betas (default (0.9, 0.999): torch's, TRL's and verl's).
        warmup_steps: Linear warm-up optimizer steps.
        warmup_ratio: Linear warm-up as a fraction of the run's optimizer steps (verl's
            ``lr_warmup_steps_ratio``); set this or ``warmup_steps``, not both.
        lr_schedule: ``constant``, ``cosine`` or ``linear`` decay after warm-up.
        max_grad_norm: Clip the gradient norm; ``None`` disables clipping.

    Raises:
        ValueError: a value out of range, naming the key and what is allowed.
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    lr_schedule: str = "constant"
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.lr < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError(
                "model.optimizer lr, weight_decay and warmup_steps must be >= 0, "
                f"got {self.lr}, {self.weight_decay}, {self.warmup_steps}"
            )
        if not 0.0 <= self.warmup_ratio < 1.0 or (self.warmup_ratio and self.warmup_steps):
            raise ValueError(
                f"model.optimizer warmup_ratio must be in [0, 1) and not set beside warmup_steps, "
                f"got warmup_ratio {self.warmup_ratio}, warmup_steps {self.warmup_steps}"
            )
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(
                "model.optimizer max_grad_norm must be > 0 or null (no clipping), "
                f"got {self.max_grad_norm}"
            )
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(
                f"model.optimizer lr_schedule '{self.lr_schedule}' is not known; "
                f"allowed: {', '.join(SCHEDULES)}"
            )

    def adamw(self, params, fused: bool = False) -> torch.optim.AdamW:
        """AdamW over ``params``; ``fused``: torch's fused kernel (:func:`fused_adamw`).

        A fused AdamW declares that its step can unscale fp16 gradients itself, which makes
        Lightning refuse to clip them first; lit-rag lets the gradient scaler unscale them
        before clipping, as for any optimizer (the kernel then steps on unscaled gradients).
        """
        optimizer = torch.optim.AdamW(
            params,
            lr=self.lr,
            weight_decay=self.weight_decay,
            betas=self.betas,
            **({"fused": True} if fused else {}),
        )
        optimizer._step_supports_amp_scaling = False
        return optimizer

    def plan(self, trainer, steps_per_batch: int) -> dict:
        """This run's learning-rate plan (:func:`~lit_rag.trainer.schedule.plan_schedule`)."""
        return plan_schedule(
            trainer, self.lr_schedule, self.warmup_steps, steps_per_batch, self.warmup_ratio
        )


def fused_adamw(params: list[torch.Tensor], strategy=None) -> bool:
    """Whether AdamW takes torch's fused kernel: every trained weight a floating-point tensor on
    the CPU or a CUDA device, and no DeepSpeed (its ZeRO optimizer wraps the one it is given).

    The same update, one kernel over all weights instead of a loop of small operations: on the
    host (FSDP's ``cpu_offload`` steps the fp32 masters there, ten times a batch in the
    Eval-RAR and Search-R1 recipes) it measured 1.36 ns per weight at one thread against 8.04
    for torch's default on CPU (``python benchmarks/host_optimizer.py``, Intel Xeon with AMX):
    26 s instead of 153 s a batch for a rank's shard of a 7B policy over 4 ranks.
    """
    if strategy is not None and _is_deepspeed(strategy):
        return False
    return bool(params) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )


def _is_deepspeed(strategy) -> bool:
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return isinstance(strategy, DeepSpeedStrategy)


class SchedulePlan:
    """The learning-rate plan the live ``LambdaLR`` factor reads, and the plan of a checkpoint
    being resumed: the checkpoint's wins (:func:`~lit_rag.trainer.schedule.keep_stored_plan`),
    whichever of the two arrives first (most strategies restore a checkpoint before
    ``configure_optimizers``, FSDP and DeepSpeed after)."""

    def __init__(self) -> None:
        self.current: dict | None = None  # kind, warmup, total (optimizer steps)
        self.stored: dict | None = None

    def start(self, plan: dict) -> None:
        self.current = plan
        self._keep_stored()

    def restore(self, plan: dict) -> None:
        self.stored = dict(plan)
        self._keep_stored()

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """A ``LambdaLR`` whose factor reads the plan at every step (LambdaLR does not save its
        function: the plan is in the checkpoint, and a plan restored later updates it in place)."""
        plan = self.current

        def factor(step: int) -> float:
            return lr_factor(step, plan["kind"], plan["warmup"], plan["total"])

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _keep_stored(self) -> None:
        if self.stored is not None and self.current is not None:
            keep_stored_plan(self.stored, self.current)
            self.stored = None


def optimizer_step(
    model: torch.nn.Module,
    clip_gradients: Callable[..., None],
    optimizer,
    scheduler,
    max_grad_norm: float | None,
) -> float:
    """Clip the accumulated gradient (FSDP's own clipping for a sharded ``model``, else
    Lightning's ``clip_gradients``), step, clear it, advance the schedule; returns the learning
    rate this optimizer step used."""
    if max_grad_norm is not None:
        if is_sharded(model):  # the norm over all shards (FSDP's own clipping)
            model.clip_grad_norm_(max_grad_norm)
        else:  # under DeepSpeed this is a no-op: the engine clips (PolicyModule.setup)
            clip_gradients(
                optimizer, gradient_clip_val=max_grad_norm, gradient_clip_algorithm="norm"
            )
    rate = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return rate
