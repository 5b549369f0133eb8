"""The one exception type for input a user can fix.

Anything raised as :class:`InputError` (a recipe value out of range, a data file that is not
text, an index folder that does not match its manifest, a checkpoint that cannot be read) is
printed by the ``lit-rag`` command as one line, ``lit-rag: error: MESSAGE``, with exit code 2 and
no traceback. The message names the file or option, what is wrong and what is allowed.
Programming errors stay ordinary exceptions and keep their tracebacks.

A full disk is not input, but the user fixes it the same way (free space, or write elsewhere),
so :class:`DiskFullError` is an :class:`InputError` too.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator


class InputError(ValueError):
    """Bad user input: a recipe value, a file's contents, a command-line argument."""


class DiskFullError(InputError):
    """A file could not be written: its filesystem is full (``ENOSPC``) or the quota is spent
    (``EDQUOT``). The message names the file, the space it needs and the space free."""


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exceptions it was raised from or while handling (``__cause__``, else
    ``__context__``), e.g. a :class:`DiskFullError` under a logger's own write error raised while
    the failed run shut down."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


class CommandParser(argparse.ArgumentParser):
    """argparse for a ``lit-rag`` command whose usage errors are one :class:`InputError` line
    (``<command>: <what is wrong> (usage: ...)``), never argparse's usage text and exit.

    Args:
        command: The command's name as it starts the line (``compare``).
        usage: The usage the line ends with.
    """

    def __init__(self, command: str, usage: str, **kwargs) -> None:
        super().__init__(prog=f"lit-rag {command}", usage=usage, **kwargs)
        self.command = command

    def error(self, message: str):
        raise InputError(f"{self.command}: {message} (usage: {self.usage})")
