"""Other frameworks' environments as lit-rag data, tools and rewards (:mod:`.verifiers`)."""
