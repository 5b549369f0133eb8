"""Callbacks: KL monitoring and rollout logging (curriculum and weight schedules come with EVO-RAG)."""

from lit_rag.callbacks.kl_monitor import KLMonitor
from lit_rag.callbacks.sample_logger import RolloutSampleLogger

__all__ = ["KLMonitor", "RolloutSampleLogger"]
