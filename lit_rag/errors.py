"""The one exception type for input a user can fix.

Anything raised as :class:`InputError` (a recipe value out of range, a data file that is not
text, an index folder that does not match its manifest, a checkpoint that cannot be read) is
printed by the ``lit-rag`` command as one line, ``lit-rag: error: MESSAGE``, with exit code 2 and
no traceback. The message names the file or option, what is wrong and what is allowed.
Programming errors stay ordinary exceptions and keep their tracebacks.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a recipe value, a file's contents, a command-line argument."""
