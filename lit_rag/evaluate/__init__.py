"""``lit-rag evaluate`` and ``lit-rag compare``: a model on a paper's benchmark suites, the
protocol that decides a score, the records written per model and the table printed."""
