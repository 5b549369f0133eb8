"""Built-in algorithms, registered in the ``lit_rag.algorithms`` entry-point group."""
