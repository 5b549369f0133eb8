"""Built-in environments, registered in the ``lit_rag.environments`` entry-point group."""
