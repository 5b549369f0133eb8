"""Built-in rollout engines, registered in the ``lit_rag.engines`` entry-point group."""
