"""``precision: auto`` and the engines' ``dtype: native``: bf16 only where the hardware does bf16.

bf16 autocast pays off on CPUs with native bf16 (on an AMX machine bf16 matmuls ran ~3.4x faster
than fp32, and vLLM generated ~1.8x faster) and costs dearly on CPUs without it, where oneDNN
and PyTorch emulate it. Measured on a 2-core AMD EPYC (Zen 3, AVX2 only; quickstart recipe, one
step, nothing else running): the update took 638.5 s under ``bf16-mixed`` and 95.8-115.1 s under
``32-true``; vLLM's rollout 96.5 s in bfloat16 and 53.2-78.9 s in float32. Most laptop CPUs are of
that kind, so the CPU recipes ask for ``auto`` and this module decides once per process.
"""

from __future__ import annotations

import functools

import torch

#: what ``trainer.precision: auto`` becomes
NATIVE_PRECISION = "bf16-mixed"
FALLBACK_PRECISION = "32-true"


def _wants_gpu(accelerator: str | None) -> bool:
    if accelerator in ("gpu", "cuda"):
        return True
    return accelerator in (None, "auto") and torch.cuda.is_available()


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (oneDNN's own test: AVX-512 BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def has_native_bf16(accelerator: str | None = "cpu") -> bool:
    """Whether the device ``accelerator`` names (Lightning's value) runs bf16 natively."""
    if _wants_gpu(accelerator):
        try:
            return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        except (AssertionError, RuntimeError):  # no usable CUDA after all: Lightning will say so
            return False
    return cpu_has_native_bf16()


def resolve_precision(precision: object, accelerator: str | None = "cpu") -> object:
    """``auto`` -> ``bf16-mixed`` where bf16 is native, else ``32-true``; other values as given."""
    if precision != "auto":
        return precision
    return NATIVE_PRECISION if has_native_bf16(accelerator) else FALLBACK_PRECISION


def resolve_dtype(dtype: str, accelerator: str | None = "cpu") -> str:
    """An engine's ``dtype``: ``native`` -> ``bfloat16`` where bf16 is native, else ``float32``."""
    if dtype != "native":
        return dtype
    return "bfloat16" if has_native_bf16(accelerator) else "float32"


# ---- master weights ------------------------------------------------------------------------
#: the precisions that train in pure low precision: weights and optimizer states in bf16 / fp16
PURE_LOW_PRECISION = {"bf16-true": torch.bfloat16, "16-true": torch.float16}

#: the line a pure low-precision run prints once
PURE_LOW_PRECISION_LINE = (
    "trainer.precision {precision}: weights, gradients and AdamW states are held in {dtype}; an "
    "update smaller than half its spacing (about 4e-3 x |w| in bf16, a learning rate of 1e-6 "
    "moves almost no weight) is lost. bf16-mixed keeps fp32 master weights and computes in bf16"
)


def master_dtype(precision: object) -> torch.dtype:
    """The dtype the trained weights, their gradients and AdamW's states are held in.

    fp32 under every precision but the pure low ones (``bf16-true``, ``16-true``), whatever dtype
    the recipe loads the model in (``model.policy.dtype``: the frozen reference and the rollout
    engine's copy keep that one). An AdamW step moves a weight by about the learning rate: 1e-6
    at the papers' rates (R2AG, Eval-RAR), 3e-6 ARENA, 5e-6 EVO-RAG, while bf16's spacing at
    |w| = 0.02 is 2^-6 x 2^-7 = 1.2e-4: an update below half of it (6e-5) rounds to nothing.
    verl loads its actor in fp32 for this reason (computing in bf16, reducing in fp32).

    Example:
        >>> master_dtype("bf16-mixed"), master_dtype("bf16-true")
        (torch.float32, torch.bfloat16)
    """
    return PURE_LOW_PRECISION.get(str(precision), torch.float32)


def sharded_mixed_precision(precision: object):
    """FSDP's ``MixedPrecision`` for a Lightning precision: compute (the gathered parameters) in
    bf16 / fp16 under ``*-mixed``, and gradients reduced and buffers kept in fp32, as verl's FSDP
    workers do (``param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=fp32``). Lightning's own
    config reduces gradients in the compute dtype: a sum over ranks in bf16 loses the low bits
    of every rank's gradient. ``cast_forward_inputs``: every unit casts its inputs, so a module
    FSDP does not manage (a frozen tied embedding it ignores) cannot hand a layer another dtype.
    ``None`` (Lightning's config stands) for the other precisions.
    """
    compute = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    if compute is None:
        return None
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(
        param_dtype=compute,
        reduce_dtype=torch.float32,
        buffer_dtype=torch.float32,
        cast_forward_inputs=True,
    )


def hold_masters(model: torch.nn.Module, dtype: torch.dtype, every_weight: bool = False) -> int:
    """Cast ``model``'s trained floating-point weights to ``dtype`` (their master copy) in place;
    ``every_weight``: the frozen ones too (FSDP flattens a unit's weights into one tensor of one
    dtype). Quantized weights (integer storage) are left as they are. Returns how many tensors
    changed dtype."""
    changed = 0
    for param in model.parameters():
        if not param.is_floating_point() or param.dtype == dtype:
            continue
        if param.requires_grad or every_weight:
            param.data = param.data.to(dtype)
            changed += 1
    return changed
