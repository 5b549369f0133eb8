"""Run health: the signals a step measures, the guards on what a reward scores, the detectors
of known failure patterns, and the :class:`~lit_rag.health.monitor.HealthMonitor` callback."""
