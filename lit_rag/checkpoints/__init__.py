"""Checkpoints: files a kill cannot break (:mod:`~lit_rag.checkpoints.storage`) and what a
policy checkpoint was trained on (:mod:`~lit_rag.checkpoints.provenance`)."""
