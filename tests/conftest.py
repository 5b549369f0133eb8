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


@pytest.fixture
def tiny_policy():
    """A tiny random Llama and its in-code tokenizer (no downloads)."""
    from lit_rag.modules.loading import ModelConfig, TinyConfig, load_model, load_tokenizer

    config = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
    return load_model(config).eval(), load_tokenizer(config)
