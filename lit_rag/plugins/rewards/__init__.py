"""Built-in rewards, registered in the ``lit_rag.rewards`` entry-point group."""
