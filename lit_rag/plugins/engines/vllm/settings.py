"""The :class:`~lit_rag.plugins.engines.vllm.engine.VLLMEngine` settings a recipe can get wrong,
checked before anything loads."""

from __future__ import annotations

LORA_SYNC = ("merge", "adapter")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


def check_settings(
    lora_sync: str,
    gpu_memory_utilization: float,
    kv_cache_gib: float | None,
    sleep_level: int,
    tensor_parallel_size: int,
    logprobs_mode: str,
) -> None:
    """One line naming the bad ``engine`` setting and what is allowed."""
    if lora_sync not in LORA_SYNC:
        raise ValueError(
            f"engine lora_sync '{lora_sync}' is not known; allowed: {', '.join(LORA_SYNC)}"
        )
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(
            f"engine gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    if kv_cache_gib is not None and kv_cache_gib <= 0:
        raise ValueError(f"engine kv_cache_gib must be > 0, got {kv_cache_gib}")
    if sleep_level not in (1, 2):
        raise ValueError(f"engine sleep_level must be 1 or 2, got {sleep_level}")
    if sleep_level == 2 and lora_sync == "adapter":
        raise ValueError(
            "engine sleep_level 2 drops the base weights, which lora_sync "
            "'adapter' never pushes; use sleep_level: 1 or lora_sync: merge"
        )
    if tensor_parallel_size < 1:
        raise ValueError(f"engine tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(
            f"engine logprobs_mode '{logprobs_mode}' is not supported; "
            f"allowed: {', '.join(LOGPROBS_MODES)}"
        )
