"""What the ranks of a multi-process run agree on: a flag any rank holds, the largest count on
any rank, and a step's metrics logged reduced where every rank has them. With one process each
is the local value and no collective runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Ranks:
    """The run's processes as this one sees them: how many there are, the Lightning strategy
    whose ``reduce`` is the collective (``None`` with one process), and the device this rank's
    tensors live on."""

    world_size: int = 1
    strategy: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def of(cls, module) -> Ranks:
        """The ranks of ``module``'s trainer; one rank when no trainer is attached. With one
        rank the strategy is not read: no collective runs."""
        if module._trainer is None or module.trainer.world_size < 2:
            return cls(device=module.device)
        return cls(module.trainer.world_size, module.trainer.strategy, module.device)

    def max_over_ranks(self, n: int) -> int:
        """The largest ``n`` over ranks (a collective with several ranks)."""
        if self.world_size < 2:
            return n
        value = self.strategy.reduce(torch.tensor(float(n), device=self.device), reduce_op="max")
        return int(value.item())

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """Each of ``values`` summed over ranks (one collective with several ranks; every rank
        passes as many values)."""
        if self.world_size < 2:
            return list(values)
        total = self.strategy.reduce(
            torch.tensor(values, dtype=torch.float64, device=self.device), reduce_op="sum"
        )
        return [float(v) for v in total.cpu().tolist()]

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a collective with several ranks)."""
        return self.max_over_ranks(int(flag)) > 0


def world_size(module) -> int:
    return Ranks.of(module).world_size


def any_rank(module, flag: bool) -> bool:
    """Whether ``flag`` holds on any of ``module``'s ranks (:meth:`Ranks.any_rank`)."""
    return Ranks.of(module).any_rank(flag)


def log_metrics(
    module, metrics: dict, batch_size: int, on_step: bool = True, on_epoch: bool = False
) -> None:
    """Log a step's metrics, reduced across ranks (mean) where every rank has the metric.

    The ranks' metric sets can differ (a rank without preference pairs has no DPO margin); a
    metric only some ranks have is logged unreduced, since a reduction would wait forever for
    the ranks that lack it.
    """
    shared = set(metrics)
    world = world_size(module)
    if world > 1 and on_step:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            keys: list[list[str]] = [[] for _ in range(world)]
            dist.all_gather_object(keys, sorted(metrics))
            shared = set.intersection(*(set(k) for k in keys))
    # the same order on every rank
    for key in sorted(metrics, key=lambda k: (k not in shared, k)):
        value = metrics[key]
        module.log(
            key,
            value.float() if torch.is_tensor(value) else float(value),
            on_step=on_step,
            on_epoch=on_epoch,
            batch_size=batch_size,
            sync_dist=world > 1 and key in shared,
            prog_bar=key in ("reward/total", "train/kl", "val/reward/total"),
        )
