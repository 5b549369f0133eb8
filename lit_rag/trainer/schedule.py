"""The learning-rate schedule: linear warm-up, then constant, cosine or linear decay.

The plan (kind, warm-up, length in optimizer steps) is data stored in the checkpoint
(``checkpoint["lit_rag"]["schedule"]``): ``LambdaLR`` saves its step but not the function its
factor comes from, and a run resumed with another ``max_steps`` would otherwise follow another
curve.
"""

from __future__ import annotations

import math

from lightning.pytorch.utilities import rank_zero_warn

from lit_rag.errors import InputError


def lr_factor(step: int, kind: str, warmup: int, total: int) -> float:
    """The multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Linear warm-up over ``warmup`` steps ((step + 1) / warmup), then ``constant`` 1, ``cosine``
    0.5 (1 + cos(pi p)) or ``linear`` 1 - p, with p = (step - warmup) / (total - warmup) capped
    at 1.
    """
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress


def plan_schedule(trainer, kind: str, warmup: int, mu: int, warmup_ratio: float = 0.0) -> dict:
    """The schedule's length in optimizer steps, from this run's ``max_steps`` / epochs.

    Lightning's ``global_step`` (and so ``max_steps``) counts optimizer steps under manual
    optimization; ``estimated_stepping_batches`` is min(batches x epochs, max_steps), so the
    data bound is batches x epochs x mu (``mu``: the optimizer steps per rollout batch, GRPO's
    mu x mini-batches; DPO's stored-pair mini-batches vary and cannot be known in advance) and
    ``max_steps`` caps it. ``warmup_ratio`` (verl's ``lr_warmup_steps_ratio``) makes the warm-up
    ``int(warmup_ratio x length)`` steps, as verl rounds it.

    Raises:
        InputError: a decaying schedule in a run without an end (no max_steps, max_epochs -1).
    """
    batches = trainer.estimated_stepping_batches
    if math.isinf(batches):
        if kind != "constant" or warmup_ratio:
            what = f"lr_schedule '{kind}'" if kind != "constant" else f"warmup_ratio {warmup_ratio}"
            raise InputError(
                f"model {what} needs a run of known length: "
                "set trainer.max_steps or trainer.max_epochs"
            )
        total = 1
    else:
        total = int(batches) * mu
        if trainer.max_steps != -1:
            total = min(total, trainer.max_steps)
    if warmup_ratio:
        warmup = int(warmup_ratio * total)
    return {"kind": kind, "warmup": int(warmup), "total": max(1, total)}


def keep_stored_plan(stored: dict, plan: dict) -> None:
    """Make ``plan`` (read by the live factor) the checkpoint's ``stored`` plan, in place.

    A resumed run's learning rates then equal the uninterrupted run's; a run resumed with another
    ``max_steps`` (or warm-up, or kind) is told so in one warning line and keeps the stored plan
    (after its length a cosine or linear rate stays 0).
    """
    matters = (
        ("kind", "warmup")
        if stored["kind"] == "constant" == plan["kind"]
        else ("kind", "warmup", "total")
    )
    if any(stored[key] != plan[key] for key in matters):
        ends = stored["kind"] != "constant" and plan["total"] > stored["total"]
        rank_zero_warn(
            f"resuming a {stored['kind']} learning-rate schedule "
            f"planned for {stored['total']} optimizer steps "
            f"(warm-up {stored['warmup']}); "
            f"this run's settings plan {plan['kind']}, {plan['total']} steps "
            f"(warm-up {plan['warmup']}): the schedule keeps the checkpoint's plan"
            + (f", so the rate is 0 after step {stored['total']}" if ends else "")
        )
    plan.update(stored)
