"""The files ``lit-rag evaluate`` writes per model: ``OUT/<model>/record.json`` (the metrics and
the protocol) and ``OUT/<model>/predictions_<dataset>.jsonl``, and reading them back."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lit_rag.errors import InputError, file_line, not_utf8_line
from lit_rag.evaluate.suites import SUITES
from lit_rag.files import atomic_write

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
    atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))


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
    except UnicodeDecodeError as exc:
        line, what = not_utf8_line(file, exc)
        raise InputError(
            f"evaluate: record '{file_line(path, line)}' is not UTF-8 text ({what})"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"evaluate: record '{path}' is not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("suite") not in SUITES:
        raise InputError(
            f"evaluate: '{path}' is not a lit-rag evaluate record (it needs a 'suite' of "
            f"{', '.join(SUITES)})"
        )
    if not isinstance(record.get("metrics"), dict) or not isinstance(record.get("model"), dict):
        raise InputError(f"evaluate: record '{path}' lacks its 'metrics' or 'model'")
    check_record_fields(record, path)
    return record


#: the protocol's parts the table reads, each an object (a JSON ``{...}``) or null
_PROTOCOL_PARTS = ("recipe", "retriever", "engine", "decoding", "top_k", "datasets")


def check_record_fields(record: dict, path: str | Path) -> None:
    """Fail in one line, naming the file and the field, on a field the table reads that is
    absent or of another type (a record edited by hand, or written by another tool).

    Raises:
        InputError: e.g. ``evaluate: record 'r.json': field 'metrics.nq.EM' is "high" (a
            string); a metric is a number``.
    """
    model = record["model"]
    label = "a model's label is its name: untrained, a .ckpt file or a model folder"
    _require(path, "model.label", model.get("label"), str, label)
    _optional(path, "model.parameters", model.get("parameters"), float, "a count is a number")
    base = model.get("base")
    _optional(path, "model.base", base, dict, "the base model is an object")
    if isinstance(base, dict):
        _optional(path, "model.base.path", base.get("path"), str, "a path is a string")
    for dataset, values in record["metrics"].items():
        _require(path, f"metrics.{dataset}", values, dict, "a dataset's metrics are an object")
        for title, value in values.items():
            _require(path, f"metrics.{dataset}.{title}", value, float, "a metric is a number")
    for name, kind, what in (
        ("questions", float, "a question count is a number"),
        ("absent", str, "a missing test file is a path (a string)"),
    ):
        _optional(path, name, record.get(name), dict, f"'{name}' is an object by dataset")
        for dataset, value in (record.get(name) or {}).items():
            _require(path, f"{name}.{dataset}", value, kind, what)
    protocol = record.get("protocol")
    _optional(path, "protocol", protocol, dict, "the protocol is an object")
    for part in _PROTOCOL_PARTS if isinstance(protocol, dict) else ():
        _optional(path, f"protocol.{part}", protocol.get(part), dict, "it is an object or null")
    for dataset, entry in ((protocol or {}).get("datasets") or {}).items():
        _require(path, f"protocol.datasets.{dataset}", entry, dict, "it is an object")


def _optional(path: str | Path, field: str, value: object, kind: type, what: str) -> None:
    if value is not None:
        _require(path, field, value, kind, what)


def _require(path: str | Path, field: str, value: object, kind: type, what: str) -> None:
    """``value`` is a ``kind`` (``float``: any number; never a bool), else one line that ends
    with ``what`` (what the field holds)."""
    kinds = (int, float) if kind is float else (kind,)
    if isinstance(value, kinds) and not isinstance(value, bool):
        return
    if value is None:
        raise InputError(f"evaluate: record '{path}' lacks field '{field}' ({what})")
    got = json.dumps(value)
    got = got if len(got) <= 40 else got[:37] + "..."
    raise InputError(
        f"evaluate: record '{path}': field '{field}' is {got} "
        f"(a {_JSON_TYPES.get(type(value), type(value).__name__)}); {what}"
    )


#: how a JSON value's Python type reads in an error
_JSON_TYPES = {
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    list: "list",
    dict: "object",
}


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
