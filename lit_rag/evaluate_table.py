"""The table ``lit-rag evaluate`` prints: a row per model, a column per dataset and metric, the
paper's published rows under ours (the closest in size first), and the notes a reader needs to
compare them (a limit, absent data, no judge, protocol differences)."""

from __future__ import annotations

import math
from pathlib import Path

from lit_rag.errors import InputError
from lit_rag.evaluate_protocol import protocol_differences, protocol_summary
from lit_rag.evaluate_published import r2ag_row, settings_lines
from lit_rag.evaluate_records import UNTRAINED, short_label
from lit_rag.suites import DATASET_TITLES, Metric, PublishedRow, Suite

DASH = "–"
#: the mark of a column that is not comparable with the paper's (a note under the table says why)
NOT_COMPARABLE = "†"

#: the table's columns after the model's: (dataset, metric), dataset by dataset
Columns = list[tuple[str, Metric]]


def render(suite: Suite, records: list[dict]) -> str:
    """The table: our rows, the paper's rows, and notes (limit, absent data, protocol)."""
    other = [r["suite"] for r in records if r["suite"] != suite.name]
    if other:
        raise InputError(
            f"evaluate: records of different suites ({suite.name}, {other[0]}) in one table"
        )
    columns = [(d, m) for d in suite.datasets for m in suite.metrics]
    titles = [
        (DATASET_TITLES[d] if len(suite.metrics) == 1 else f"{DATASET_TITLES[d]} {m.title}")
        + (NOT_COMPARABLE if d in suite.not_comparable else "")
        for d, m in columns
    ]
    if suite.average:
        titles.append("Avg")
    header = ["model", *titles]
    ours = [[_row_title(record), *_our_cells(record, suite, columns)] for record in records]
    published = suite.published
    params = max((r["model"].get("parameters", 0) for r in records), default=0)
    ordered = sorted(
        published.rows,
        key=lambda row: abs(math.log(row.params_b * 1e9) - math.log(params)) if params else 0,
    )
    theirs = [[row.name, *_published_cells(row, suite, columns)] for row in ordered]
    widths = [max(len(r[i]) for r in [header, *ours, *theirs]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    metric_names = "/".join(m.title for m in suite.metrics)
    out = [f"suite {suite.name}: {suite.description} ({metric_names})", ""]
    out += [line(header), *(line(r) for r in ours)]
    out += ["", f"published: {published.citation}: {published.protocol}"]
    out += [line(r) for r in theirs]
    out += [""] + notes(suite, records)
    return "\n".join(out)


def _our_cells(record: dict, suite: Suite, columns: Columns) -> list[str]:
    """A record's row: each (dataset, metric) column ('absent' without the dataset, a dash
    without the metric), then the average when the suite shows one."""
    cells = []
    for dataset, metric in columns:
        values = record["metrics"].get(dataset)
        if values is None:
            cells.append("absent")
        elif metric.title in values:
            cells.append(_number(values[metric.title], metric.title))
        else:
            cells.append(DASH)
    if suite.average:
        cells.append(_average(record, suite))
    return cells


def _published_cells(row: PublishedRow, suite: Suite, columns: Columns) -> list[str]:
    """A published row: each column (a dash where the paper gives none), then the average over
    every dataset when the suite shows one (a dash when one is missing)."""
    cells = [
        DASH if row.values.get((d, m.title)) is None else _number(row.values[(d, m.title)], m.title)
        for d, m in columns
    ]
    if suite.average:
        values = [row.values.get((d, suite.metrics[0].title)) for d in suite.datasets]
        have = [v for v in values if v is not None]
        cells.append(DASH if len(have) < len(values) else f"{sum(have) / len(have):.3f}")
    return cells


def notes(suite: Suite, records: list[dict]) -> list[str]:
    """What a reader must know to compare the rows: limits, absent data, protocol."""
    lines = []
    limits = sorted(
        {
            d.get("limit")
            for r in records
            for d in r.get("protocol", {}).get("datasets", {}).values()
            if d.get("limit")
        }
    )
    if limits:
        counts = ", ".join(
            f"{DATASET_TITLES[d]} {n}" for d, n in records[0].get("questions", {}).items()
        )
        lines.append(
            f"cut: the first {'/'.join(map(str, limits))} questions of each dataset (--limit; "
            f"scored: {counts}); the published rows score {published_questions(suite)}"
        )
    absent = sorted({d for r in records for d in r.get("absent", {})})
    if absent:
        paths = records[0].get("absent", {})
        lines.append(
            f"absent: {', '.join(DATASET_TITLES[d] for d in absent)} "
            f"(no {', '.join(paths.get(d, d) for d in absent)}): "
            f"write them with lit-rag data {suite.paper} (lit-rag data --list names the sources)"
        )
    if any(m.judge for m in suite.metrics) and not any(
        "LJ" in v for r in records for v in r["metrics"].values()
    ):
        lines.append(
            f"{DASH} under LJ: no judge; name one with --judge URL --judge-model NAME "
            "(any OpenAI-compatible endpoint, e.g. a local vllm serve)"
        )
    lines += [
        f"{NOT_COMPARABLE} {DATASET_TITLES[d]}: not comparable with the paper's column: {why}"
        for d, why in suite.not_comparable.items()
    ]
    if records:
        lines.append("this run: " + protocol_summary(records[0]))
        lines += settings_lines(suite, records)
    if suite.name == "r2ag":
        lines += [_labelled(r, r2ag_row(r), len(records)) for r in records]
    lines += protocol_differences(records) if len(records) > 1 else []
    return lines


def _labelled(record: dict, line: str, count: int) -> str:
    return f"{_row_title(record)}: {line}" if count > 1 else line


def published_questions(suite: Suite) -> str:
    questions = suite.published.settings.get("questions")
    return questions.stated if questions and questions.stated else "the paper's splits"


def _average(record: dict, suite: Suite) -> str:
    title = suite.metrics[0].title
    values = [record["metrics"].get(d, {}).get(title) for d in suite.datasets]
    have = [v for v in values if v is not None]
    if not have:
        return DASH
    mean = f"{sum(have) / len(have):.3f}"
    return mean if len(have) == len(values) else f"{mean} ({len(have)}/{len(values)})"


def _number(value: float, title: str) -> str:
    return f"{value:.2f}" if title == "K" else f"{value:.3f}"


def _row_title(record: dict) -> str:
    """``untrained (<base model file>)`` or the checkpoint's / folder's last path parts."""
    model = record["model"]
    if model["label"] != UNTRAINED:
        return short_label(model["label"])
    base = model.get("base", {})
    name = Path(base["path"]).name if base.get("path") else "tiny random"
    return f"untrained ({name})"
