"""How much memory a recipe needs per device, component by component (``lit-rag size``).

:mod:`~lit_rag.sizing.shapes` reads a model's numbers (hidden size, layers, heads, vocabulary,
parameters) from its local files or from a small table of the models the paper recipes name;
:mod:`~lit_rag.sizing.estimate` turns them and a run's settings into bytes per component and the
largest micro-batch that fits; :mod:`~lit_rag.sizing.recipe` reads those settings from a recipe.
Nothing here imports torch or loads weights.
"""
