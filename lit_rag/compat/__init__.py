"""Compatibility with earlier lit-rag releases: the module paths from before the package layout
stay importable (:mod:`~lit_rag.compat.moved`)."""
