"""The files ``lit-rag evaluate`` writes per model: ``OUT/<model>/record.json`` (the metrics and
the protocol) and ``OUT/<model>/predictions_<dataset>.jsonl``, and reading them back."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lit_rag.errors import InputError
from lit_rag.suites import SUITES

#: the label of the recipe's policy before training
UNTRAINED = "untrained"


def slug(label: str) -> str:
    """A folder name for a model: ``untrained``, or its path's last parts."""
    if label == UNTRAINED:
        return label
    parts = [p for p in Path(label).parts[-4:] if p not in ("checkpoints", "/", "..", ".")]
    text = "_".join(parts[-3:]) or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)


def write_record(record: dict, out: Path) -> Path:
    """``OUT/<model>/record.json`` and one predictions file per dataset."""
    folder = out / slug(record["model"]["label"])
    folder.mkdir(parents=True, exist_ok=True)
    for dataset, rows in record.get("predictions", {}).items():
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        _write(folder / f"predictions_{dataset}.jsonl", lines)
    saved = {k: v for k, v in record.items() if k != "predictions"}
    saved["predictions"] = {d: f"predictions_{d}.jsonl" for d in record.get("predictions", {})}
    _write(folder / "record.json", json.dumps(saved, indent=2, default=str) + "\n")
    return folder / "record.json"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def read_record(path: str | Path) -> dict:
    """A record written by ``lit-rag evaluate``.

    Raises:
        InputError: Missing, not JSON, or not a record of a known suite.
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"evaluate: record '{path}' does not exist")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"evaluate: record '{path}' is not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("suite") not in SUITES:
        raise InputError(
            f"evaluate: '{path}' is not a lit-rag evaluate record (it needs a 'suite' of "
            f"{', '.join(SUITES)})"
        )
    if not isinstance(record.get("metrics"), dict) or not isinstance(record.get("model"), dict):
        raise InputError(f"evaluate: record '{path}' lacks its 'metrics' or 'model'")
    return record


def read_predictions(folder: Path, dataset: str) -> list[dict]:
    path = folder / f"predictions_{dataset}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def short_label(label: str) -> str:
    """A model's name in a table or a progress line: ``untrained``, or its path's last parts
    (run, version, file)."""
    if label == UNTRAINED:
        return label
    parts = [p for p in Path(label).parts[-4:] if p != "checkpoints"]
    return "/".join(parts[-3:])
