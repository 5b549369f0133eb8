"""``lit-rag report RUN_DIR``: a run's curves, rollouts and health as PNG plots and HTML pages."""
