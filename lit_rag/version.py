"""Which code wrote a file: the release number, and the commit when lit-rag runs from a checkout.

``lit_rag.__version__`` is the release (pyproject's ``version``, the newest section of
CHANGELOG.md). Work merged after a release keeps that number until the next one, so files a run
writes (index and data manifests, evaluation records, checkpoints) record :func:`build_version`
instead: the release plus the commit of the checkout it runs from, PEP 440's local part
(``0.2.0+g1a2b3c4d5e6f``, ``.dirty`` when tracked files differ from that commit). An installed
wheel has no checkout and records the release alone.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__all__ = ["RELEASE", "build_version"]

#: the release this code belongs to; pyproject.toml and CHANGELOG.md's newest release agree
#: (tests/project/test_release.py)
RELEASE = "0.2.0"


@functools.lru_cache(maxsize=1)
def build_version() -> str:
    """The release, plus ``+g<commit>[.dirty]`` when the package is a git checkout's."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return RELEASE
    try:
        commit = _git(root, "rev-parse", "--short=12", "HEAD").strip()
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return RELEASE
    if not commit:
        return RELEASE
    return f"{RELEASE}+g{commit}" + (".dirty" if dirty else "")


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout
