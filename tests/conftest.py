"""Shared pytest fixtures.

Factories live in ``kit.py`` (``from kit import trajectory``), subprocess scripts in
``scripts/``. Markers say what a test needs (declared in ``pyproject.toml``): ``slow`` (a real
shipped model; left out by default), ``vllm`` (the vLLM CPU build), ``multiprocess`` (several
training processes: torchrun, DDP, FSDP, DeepSpeed, devices > 1) and ``subprocess`` (the
lit-rag command in a child process); e.g. ``pytest -m "not multiprocess"``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def shared_data() -> Path:
    """Folder of real dataset samples that ships beside the repo (``../shared/data``); skipped
    where absent, an error in CI (:func:`helpers.shared_data_dir`)."""
    from helpers import shared_data_dir

    return shared_data_dir()


@pytest.fixture
def tiny_policy():
    """A tiny random Llama and its in-code tokenizer (no downloads)."""
    from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer

    config = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
    return load_model(config).eval(), load_tokenizer(config)
