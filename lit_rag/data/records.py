"""The records of a data file, checked: a JSON list or JSONL file of objects, UTF-8 text (with
or without a byte-order mark, LF or CRLF line ends). A compressed or binary file, another
encoding, invalid JSON, a record that is not an object or a string no text can hold is a
:class:`DatasetFormatError` naming the file and line (JSON list: item).

The readers of :mod:`lit_rag.data.readers` turn these records into examples.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lit_rag.errors import InputError, file_line, not_utf8_line

Record = dict[str, Any]

#: how data files are decoded: UTF-8, with or without the byte-order mark Windows editors write
ENCODING = "utf-8-sig"


class DatasetFormatError(InputError):
    """A dataset file does not have the shape its reader expects.

    The message is one line: ``"{path}:{line}: {what is wrong}"`` for JSONL files and
    ``"{path}: item {i}: {what is wrong}"`` for JSON list files (both 1-based).
    """


def check_exists(path: Path) -> None:
    """Fail when ``path`` is not a file, or not text (:func:`_check_text`)."""
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    _check_text(path)


#: leading bytes of compressed and binary files people pass by mistake -> what they are
_MAGIC = {
    b"\x1f\x8b": "gzip-compressed (gunzip it first)",
    b"BZh": "bzip2-compressed",
    b"\xfd7zXZ": "xz-compressed",
    b"PK\x03\x04": "a zip archive",
    b"\x28\xb5\x2f\xfd": "zstd-compressed",
    b"PAR1": "a Parquet file (convert it to JSONL)",
    b"\x80": "a pickle (not data lit-rag reads)",
}


def _check_text(path: Path) -> None:
    """Fail in one line when ``path`` is not UTF-8 text: compressed, binary or another encoding."""
    with path.open("rb") as handle:
        head = handle.read(8192)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            raise DatasetFormatError(
                f"{path}: the file is {what}; data files must be UTF-8 JSON or JSONL text"
            )
    if b"\x00" in head:
        raise DatasetFormatError(
            f"{path}: the file is binary (NUL bytes); data files must be UTF-8 JSON or JSONL text"
        )


def _not_utf8(path: Path, err: UnicodeDecodeError) -> DatasetFormatError:
    """``PATH:LINE: not UTF-8 text (invalid continuation byte: b'\\xe9' at byte 12 of the
    line); ...``: the line is found again in the file's bytes (text mode decodes in chunks)."""
    line, what = not_utf8_line(path, err)
    return DatasetFormatError(
        f"{file_line(path, line)}: not UTF-8 text ({what}); data files must be UTF-8 JSON or JSONL"
    )


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_surrogates(where: str, record: Any) -> None:
    """A JSON escape such as ``\\ud800`` decodes to a lone surrogate, which no tokenizer or
    log file can encode: name the field instead of failing later with a UnicodeEncodeError."""
    stack = [("", record)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                field = f" field '{key}'" if key else ""
                raise DatasetFormatError(
                    f"{where}:{field} holds a lone surrogate ({value[err.start]!r}), "
                    "which is not Unicode text; "
                    "fix or drop the row"
                ) from None
        elif isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))


def _is_json_list(path: Path) -> bool:
    """True when the first non-space character of the file is ``[``."""
    try:
        with path.open(encoding=ENCODING) as handle:
            while chunk := handle.read(4096):
                stripped = chunk.lstrip()
                if stripped:
                    return stripped[0] == "["
    except UnicodeDecodeError as err:
        raise _not_utf8(path, err) from None
    return False


def iter_records(path: str | Path) -> Iterator[tuple[str, Record]]:
    """Yield ``(location, record)`` for each record of a JSON list or JSONL file.

    ``location`` is ``"{path}:{line}"`` (JSONL) or ``"{path}: item {i}"`` (JSON list), ready to
    prefix an error message.
    """
    path = Path(path)
    check_exists(path)
    if _is_json_list(path):
        yield from _iter_json_list(path)
    else:
        yield from _iter_jsonl(path)


def _iter_json_list(path: Path) -> Iterator[tuple[str, Record]]:
    try:
        text = path.read_text(encoding=ENCODING)
        items = json.loads(text)
    except UnicodeDecodeError as err:
        raise _not_utf8(path, err) from None
    except json.JSONDecodeError as err:
        raise DatasetFormatError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(items, list):
        raise DatasetFormatError(f"{path}: expected a JSON list of objects")
    escaped = _ESCAPED_SURROGATE.search(text) is not None
    for i, item in enumerate(items, start=1):
        where = f"{path}: item {i}"
        if not isinstance(item, dict):
            raise DatasetFormatError(f"{where}: expected a JSON object, got {type(item).__name__}")
        if escaped:
            _check_surrogates(where, item)
        yield where, item


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Record]]:
    with path.open(encoding=ENCODING) as handle:  # text mode: CRLF line ends read as LF
        try:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetFormatError(
                        f"{where}: invalid JSON ({err.msg} at column {err.colno})"
                    ) from None
                if not isinstance(record, dict):
                    raise DatasetFormatError(
                        f"{where}: expected a JSON object, got {type(record).__name__}"
                    )
                if _ESCAPED_SURROGATE.search(line):  # only an escape can produce a lone surrogate
                    _check_surrogates(where, record)
                yield where, record
        except UnicodeDecodeError as err:
            raise _not_utf8(path, err) from None
