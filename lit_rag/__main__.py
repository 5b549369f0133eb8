"""``python -m lit_rag ...`` is ``lit-rag ...``."""

from lit_rag.cli.commands import main

main()
