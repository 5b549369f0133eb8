"""Models: loading (local folder, GGUF, LoRA / QLoRA), the tiny random model, precision,
shared-prefix packing and its attention, activation checkpointing, and the strategies and
process groups that shard or replicate a model."""

from lit_rag.models.facts import has_adapters, resolve_path

__all__ = ["has_adapters", "resolve_path"]
