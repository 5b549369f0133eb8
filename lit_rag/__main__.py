"""``python -m lit_rag ...`` is ``lit-rag ...``."""

from lit_rag.cli import main

main()
