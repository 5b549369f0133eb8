"""The ``vllm`` rollout engine: :class:`~lit_rag.plugins.engines.vllm.engine.VLLMEngine` (the
engine), its settings, one engine per training rank (``ranks``) and what it borrows from vLLM's
internals (``support``). Importing it never imports vLLM."""

from lit_rag.plugins.engines.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine"]
