"""Datasets: readers for every supported format, the synthetic world, and ``QADataModule``.

The readers and the synthetic world are plain Python. ``QADataModule`` and the other names from
:mod:`lit_rag.data.datamodule` need Lightning and torch, so they are imported on first use
(``lit-rag index`` reads corpora through this package and never trains).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_rag.data.readers import (
    FORMATS,
    DatasetFormatError,
    detect_format,
    example_to_record,
    read_2wiki,
    read_examples,
    read_flashrag,
    read_hotpotqa,
    read_litrag,
    read_musique,
    write_litrag,
)
from lit_rag.data.synthetic import SyntheticWorld, generate_examples

if TYPE_CHECKING:
    from lit_rag.data.datamodule import (
        QADataModule,
        ResumableLoader,
        collate_examples,
        limit_references,
    )

#: names served from :mod:`lit_rag.data.datamodule` on first access (it imports Lightning)
_DATAMODULE_NAMES = ("QADataModule", "ResumableLoader", "collate_examples", "limit_references")

__all__ = [
    "FORMATS",
    "DatasetFormatError",
    "QADataModule",
    "ResumableLoader",
    "SyntheticWorld",
    "collate_examples",
    "detect_format",
    "example_to_record",
    "generate_examples",
    "limit_references",
    "read_2wiki",
    "read_examples",
    "read_flashrag",
    "read_hotpotqa",
    "read_litrag",
    "read_musique",
    "write_litrag",
]


def __getattr__(name: str) -> Any:
    """``lit_rag.data.QADataModule`` and friends, imported on first access (PEP 562)."""
    if name in _DATAMODULE_NAMES:
        from lit_rag.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'lit_rag.data' has no attribute '{name}'")
