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
