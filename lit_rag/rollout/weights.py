"""The policy's weights as an inference engine loads them: ``(checkpoint name, tensor)`` pairs,
one unit at a time (docs/DESIGN.md, "Scale").

An engine that keeps its own copy of the policy (``vllm``) reloads it after every optimizer
step. :func:`checkpoint_weights` walks the policy's module tree and yields each tensor under
the name the base model's checkpoint gives it, so the engine's loader finds it:

- A sharded policy is gathered one unit at a time and never whole: an FSDP unit (one decoder
  layer, or the root's embeddings and head) with ``summon_full_params(recurse=False)``, a
  DeepSpeed ZeRO-3 module's parameters with ``GatheredParameters``. The gathered tensors live
  while the consumer reads them (a generator keeps the gather open across its ``yield``), so a
  rank holds at most one unit beyond its shard. TRL's weight sync walks FSDP units the same way
  (``_sync_fsdp1_params_to_vllm``); verl's former ``fsdp_vllm`` sharding manager gathered the
  whole state dict instead.
- LoRA adapters are merged layer by layer into a copy of the layer's base weight (peft's own
  ``get_delta_weight``, or the variant's ``merge_safe``): the policy's parameters are never
  modified, so nothing drifts by merging and unmerging.
- Under DDP or ZeRO-2 every rank already holds the whole policy: the tensors are its own.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator

import torch

#: wrapper segments that name no checkpoint tensor (FSDP, activation checkpointing, torch.compile)
_WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def strip_wrappers(name: str) -> str:
    """A parameter name without the wrapper segments of FSDP, activation checkpointing and
    ``torch.compile`` (as a full state dict names it)."""
    for wrapper in _WRAPPERS:
        name = name.replace(wrapper, "")
    return name


def is_zero3(model: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions the model's parameters (they carry a ``ds_id``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def checkpoint_name(name: str, is_peft: bool) -> str | None:
    """A parameter's name in the base model's checkpoint; ``None`` for a tensor that has none.

    Wrapper segments (FSDP, activation checkpointing, ``torch.compile``) are dropped. For a peft
    model ``base_model.model.`` is stripped and ``.base_layer`` dropped, adapter tensors
    (``lora_*``) and ``original_module`` copies have no name, and
    ``modules_to_save.<adapter>.`` is unwrapped.

    Example:
        >>> layer = "base_model.model.model.layers.0.self_attn.q_proj."
        >>> checkpoint_name(layer + "base_layer.weight", True)
        'model.layers.0.self_attn.q_proj.weight'
        >>> checkpoint_name(layer + "lora_A.default.weight", True) is None
        True
    """
    name = strip_wrappers(name)
    if not is_peft:
        return name
    parts = name.split(".")
    if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
        return None
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


def policy_path(model: torch.nn.Module) -> str:
    """The folder (or hub id) the policy's base weights were loaded from: what an engine that
    keeps its own copy starts from (for a LoRA policy, its base model's; for a GGUF file, the
    converted folder)."""
    from lit_rag.models.facts import has_adapters

    base = model.get_base_model() if has_adapters(model) else model
    base = getattr(base, "module", base)  # an FSDP / DeepSpeed wrapper
    config = getattr(base, "config", None)
    path = getattr(base, "name_or_path", "") or getattr(config, "_name_or_path", "")
    if not path:
        raise ValueError(
            "the engine needs the policy's weights on disk: set model policy path "
            "(a tiny model has none) or engine model_path"
        )
    return str(path)


def checkpoint_weights(
    model: torch.nn.Module, merge_lora: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the policy's checkpoint, gathered one unit at a time (module docstring).

    Args:
        model: The policy: a transformers model, a peft model, or either sharded by FSDP
            (``FullyShardedDataParallel``, ``use_orig_params``) or DeepSpeed ZeRO-3.
        merge_lora: Yield each LoRA layer's base weight with its adapters merged in (a copy)
            under the base checkpoint's names; False yields every tensor under its own name
            (adapters included, wrapper segments dropped): the adapter alone can then be
            picked out of a sharded policy.

    Yields:
        ``(name, tensor)``: checkpoint names (``model.layers.0.self_attn.q_proj.weight``) with
        ``merge_lora``. A tensor gathered from shards is a copy, so it outlives the gather (vLLM
        keeps a layer's tensors until the layer is complete, padded embeddings until the end); a
        tensor the rank holds whole is the parameter itself, detached.
    """
    from lit_rag.models.facts import has_adapters

    is_peft = has_adapters(model)
    for name, tensor in _walk(model, "", merge_lora and is_peft, gathered=False):
        name = checkpoint_name(name, is_peft) if merge_lora else strip_wrappers(name)
        if name is not None:
            yield name, tensor


