"""Datasets: readers for every supported format, the synthetic world, and ``QADataModule``."""

from lit_rag.data.datamodule import (
    QADataModule,
    ResumableLoader,
    collate_examples,
    limit_references,
)
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
