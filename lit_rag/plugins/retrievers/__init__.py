"""Built-in retrievers, registered in the ``lit_rag.retrievers`` entry-point group."""
