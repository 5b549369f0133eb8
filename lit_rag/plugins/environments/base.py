"""Deprecated: the environment base moved to the public plugin API; import it from :mod:`lit_rag.api`."""

import warnings

from lit_rag.api import Environment, RetrievalEnvironment, chat_prompt, encode_prompts  # noqa: F401

warnings.warn("lit_rag.plugins.environments.base is deprecated; import from lit_rag.api", DeprecationWarning, stacklevel=2)
