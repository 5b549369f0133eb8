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
        return self.max_each([n])[0]

    def max_each(self, values: list[int]) -> list[int]:
        """Each of ``values`` maxed over ranks: one collective for all of them with several
        ranks (every rank passes as many values)."""
        if self.world_size < 2:
            return list(values)
        value = self.reduce(torch.tensor(values, dtype=torch.float64, device=self.device), "max")
        return [int(v) for v in value.cpu().tolist()]

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """Each of ``values`` summed over ranks (one collective with several ranks; every rank
        passes as many values)."""
        if self.world_size < 2:
            return list(values)
        total = self.reduce(torch.tensor(values, dtype=torch.float64, device=self.device), "sum")
        return [float(v) for v in total.cpu().tolist()]

    def mean_each(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each of ``values`` (scalars) averaged over ranks, as one stacked tensor through one
        collective; the results stay on the device (no host sync)."""
        if self.world_size < 2 or not values:
            return list(values)
        stacked = torch.stack(
            [v.detach().to(self.device, torch.float32).reshape(()) for v in values]
        )
        return list(self.reduce(stacked, "mean").unbind())

    def reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """``tensor`` reduced over the ranks (``max``, ``sum`` or ``mean``) in one
        ``all_reduce`` of the default process group; Lightning's ``strategy.reduce`` adds a
        barrier before each, a second collective. Without a process group (a test's stand-in
        strategy) the strategy reduces."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.strategy.reduce(tensor, reduce_op=op)
        kind = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
        dist.all_reduce(tensor, op=kind)
        return tensor / self.world_size if op == "mean" else tensor

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
    the ranks that lack it. A step's metrics (``on_step`` alone) cost two collectives whatever
    their number: the ranks' key sets, then every shared value in one stacked mean
    (:meth:`Ranks.mean_each`), logged as device tensors; epoch metrics keep Lightning's
    ``sync_dist`` (it reduces their epoch mean).
    """
    shared = set(metrics)
    ranks = Ranks.of(module)
    world = ranks.world_size
    if world > 1 and on_step:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            keys: list[list[str]] = [[] for _ in range(world)]
            dist.all_gather_object(keys, sorted(metrics))
            shared = set.intersection(*(set(k) for k in keys))
    values = {k: torch.as_tensor(v).float() for k, v in metrics.items()}
    packed = world > 1 and on_step and not on_epoch
    if packed:  # the same order on every rank
        names = sorted(shared)
        values.update(zip(names, ranks.mean_each([values[k] for k in names]), strict=True))
    for key in sorted(metrics, key=lambda k: (k not in shared, k)):
        module.log(
            key,
            values[key],
            on_step=on_step,
            on_epoch=on_epoch,
            batch_size=batch_size,
            sync_dist=world > 1 and key in shared and not packed,
            prog_bar=key in ("reward/total", "train/kl", "val/reward/total"),
        )
