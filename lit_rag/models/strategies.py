"""What the policy module does differently under each of Lightning's strategies: FSDP wraps the
policy itself, DeepSpeed's engine owns gradient accumulation and clipping, ZeRO-3 and FSDP gather
sharded weights in every forward (docs/DESIGN.md, "Scale")."""

from __future__ import annotations

import argparse
import contextlib
import copy
from collections.abc import Iterator

import torch

from lit_rag.models.precision import sharded_mixed_precision
from lit_rag.rollout.weights import is_zero3


def deepspeed_engine(strategy):
    """The DeepSpeed engine when ``strategy`` is Lightning's DeepSpeed strategy, else None.

    A step accumulates one backward pass per micro-batch before its optimizer step; ZeRO-2
    reduces gradients at each "accumulation boundary", which by default (Lightning sets
    ``gradient_accumulation_steps`` from ``accumulate_grad_batches`` = 1) is every backward and
    refuses a second gradient for the same partition. The engine is told that only the step's
    last micro-batch is the boundary (``set_gradient_accumulation_boundary``, DeepSpeed's API for
    caller-owned accumulation).
    """
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return strategy.deepspeed_engine if isinstance(strategy, DeepSpeedStrategy) else None


def deepspeed_forward_starts(engine) -> None:
    """Tell DeepSpeed's ZeRO optimizer that a forward pass starts, as ``DeepSpeedEngine.forward``
    does first (``clear_backward_seen_flag``). lit-rag runs the policy's own forward per
    micro-batch, not the engine's; without this, ZeRO-3 never counts a micro-batch
    (``micro_step_id`` stays 0) and each backward pass overwrites the gradient partitions the
    previous ones wrote: an optimizer step learned from its last micro-batch only."""
    clear = getattr(engine.optimizer, "clear_backward_seen_flag", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def outside_zero_init() -> Iterator[None]:
    """Build the policy whole even inside DeepSpeed ZeRO-3's ``zero.Init`` (Lightning opens it
    around ``configure_model``): transformers' weight initialization indexes parameters that
    ``zero.Init`` has already partitioned (``IndexError`` on the embedding's padding row), and
    the LoRA wrapping needs whole weights. ``deepspeed.initialize`` partitions the built model
    afterwards; each rank holds it whole only while it loads."""
    import sys

    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    if zero is None or zero.top_level_context is None:
        yield
        return
    zero.shutdown_init_context()
    try:
        yield
    finally:
        zero.restore_init_context()


def is_fsdp(strategy) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(strategy, FSDPStrategy)


def forward_gathers(model: torch.nn.Module) -> bool:
    """Whether a forward pass gathers sharded weights from every rank (a collective): FSDP, or
    DeepSpeed ZeRO-3's partitioned parameters (gathered module by module in its hooks, so the
    output head cannot be called outside the model's forward either)."""
    return is_sharded(model) or is_zero3(model)


def accumulates_unsynced(strategy) -> bool:
    """Whether an optimizer step's micro-batches but the last run inside ``no_sync()``.

    torch's FSDP1 cannot accumulate sharded gradients across backward passes when they are
    offloaded to the host: each pass overwrites the host gradient with its own
    (``_flat_param.py``: "Gradient accumulation outside `no_sync()` does not work with CPU
    offloading"; ``_runtime_utils._accumulate_sharded_grad`` finds no saved shard and
    ``_offload_grad`` copies over ``_cpu_grad``), so a step would learn from its last
    micro-batch only. Inside ``no_sync()`` the passes add up in the unsharded gradient on the
    device (one full gradient per rank: the price of offloading with accumulation), and the
    last pass reduces the sum. Without offload FSDP adds the reduced shards itself.
    """
    offload = getattr(strategy, "cpu_offload", None) if is_fsdp(strategy) else None
    return bool(getattr(offload, "offload_params", False))


def ddp_module(strategy) -> torch.nn.Module | None:
    """The ``DistributedDataParallel`` wrapper of a DDP run (its ``no_sync()`` defers the
    gradient all-reduce to an optimizer step's last backward pass), else ``None``."""
    from torch.nn.parallel import DistributedDataParallel

    model = getattr(strategy, "model", None) if strategy is not None else None
    return model if isinstance(model, DistributedDataParallel) else None


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def fsdp_wrap(model: torch.nn.Module, strategy) -> torch.nn.Module:
    """Shard the policy itself with FSDP (inside Lightning's ``model_sharded_context``, which
    carries the strategy's settings), one unit per decoder layer unless the strategy names its
    own ``auto_wrap_policy``.

    Lightning would otherwise wrap the whole LightningModule, so the training step would run
    inside the root unit's forward, and the step's own backward passes (one per micro-batch,
    ``manual_backward``) would fail FSDP's state checks. With the policy as the root, each
    micro-batch is an ordinary root forward and backward. ``use_orig_params`` lets frozen base
    weights and trainable LoRA adapters share units. Under ``bf16-mixed`` the units compute in
    bf16 and reduce gradients in fp32 (:func:`~lit_rag.models.precision.sharded_mixed_precision`)
    over fp32 master weights (``PolicyModule._hold_masters``).
    """
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, wrap

    from lit_rag.trainer.logprobs import _base_model

    overrides: dict = {"use_orig_params": True}
    plugin = getattr(strategy, "precision_plugin", None)
    mixed = sharded_mixed_precision(getattr(plugin, "precision", None))
    if mixed is not None and getattr(strategy, "mixed_precision", None) is None:
        overrides["mixed_precision"] = mixed  # fp32 gradient reduction (a recipe's own wins)
    base = _base_model(model)
    embeddings, head = base.get_input_embeddings(), base.get_output_embeddings()
    if (
        head is not None
        and head.weight is embeddings.weight
        and not embeddings.weight.requires_grad
    ):
        # a frozen tied embedding/head matrix (LoRA on SmolLM2, Llama-3.2, Qwen2.5-small...) in a
        # flat parameter breaks FSDP's shared-parameter views after a no-grad forward
        # (measured: "as_params=True type(prim_param)=Tensor" on torch 2.13); it stays whole
        # FSDP moves the states it manages to its device, never the ignored ones: on a GPU the
        # matrix would stay in host memory, and generate() (which puts its inputs on the device
        # of the model's first parameter, this one) would run the first layer on the CPU
        device = getattr(strategy, "root_device", None)
        if embeddings.weight.is_meta:  # built empty: one tensor for both modules, still tied
            weight = torch.empty_like(embeddings.weight, device=device or torch.device("cpu"))
            embeddings.weight = head.weight = torch.nn.Parameter(weight, requires_grad=False)
        if device is not None:
            embeddings.to(device)
        if _ranks(strategy) > 1:  # FSDP does not sync what it ignores: the first rank's, here
            import torch.distributed as dist

            dist.broadcast(embeddings.weight.data, src=0)
        overrides["ignored_states"] = [embeddings.weight]
    if _ranks(strategy) > 1:
        # the ranks but the first built the model empty (PolicyModule._loads_once): FSDP gives
        # each unit's meta tensors memory on the device and the first rank's values
        device = getattr(strategy, "root_device", None) or torch.device("cpu")
        overrides["sync_module_states"] = True
        overrides["param_init_fn"] = _Materialize(device)
    if "auto_wrap_policy" not in strategy.kwargs:
        layers = getattr(base.get_decoder(), "layers", None)
        if layers is not None and len(layers):
            overrides["auto_wrap_policy"] = ModuleWrapPolicy({type(layers[0])})
    return wrap(model, **overrides)


def _ranks(strategy) -> int:
    return int(getattr(strategy, "world_size", 1) or 1)


class _Materialize:
    """FSDP's ``param_init_fn``: memory on ``device`` for a module's own meta tensors (their
    values come from the first rank: ``sync_module_states``). A parameter two modules share (a
    tied embedding and output head) gets one tensor: ``Module.to_empty`` would give each module
    its own, and the ranks would flatten different parameter sets."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.made: dict[int, tuple[torch.Tensor, torch.nn.Parameter]] = {}

    def __call__(self, module: torch.nn.Module) -> None:
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                if id(param) not in self.made:  # the meta tensor is kept: its id stays its own
                    empty = torch.empty_like(param, device=self.device)
                    self.made[id(param)] = (param, torch.nn.Parameter(empty, param.requires_grad))
                module._parameters[name] = self.made[id(param)][1]
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=self.device)


def zero3_reference(reference: torch.nn.Module, strategy) -> torch.nn.Module:
    """The frozen reference partitioned as the policy is under DeepSpeed ZeRO-3: its own engine
    from the strategy's config without the optimizer (as TRL's ``prepare_deepspeed`` does for
    its reference model), so each rank holds a shard and every forward gathers it (a collective,
    like the policy's). The weights are partitioned as they move to the device, one at a time.
    Under any other strategy, or when already partitioned, ``reference`` as it is."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if not isinstance(strategy, DeepSpeedStrategy) or is_zero3(reference):
        return reference
    config = copy.deepcopy(strategy.config)
    if config.get("zero_optimization", {}).get("stage") != 3:
        return reference
    import deepspeed

    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    # partitioned one weight at a time as it moves to the device (a whole copy there first
    # would need the memory ZeRO-3 is there to save); the engine then moves partitions only
    deepspeed.zero.Init(module=reference, config_dict_or_path=config)
    engine, *_ = deepspeed.initialize(
        args=argparse.Namespace(device_rank=strategy.local_rank),
        model=reference,
        config=config,
        dist_init_required=False,
    )
    engine.eval()
    # the module itself: its forward hooks gather the partitions, as the policy's do; the
    # engine stays reachable through them
    return engine.module
