"""Deprecated: the reward base moved to the public plugin API; import it from :mod:`lit_rag.api`."""

import warnings

from lit_rag.api import Reward  # noqa: F401

warnings.warn("lit_rag.plugins.rewards.base is deprecated; import from lit_rag.api", DeprecationWarning, stacklevel=2)
