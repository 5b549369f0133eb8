"""File hashes: what a record, a manifest or a checkpoint check names a file by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """The file's SHA-256 (hex), read in 1 MiB blocks: a corpus of gigabytes is never in memory
    at once."""
    return sha256_and_lines(path, count_lines=False)[0]


def sha256_and_lines(path: str | Path, count_lines: bool = True) -> tuple[str, int]:
    """The file's SHA-256 and its line count (0 without ``count_lines``), in one read."""
    digest, lines = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            if count_lines:
                lines += chunk.count(b"\n")
    return digest.hexdigest(), lines
