"""Deprecated: the algorithm base moved to the public plugin API; import it from :mod:`lit_rag.api`."""

import warnings

from lit_rag.api import Algorithm, LossOutput  # noqa: F401

warnings.warn("lit_rag.plugins.algorithms.base is deprecated; import from lit_rag.api", DeprecationWarning, stacklevel=2)
