"""The contracts the plugins implement and the trainer calls: algorithm, environment (and the
episode loop of multi-turn environments), reward, the step handed to callbacks, and the typed
records each built-in environment hands the rewards and algorithms that read its trajectories.
Plugins import them through :mod:`lit_rag.api`."""
