"""The parts PolicyModule delegates to: the refill's pool draw, the optimizer settings, the
learning-rate plan a checkpoint restores."""

from types import SimpleNamespace

import pytest
import torch

from lit_rag.trainer.optimizer import OptimizerSettings, SchedulePlan
from lit_rag.trainer.refill import draw_from_pool
from lit_rag.types import Example


def test_a_datamodule_without_a_pool_refills_nothing_and_a_pool_draws_by_key():
    assert draw_from_pool(None, 3, "0-0-0") == []
    assert draw_from_pool(SimpleNamespace(seed=1), 3, "0-0-0") == []
    pool = [Example(f"q{i}", f"question {i}", ["a"]) for i in range(10)]
    data = SimpleNamespace(seed=7, pool=lambda: pool)
    first = [e.id for e in draw_from_pool(data, 3, "4-1-0")]
    assert first == [e.id for e in draw_from_pool(data, 3, "4-1-0")]  # a resumed run: the same
    assert len(first) == len(set(first)) == 3
    assert first != [e.id for e in draw_from_pool(data, 3, "5-1-0")]  # the next step: others
    assert len(draw_from_pool(data, 20, "0-0-0")) == 10  # never more than the pool


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"lr": -1.0}, "lr, weight_decay and warmup_steps must be >= 0"),
        ({"warmup_ratio": 0.1, "warmup_steps": 2}, "not set beside warmup_steps"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0"),
        ({"lr_schedule": "step"}, "allowed: constant, cosine, linear"),
    ],
)
def test_optimizer_settings_name_the_bad_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OptimizerSettings(**kwargs)


def test_optimizer_settings_build_adamw_with_their_values():
    settings = OptimizerSettings(lr=3e-6, weight_decay=0.01, betas=[0.9, 0.95])
    group = settings.adamw([torch.nn.Parameter(torch.zeros(1))]).param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"]) == (3e-6, 0.01, (0.9, 0.95))


@pytest.mark.parametrize("restored_first", [True, False])
def test_a_restored_plan_wins_whichever_arrives_first(restored_first):
    """Most strategies restore the checkpoint before configure_optimizers, FSDP and DeepSpeed
    after: either way the live factor follows the checkpoint's plan."""
    plan = SchedulePlan()
    stored = {"kind": "linear", "warmup": 0, "total": 4}
    if restored_first:
        plan.restore(stored)
        plan.start({"kind": "linear", "warmup": 0, "total": 4})
    else:
        plan.start({"kind": "linear", "warmup": 0, "total": 4})
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = plan.scheduler(optimizer)
    if not restored_first:
        plan.restore(stored)
    rates = []
    for _ in range(5):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_a_global_validation_batch_splits_over_the_processes():
    from lit_rag.data.datamodule import QADataModule
    from lit_rag.errors import InputError

    def per_process(world: int, **kwargs) -> int:
        dm = QADataModule(**kwargs)
        dm.trainer = SimpleNamespace(world_size=world)
        return dm.val_batch_size

    assert [per_process(n, global_val_batch_size=256) for n in (1, 4, 8)] == [256, 64, 32]
    assert per_process(4, val_batch_size=64) == 64  # per process as before
    with pytest.raises(InputError, match="global_val_batch_size 256 cannot be split over 3"):
        per_process(3, global_val_batch_size=256)
    with pytest.raises(ValueError, match="data.val_batch_size .* are both set"):
        QADataModule(val_batch_size=8, global_val_batch_size=16)


class _OtherRank:
    """A strategy whose ``reduce`` adds the values of a second rank (fixed by the test)."""

    def __init__(self, other_max: float, other_sums: list[float]):
        self.other_max, self.other_sums = other_max, other_sums

    def reduce(self, tensor, reduce_op):
        if reduce_op == "max":
            return torch.maximum(tensor, torch.tensor(self.other_max, dtype=tensor.dtype))
        assert reduce_op == "sum"
        return tensor + torch.tensor(self.other_sums, dtype=tensor.dtype)


def _two_ranks(other_max: float, other_sums: list[float]):
    """An update seen from one of two ranks (only its planning runs: no model)."""
    from lit_rag.trainer.ranks import Ranks
    from lit_rag.trainer.update import Update, UpdateSettings

    ranks = Ranks(world_size=2, strategy=_OtherRank(other_max, other_sums))
    return Update(
        UpdateSettings(), algorithm=None, model=None, reference=None, ranks=ranks, hooks=None
    )


def test_each_mini_batch_is_a_mean_over_its_tokens_on_every_rank():
    """This rank: 30 tokens in two mini-batches of 20 and 10 (scales 30/20 and 30/10); the other
    rank: 6 tokens in one. Global counts 20 + 6 = 26 and 10 + 0 = 10, so the scales of this
    rank's batch-normalized loss become 2 x 30 / 26 and 2 x 30 / 10 (DDP then halves the sum of
    the two ranks' gradients)."""
    from lit_rag.trainer.update import Plan

    batch = SimpleNamespace(normalizer=30.0)
    minis = [(torch.arange(2), 1.5), (torch.arange(2, 3), 3.0)]
    plan = Plan(batch, 3, 4, minis, [], [], steps=2)
    scales = _two_ranks(1.0, [6.0, 0.0])._global_scales(plan, declared=True)
    assert [s for _, s in scales] == pytest.approx([2 * 30 / 26, 2 * 30 / 10])


def test_an_algorithm_without_a_count_keeps_each_ranks_mean():
    from lit_rag.trainer.update import Plan

    batch = SimpleNamespace(normalizer=None)
    plan = Plan(batch, 3, 4, [(torch.arange(3), 1.0)], [], [], steps=1)
    # no rank declares a count (the max over ranks is 0): the scales stay as the algorithm set
    assert _two_ranks(0.0, [0.0])._global_scales(plan, declared=False)[0][1] == 1.0


def test_adamw_is_fused_where_every_trained_weight_is_a_float_on_cpu_or_cuda():
    """torch's fused AdamW: one kernel over the weights (the host's step under FSDP CPU offload:
    1.36 against 8.04 ns a weight, benchmarks/host_optimizer.py); not under DeepSpeed, whose
    ZeRO optimizer wraps the one it is given, nor for integer tensors."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    from lit_rag.trainer.optimizer import OptimizerSettings, fused_adamw

    weights = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert fused_adamw(weights) and fused_adamw(weights, DDPStrategy())
    assert not fused_adamw(weights, DeepSpeedStrategy())
    assert not fused_adamw([torch.zeros(2, dtype=torch.int8)])
    assert not fused_adamw([])
    optimizer = OptimizerSettings().adamw(weights, fused=True)
    assert optimizer.defaults["fused"] is True
