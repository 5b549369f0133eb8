"""The ``lit-rag`` command: the table from command to function (:mod:`lit_rag.cli.commands`),
``lit-rag fit`` on LightningCLI (:mod:`lit_rag.cli.fit`, :mod:`lit_rag.cli.recipe_args`), the
help text, the console and the process start-up (tcmalloc, the ``hf`` engine fallback); and
the commands with no package of their own: ``lit-rag export`` (:mod:`lit_rag.cli.export`) and
``lit-rag index`` (:mod:`lit_rag.cli.index`, over :mod:`lit_rag.retrieval`)."""

from lit_rag.cli.commands import entry, main

__all__ = ["entry", "main"]
