"""What a :class:`~lit_rag.modules.policy.PolicyModule` checkpoint carries besides Lightning's
own state: every rank's RNG states (a resumed run draws as the uninterrupted one would), the
LoRA adapters alone (the base reloads from its path), the policy's settings, what it was
trained on (base weights, architecture, LoRA settings: :mod:`lit_rag.modules.provenance`,
checked when it loads), the learning-rate plan, and the state of the plugins that have one
(e.g. DPO's stored pairs).

Everything is plain types and tensors, loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import torch

from lit_rag.modules.provenance import check_shapes, check_trained_on, trained_on, unchecked_line
from lit_rag.modules.strategies import is_fsdp
from lit_rag.rng import restore_rng_states, rng_states
from lit_rag.rollout.weights import strip_wrappers


def save_state(module, checkpoint: dict) -> None:
    """Add the module's state to ``checkpoint`` (``on_save_checkpoint``)."""
    checkpoint["rng_states"] = _all_ranks(module, rng_states())
    if module.policy_config.lora is not None:
        trainable = {
            f"model.{strip_wrappers(n)}"
            for n, p in module.model.named_parameters()
            if p.requires_grad
        }
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if k in trainable
        }
    checkpoint["lit_rag"] = {"policy": asdict(module.policy_config)}
    record = trained_on(module.model, module.policy_config)
    if record is not None:
        checkpoint["lit_rag"]["trained_on"] = record
    # LambdaLR's state has the step, not the plan its factor reads
    if module.schedule_plan.current is not None:
        checkpoint["lit_rag"]["schedule"] = dict(module.schedule_plan.current)
    for name, plugin in stateful_plugins(module).items():
        state = plugin.state_dict()
        if state:
            checkpoint["lit_rag"][name] = state


def load_state(module, checkpoint: dict) -> None:
    """Restore :func:`save_state`'s additions (``on_load_checkpoint``; Lightning loads the
    weights after it), once the checkpoint is known to fit the recipe's model
    (:func:`check_model`)."""
    check_model(module, checkpoint)
    stored = checkpoint.get("lit_rag", {})
    for name, plugin in stateful_plugins(module).items():
        if stored.get(name) is not None:
            plugin.load_state_dict(stored[name])
    # before configure_optimizers (most strategies) or after (FSDP, DeepSpeed)
    if stored.get("schedule") is not None:
        module.schedule_plan.restore(stored["schedule"])
    states = checkpoint.get("rng_states")
    if states:
        ranks = states.get("ranks")
        trainer = module.trainer if module._trainer is not None else None
        if ranks and trainer is not None and len(ranks) == trainer.world_size:
            states = ranks[trainer.global_rank]  # this rank's own, saved by the same world
        restore_rng_states(states)


def check_model(module, checkpoint: dict) -> None:
    """Refuse a checkpoint trained on another model than the recipe builds, in one line naming
    both (:func:`~lit_rag.modules.provenance.check_trained_on`); one warning line for one that
    records nothing; one line for a tensor of another shape.

    Raises:
        InputError: The checkpoint does not fit the recipe's model.
    """
    trainer = module.trainer if module._trainer is not None else None
    path = str(getattr(trainer, "ckpt_path", None) or "being loaded")
    stored = (checkpoint.get("lit_rag") or {}).get("trained_on")
    current = trained_on(module.model, module.policy_config)
    checked = check_trained_on(stored, current, path)
    if not checked and current is not None and getattr(trainer, "is_global_zero", True):
        print(f"lit-rag: {unchecked_line(path)}", file=sys.stderr, flush=True)
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = getattr(trainer, "strategy", None)
    if not is_fsdp(strategy) and not isinstance(strategy, DeepSpeedStrategy):  # not sharded
        expected = {key: value.shape for key, value in module.state_dict().items()}
        check_shapes(expected, checkpoint.get("state_dict") or {}, path)


def stateful_plugins(module) -> dict:
    """The plugins whose ``state_dict`` the checkpoint carries, by checkpoint key."""
    plugins = {
        "algorithm": module.algorithm,
        "reward": module.reward,
        "environment": module.environment,
        "engine": module.engine,
    }
    if getattr(module, "workers", None) is not None:  # the policy version the workers hold
        plugins["rollout_workers"] = module.workers.workers
    return plugins


def _all_ranks(module, states: dict) -> dict:
    """``states`` with every rank's beside it under ``ranks`` (rank 0 writes the file): each
    resumed rank draws as it would have."""
    world = module.trainer.world_size if module._trainer is not None else 1
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world > 1 and distributed:
        ranks: list = [None] * world
        torch.distributed.all_gather_object(ranks, states)
        states["ranks"] = ranks
    return states
