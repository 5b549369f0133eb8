"""Callbacks: KL monitoring, rollout logging, R2AG's progressive forest (curriculum and weight
schedules come with EVO-RAG)."""

from lit_rag.callbacks.curriculum import CurriculumCallback
from lit_rag.callbacks.forest import ProgressiveForest
from lit_rag.callbacks.kl_monitor import KLMonitor
from lit_rag.callbacks.reward_schedule import RewardWeightScheduler
from lit_rag.callbacks.sample_logger import RolloutSampleLogger

__all__ = ["CurriculumCallback", "KLMonitor", "ProgressiveForest", "RewardWeightScheduler", "RolloutSampleLogger"]
