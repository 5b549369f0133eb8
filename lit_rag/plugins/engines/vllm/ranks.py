"""A vLLM on every training rank, or on every tensor-parallel group of ranks
(docs/DESIGN.md, "Scale").

With several training processes (DDP, FSDP, DeepSpeed; one node or several, under Lightning's
launcher, torchrun or SLURM) each process builds its own ``vllm.LLM`` with vLLM's
``external_launcher`` executor: the engine and its worker run inside the training process, on
the process group the trainer already opened (TRL's colocate mode is the same shape).

- ``tensor_parallel_size`` 1: every rank samples its own prompts with its own seed
  (``seed + rank``), so no two ranks draw the same samples.
- ``tensor_parallel_size`` N: ranks form groups of N consecutive ranks (N divides the ranks of
  a node, so a group never spans nodes). vLLM shards the model over the group, and the group
  serves one stream of requests: every rank of a group must submit the same requests in the
  same order and step its engine as often as the others, or the ranks wait for each other
  forever. :func:`gather_requests` gathers each rank's new requests inside the group (TRL
  gathers its prompts with ``all_gather_object`` the same way) and every rank adds all of them,
  in rank order; vLLM's scheduling is deterministic, so every rank of the group then sees the
  same requests finish at the same step and keeps the ones it asked for. The seed is per group
  (``seed + rank // N``): the ranks of a group must sample alike.

vLLM reads ``RANK`` and ``LOCAL_RANK`` from the environment in this mode (the torchrun
convention); :func:`set_launcher_env` writes them from the trainer's placement, since
Lightning's own launcher does not set ``RANK``.
"""

from __future__ import annotations

import os

from lit_rag.api import InputError, Placement


def check_tensor_parallel(size: int, placement: Placement, config: object | None) -> None:
    """One line when ``size`` cannot shard this run: it must divide the ranks of a node (a
    group never spans nodes) and the model's attention heads (vLLM splits heads over ranks).

    Args:
        size: The engine's ``tensor_parallel_size``.
        placement: The trainer's ranks.
        config: The policy's transformers config (``num_attention_heads``,
            ``num_key_value_heads``), or None to skip the head check.
    """
    if placement.world_size > 1 and placement.local_world_size % size:
        raise InputError(
            f"engine tensor_parallel_size {size} must divide the training processes of a node "
            f"({placement.local_world_size}: trainer.devices): each group of {size} ranks shares "
            f"one vLLM; allowed: {', '.join(str(d) for d in _divisors(placement.local_world_size))}"
        )
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if size > 1 and heads and (heads % size or (kv_heads % size and size % kv_heads)):
        allowed = [
            d
            for d in _divisors(heads)
            if (kv_heads % d == 0 or d % kv_heads == 0)
            and (placement.world_size == 1 or placement.local_world_size % d == 0)
        ]
        raise InputError(
            f"engine tensor_parallel_size {size} cannot split the model's {heads} attention heads "
            f"({kv_heads} key/value heads) evenly; allowed: {', '.join(str(d) for d in allowed)}"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def set_launcher_env(placement: Placement) -> None:
    """``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` for vLLM's external
    launcher (it reads them; the process group itself is already open)."""
    os.environ["RANK"] = str(placement.rank)
    os.environ["LOCAL_RANK"] = str(placement.local_rank)
    os.environ["WORLD_SIZE"] = str(placement.world_size)
    os.environ["LOCAL_WORLD_SIZE"] = str(placement.local_world_size)


def group_seed(seed: int, placement: Placement, size: int) -> int:
    """The vLLM seed of this rank's group: one per group of ``size`` ranks.

    Example:
        >>> group_seed(42, Placement(rank=5, world_size=8), size=2)
        44
    """
    return seed + placement.rank // size


def new_group(placement: Placement, size: int):
    """This rank's tensor-parallel group of ``size`` consecutive ranks, a gloo group for the
    requests (objects on the host, whatever the training backend). A collective: every rank
    of the run calls it once, together."""
    import torch.distributed as dist

    groups = [list(range(start, start + size)) for start in range(0, placement.world_size, size)]
    group, _ = dist.new_subgroups_by_enumeration(groups, backend="gloo")
    return group


def gather_requests(group, items: list, wants: bool) -> tuple[list[list], bool]:
    """Every rank's new requests, in group rank order, and whether any rank still wants
    something (new requests or requests in flight). A collective over ``group``."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (items, wants), group=group)
    return [g[0] for g in gathered], any(g[1] for g in gathered)
