"""The one exception type for input a user can fix.

Anything raised as :class:`InputError` (a recipe value out of range, a data file that is not
text, an index folder that does not match its manifest, a checkpoint that cannot be read) is
printed by the ``lit-rag`` command as one line, ``lit-rag: error: MESSAGE``, with exit code 2 and
no traceback. The message names the file or option, what is wrong and what is allowed.
Programming errors stay ordinary exceptions and keep their tracebacks.

A full disk is not input, but the user fixes it the same way (free space, or write elsewhere),
so :class:`DiskFullError` is an :class:`InputError` too; so is :class:`NotWritableError`, a
folder that refuses writes (read-only, no permission).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator


class InputError(ValueError):
    """Bad user input: a recipe value, a file's contents, a command-line argument."""


class DiskFullError(InputError):
    """A file could not be written: its filesystem is full (``ENOSPC``) or the quota is spent
    (``EDQUOT``). The message names the file, the space it needs and the space free."""


class NotWritableError(InputError):
    """A file could not be written: its folder is on a read-only file system (``EROFS``) or this
    user may not write there (``EACCES``, ``EPERM``). The message names the file and why."""


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


def first_non_utf8(lines: Iterable[bytes]) -> tuple[int, str] | None:
    """The 1-based number of the first line (bytes, as a file opened ``"rb"`` yields them) that
    is not UTF-8, and what is wrong there; None when every line decodes.

    Lines may be decoded one by one: a newline byte is never inside a UTF-8 sequence. Example:
    ``(5, "invalid continuation byte: b'\\xe9' at byte 12 of the line")``.
    """
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:
            bad = line[err.start : err.start + 1]
            return number, f"{err.reason}: {bad!r} at byte {err.start + 1} of the line"
    return None


def not_utf8_line(path, err: UnicodeDecodeError) -> tuple[int | None, str]:
    """``(line, what is wrong)`` for a text file whose decoding raised ``err``: the file is read
    again as bytes, line by line, to find the line (None, with ``err``'s reason, where no line
    fails: the file changed since)."""
    try:
        with open(path, "rb") as handle:
            found = first_non_utf8(handle)
    except OSError:
        found = None
    if found is None:
        return None, f"{err.reason}: {err.object[err.start : err.start + 1]!r}"
    return found


def file_line(path, line: int | None) -> str:
    """``PATH:LINE``, or ``PATH`` without a line: how an error names a place in a file."""
    return f"{path}:{line}" if line is not None else str(path)


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
