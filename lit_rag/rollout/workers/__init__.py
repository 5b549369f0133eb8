"""Rollout in worker processes: the pool of processes (:mod:`~lit_rag.rollout.workers.pool`),
the process itself (:mod:`~lit_rag.rollout.workers.process`), how weights reach it
(:mod:`~lit_rag.rollout.workers.transport`) and what the trainer asks of it, step by step
(:mod:`~lit_rag.rollout.workers.scheduler`)."""
