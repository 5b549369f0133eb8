"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def shared_data() -> Path:
    """Folder of real dataset samples that ships beside the repo (``../shared/data``)."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(
            "../shared/data is absent (it ships beside the repo, not in it): "
            "reader tests on real samples skipped"
        )
    return path
