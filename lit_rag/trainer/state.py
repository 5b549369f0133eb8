"""What a :class:`~lit_rag.trainer.policy.PolicyModule` checkpoint carries besides Lightning's
own state: every rank's RNG states (a resumed run draws as the uninterrupted one would), the
LoRA adapters alone (the base reloads from its path), the policy's settings, what it was
trained on (base weights, architecture, LoRA settings: :mod:`lit_rag.checkpoints.provenance`,
checked when it loads), the learning-rate plan, and the state of the plugins that have one
(e.g. DPO's stored pairs).

Everything is plain types and tensors, loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

import torch

from lit_rag.checkpoints.provenance import (
    check_shapes,
    check_trained_on,
    trained_on,
    unchecked_line,
)
from lit_rag.models.strategies import is_fsdp
from lit_rag.rng import restore_rng_states, rng_states
from lit_rag.rollout.weights import strip_wrappers
from lit_rag.trainer.optimizer import SchedulePlan
from lit_rag.version import build_version

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lit_rag.models.loading import ModelConfig


def save_state(
    checkpoint: dict,
    *,
    policy: ModelConfig,
    model: torch.nn.Module,
    schedule: SchedulePlan,
    plugins: dict[str, Stateful],
    world_size: int,
) -> None:
    """Add the policy's state to ``checkpoint`` (``on_save_checkpoint``): every rank's RNG states
    (``world_size`` ranks), ``model``'s LoRA adapters alone under ``policy.lora``, ``policy``'s
    settings, the lit-rag build that wrote it and what the model was trained on, ``schedule``'s
    plan and each of ``plugins``' state under its key."""
    checkpoint["rng_states"] = _all_ranks(rng_states(), world_size)
    if policy.lora is not None:
        trainable = {
            f"model.{strip_wrappers(n)}" for n, p in model.named_parameters() if p.requires_grad
        }
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if k in trainable
        }
    checkpoint["lit_rag"] = {"policy": asdict(policy), "version": build_version()}
    record = trained_on(model, policy)
    if record is not None:
        checkpoint["lit_rag"]["trained_on"] = record
    # LambdaLR's state has the step, not the plan its factor reads
    if schedule.current is not None:
        checkpoint["lit_rag"]["schedule"] = dict(schedule.current)
    for name, plugin in plugins.items():
        state = plugin.state_dict()
        if state:
            checkpoint["lit_rag"][name] = state


def load_state(
    checkpoint: dict,
    *,
    plugins: dict[str, Stateful],
    schedule: SchedulePlan,
    trainer: Trainer | None,
) -> None:
    """Restore :func:`save_state`'s additions (``on_load_checkpoint``; Lightning loads the
    weights after it): each plugin's state, the learning-rate plan and this rank's RNG states
    (``trainer``'s rank, when the checkpoint was saved by as many ranks)."""
    stored = checkpoint.get("lit_rag", {})
    for name, plugin in plugins.items():
        if stored.get(name) is not None:
            plugin.load_state_dict(stored[name])
    # before configure_optimizers (most strategies) or after (FSDP, DeepSpeed)
    if stored.get("schedule") is not None:
        schedule.restore(stored["schedule"])
    states = checkpoint.get("rng_states")
    if states:
        ranks = states.get("ranks")
        if ranks and trainer is not None and len(ranks) == trainer.world_size:
            states = ranks[trainer.global_rank]  # this rank's own, saved by the same world
        restore_rng_states(states)


def check_model(
    checkpoint: dict,
    *,
    policy: ModelConfig,
    model: torch.nn.Module,
    weights: torch.nn.Module,
    trainer: Trainer | None,
) -> None:
    """Refuse a checkpoint trained on another model than ``policy`` builds, in one line naming
    both (:func:`~lit_rag.checkpoints.provenance.check_trained_on`); one warning line for one that
    records nothing; one line for a tensor of another shape than ``weights``' (the module whose
    ``state_dict`` the checkpoint holds, ``model`` the policy in it).

    Raises:
        InputError: The checkpoint does not fit the recipe's model.
    """
    path = str(getattr(trainer, "ckpt_path", None) or "being loaded")
    stored = (checkpoint.get("lit_rag") or {}).get("trained_on")
    current = trained_on(model, policy)
    checked = check_trained_on(stored, current, path)
    if not checked and current is not None and getattr(trainer, "is_global_zero", True):
        print(f"lit-rag: {unchecked_line(path)}", file=sys.stderr, flush=True)
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = getattr(trainer, "strategy", None)
    if not is_fsdp(strategy) and not isinstance(strategy, DeepSpeedStrategy):  # not sharded
        expected = {key: value.shape for key, value in weights.state_dict().items()}
        check_shapes(expected, checkpoint.get("state_dict") or {}, path)


class Stateful(Protocol):
    """A plugin whose state the checkpoint carries."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def _all_ranks(states: dict, world: int) -> dict:
    """``states`` with every rank's beside it under ``ranks`` (rank 0 writes the file): each
    resumed rank draws as it would have."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world > 1 and distributed:
        ranks: list = [None] * world
        torch.distributed.all_gather_object(ranks, states)
        states["ranks"] = ranks
    return states
