"""Callbacks: run-health detectors, KL monitoring, rollout logging, R2AG's progressive forest,
EVO-RAG's curriculum, reward-weight schedule and alternating reward-model epochs, a checkpoint
on SIGTERM."""

from lit_rag.callbacks.curriculum import CurriculumCallback
from lit_rag.callbacks.forest import ProgressiveForest
from lit_rag.callbacks.header import RunHeader
from lit_rag.callbacks.kl_monitor import KLMonitor
from lit_rag.callbacks.preemption import PreemptionCheckpoint
from lit_rag.callbacks.preference_model import AlternatingRewardModel
from lit_rag.callbacks.progress import RunProgressBar
from lit_rag.callbacks.reward_schedule import RewardWeightScheduler
from lit_rag.callbacks.sample_logger import RolloutSampleLogger
from lit_rag.health.monitor import HealthMonitor

__all__ = [
    "AlternatingRewardModel",
    "CurriculumCallback",
    "HealthMonitor",
    "KLMonitor",
    "PreemptionCheckpoint",
    "ProgressiveForest",
    "RewardWeightScheduler",
    "RolloutSampleLogger",
    "RunHeader",
    "RunProgressBar",
]
