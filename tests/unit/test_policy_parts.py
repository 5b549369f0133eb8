"""The parts PolicyModule delegates to: the refill's pool draw, the optimizer settings, the
learning-rate plan a checkpoint restores."""

from types import SimpleNamespace

import pytest
import torch

from lit_rag.modules.optimizer import OptimizerSettings, SchedulePlan
from lit_rag.modules.refill import draw_from_pool
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
