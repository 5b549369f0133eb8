"""Files a kill cannot break (:mod:`~lit_rag.files.atomic`: atomic writes, the staging files of
killed writers, fsync of a folder or a tree) and file hashes (:mod:`~lit_rag.files.hashing`).
Checkpoints, ``lit-rag data``, ``lit-rag evaluate`` and index folders write through here;
plugins reach it through :mod:`lit_rag.api`."""

from lit_rag.files.atomic import (
    TEMP_MARK,
    atomic_write,
    claim_temp,
    fsync_folder,
    fsync_tree,
    release_temp,
    remove_stale_temps,
    temp_path,
)
from lit_rag.files.hashing import sha256_and_lines, sha256_file

__all__ = [
    "TEMP_MARK",
    "atomic_write",
    "claim_temp",
    "fsync_folder",
    "fsync_tree",
    "release_temp",
    "remove_stale_temps",
    "sha256_and_lines",
    "sha256_file",
    "temp_path",
]