def _walk(
    module: torch.nn.Module, prefix: str, merge: bool, gathered: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pre-order over the module tree: each module's own tensors, then its children's.
    ``gathered``: inside an FSDP unit's gather (its tensors are freed when it ends)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(module, FullyShardedDataParallel):
        # this unit's own parameters whole; nested units gather theirs when the walk gets there
        with FullyShardedDataParallel.summon_full_params(module, recurse=False, writeback=False):
            yield from _walk(module.module, prefix, merge, gathered=True)
        return
    if merge and _is_lora_layer(module):
        # ZeRO-3: base weight and adapters together; the merged weight is a copy anyway
        with _gathered(list(module.parameters())):
            yield from _merged_lora(module, prefix, gathered)
        return
    own = [(n, p) for n, p in module.named_parameters(recurse=False) if not _is_flat(p)]
    own += [
        (n, b)
        for n, b in module.named_buffers(recurse=False)
        if n not in module._non_persistent_buffers_set
    ]
    with _gathered([p for _, p in own if isinstance(p, torch.nn.Parameter)]) as zero3:
        for name, tensor in own:
            yield prefix + name, tensor.detach().clone() if gathered or zero3 else tensor.detach()
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.", merge, gathered)


def _merged_lora(
    layer: torch.nn.Module, prefix: str, gathered: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA layer's base weight (and bias) with its active adapters merged, as peft's
    ``merge(safe_merge=True)`` computes them, into copies: the layer is left as it is."""
    base = layer.get_base_layer()
    weight = base.weight.detach().clone()
    bias = base.bias.detach().clone() if getattr(base, "bias", None) is not None else None
    if not layer.merged:  # merged adapters are already in the base weight
        variants = getattr(layer, "lora_variant", {})
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            if adapter in variants:  # DoRA and other variants merge their own way
                weight = variants[adapter].merge_safe(layer, adapter, weight)
            else:
                weight += layer.get_delta_weight(adapter).to(weight.dtype)
            if bias is not None and getattr(layer, "lora_bias", {}).get(adapter, False):
                bias += (layer.lora_B[adapter].bias * layer.scaling[adapter]).to(bias.dtype)
    yield f"{prefix}base_layer.weight", weight
    if bias is not None:
        yield f"{prefix}base_layer.bias", bias
    # anything else the layer holds besides the base layer and the adapters (rare)
    for name, child in layer.named_children():
        if name != "base_layer" and not name.startswith("lora_"):
            yield from _walk(child, f"{prefix}{name}.", True, gathered)


def _is_lora_layer(module: torch.nn.Module) -> bool:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: no adapters
        return False
    return isinstance(module, LoraLayer) and hasattr(module, "get_base_layer")


def _is_flat(tensor: torch.Tensor) -> bool:
    """FSDP's flat parameter (the unit's shard storage), which names no checkpoint tensor."""
    from torch.distributed.fsdp._flat_param import FlatParameter

    return isinstance(tensor, FlatParameter)


@contextlib.contextmanager
def _gathered(params: Iterable[torch.nn.Parameter]) -> Iterator[bool]:
    """DeepSpeed ZeRO-3 partitioned parameters gathered whole for the block (read only; the
    block gets True); anything else as it is (False)."""
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        yield False
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        yield True
