"""Built-in tools (the ``lit_rag.tools`` entry-point group)."""
