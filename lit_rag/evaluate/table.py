"""The table ``lit-rag evaluate`` prints: a row per model, a column per dataset and metric, the
paper's published rows under ours (the closest in size first), and the notes a reader needs to
compare them (a limit, absent data, no judge, protocol differences).

The protocol lines under the table put the run's protocol beside its paper's. Each field of the
paper's :class:`~lit_rag.evaluate.suites.Setting` s is read off the record (model size, corpus
and its size, retriever and encoder, top-k, R2AG's t, max turns, decoding, answer normalization,
questions, judge) and gives one line when it is not the paper's:

    protocol differs: top-k: paper 3 [Eval-RAR Section 5.1 and the A.1 prompt], run 5
    protocol unstated: decoding: not stated in Eval-RAR (greedy is Search-R1's setting, not
        Eval-RAR's); run greedy
    protocol not compared: top-t: paper t = M/2: ... [R2AG Appendix C.2, ...]; run not recorded

and the fields that match go on one line (``protocol as published: retriever, encoder``).
For R2AG it names the Table 1 row the run's settings match (``R2AG-0.56B@8B @top-1 (Qwen3-8B)
at t = M/2``), or why none does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lit_rag.errors import InputError
from lit_rag.evaluate.protocol import protocol_differences, protocol_summary
from lit_rag.evaluate.records import UNTRAINED, short_label
from lit_rag.evaluate.suites import DATASET_TITLES, R2AG_HOPS, Metric, PublishedRow, Setting, Suite

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


# ---- the run's protocol beside its paper's -------------------------------------------------
#: a run's model matches a paper's size within this ratio (Qwen2.5-3B has 3.09B parameters)
SIZE_RATIO = 1.25


def settings_lines(suite: Suite, records: list[dict]) -> list[str]:
    """One line per paper setting the first record does not match or the paper leaves
    unstated, then one naming those it matches (the model: every record's size)."""
    settings = suite.published.settings
    run = run_values(records[0])
    run["model"] = _model_sizes(records)
    lines, same = [], []
    for key, setting in settings.items():
        shown, value = run.get(key, ("not recorded", None))
        if setting.stated is None:
            lines.append(f"protocol unstated: {setting.title}: {setting.cite}; run {shown}")
        elif setting.expect is None or value is None:
            lines.append(
                f"protocol not compared: {setting.title}: paper {setting.stated} "
                f"[{setting.cite}]; run {shown}"
            )
        elif isinstance(setting.expect, dict):
            differ = _per_dataset(setting, value)
            lines += differ
            same += [] if differ else [setting.title]
        elif _matches(key, setting, value):
            same.append(setting.title)
        else:
            lines.append(
                f"protocol differs: {setting.title}: paper {setting.stated} [{setting.cite}], "
                f"run {shown}"
            )
    return lines + ([f"protocol as published: {', '.join(same)}"] if same else [])


def _matches(key: str, setting: Setting, value: Any) -> bool:
    if key == "model":
        return all(
            any(1 / SIZE_RATIO <= v / e <= SIZE_RATIO for e in setting.expect) for v in value
        )
    if key == "encoder":
        return any(value.startswith(e) for e in setting.expect)
    return value in setting.expect


def _per_dataset(setting: Setting, value: dict[str, Any]) -> list[str]:
    """A per-dataset field (questions, t): one line over the datasets that differ."""
    expect = setting.expect
    differ = [d for d in value if d in expect and value[d] != expect[d]]
    if not differ:
        return []
    paper = ", ".join(f"{DATASET_TITLES[d]} {_show(expect[d])}" for d in differ)
    run = ", ".join(f"{DATASET_TITLES[d]} {_show(value[d])}" for d in differ)
    return [f"protocol differs: {setting.title}: paper {paper} [{setting.cite}], run {run}"]


def _show(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def run_values(record: dict) -> dict[str, tuple[str, Any]]:
    """``field -> (as shown, comparable)`` of a record's protocol; the comparable value is
    None where the record does not say."""
    p = record.get("protocol") or {}
    env = p.get("top_k") or {}
    retriever = p.get("retriever")
    out = _retrieval_values(retriever)
    k = env.get("val_top_k", env.get("top_k"))
    if k is not None:
        out["top_k"] = (str(k), k)
    turns = next((env[k] for k in ("max_turns", "t_max", "max_iterations") if k in env), None)
    if turns is not None:
        out["max_turns"] = (str(turns), turns)
    out["decoding"] = _decoding(p.get("decoding") or {})
    if p.get("answer_punctuation"):
        mode = p["answer_punctuation"]
        out["normalization"] = (f"punctuation {mode} (answer_punctuation: {mode})", mode)
    questions = record.get("questions") or {}
    out["questions"] = (str(questions), questions)
    datasets = p.get("datasets") or {}
    top_t = {d: e["val_top_t"] for d, e in datasets.items() if "val_top_t" in e}
    if top_t:
        out["top_t"] = (str(top_t), top_t)
    judge = (p.get("judge") or {}).get("model")
    out["judge"] = (judge or "none (no --judge)", judge or "none")
    return out


def _retrieval_values(retriever: dict | None) -> dict[str, tuple[str, Any]]:
    """Retriever, encoder, corpus and its size, from the record's ``protocol.retriever``."""
    if not retriever:
        return {
            "retriever": ("none", "none"),
            "encoder": ("none", "none"),
            "corpus": ("the references in the prompt", "prompt"),
        }
    parts = [retriever, *(retriever.get("parts") or [])]
    kind = (retriever.get("class") or "?").rsplit(".", 1)[-1].lower().removesuffix("retriever")
    out: dict[str, tuple[str, Any]] = {"retriever": (kind, kind)}
    encoder = next((e.get("encoder_path") for e in parts if e.get("encoder_path")), None)
    encoder = encoder or next(
        ((e.get("manifest") or {}).get("encoder") for e in parts if e.get("manifest")), None
    )
    # a sparse retriever (bm25) has no encoder
    out["encoder"] = (encoder, Path(encoder).name.lower()) if encoder else ("none", "none")
    path = next((e.get("corpus") or e.get("index") for e in parts if e.get("corpus")), None)
    path = path or retriever.get("index")
    count = next(
        ((e.get("manifest") or {}).get("passage_count") for e in parts if e.get("manifest")), None
    )
    if path:
        out["corpus"] = (path, _corpus_kind(path))
    if count is not None:
        out["corpus_size"] = (f"{count:,} passages", count)
    return out


def _corpus_kind(path: str) -> str | None:
    """``wiki18`` (the 2018 Wikipedia dump, as FlashRAG and Search-R1 name it), ``paragraphs``
    (a ``corpus.jsonl`` of the questions' own paragraphs, as ``lit-rag data`` writes), else
    None (not known from the path)."""
    name = Path(path).name.lower()
    if "wiki18" in name or "wiki-18" in name:
        return "wiki18"
    return "paragraphs" if name == "corpus.jsonl" else None


def _decoding(decoding: dict) -> tuple[str, Any]:
    temperature, top_p = decoding.get("temperature"), decoding.get("top_p", 1.0)
    if temperature is None:
        return ("not recorded", None)
    if temperature == 0:
        return ("greedy", "greedy")
    return (f"temperature {temperature}, top-p {top_p}", (temperature, top_p))


def _model_sizes(records: list[dict]) -> tuple[str, Any]:
    sizes = [r["model"].get("parameters") or 0 for r in records]
    if not any(sizes):
        return ("not recorded", None)
    shown = ", ".join(dict.fromkeys(_count(s) for s in sizes if s))
    return (shown, tuple(s / 1e9 for s in sizes if s))


def _count(parameters: float) -> str:
    """``7.62B``, ``135M`` or ``34,000 parameters``."""
    if parameters >= 1e9:
        return f"{parameters / 1e9:.3g}B"
    return f"{parameters / 1e6:.3g}M" if parameters >= 1e6 else f"{int(parameters):,} parameters"


def r2ag_row(record: dict) -> str:
    """The R2AG Table 1 row a record's settings match, or why none does: Table 1's rows are
    t = M/2 (C.2, Table A.6), at k = 1 or 2, with (R2AG) or without (R2AG_base) predicted
    queries."""
    p = record.get("protocol") or {}
    k = (p.get("top_k") or {}).get("val_top_k")
    datasets = p.get("datasets") or {}
    base = any(e.get("val_predicted_queries") is False for e in datasets.values())
    t_labels = {d: _t_label(d, e.get("val_top_t", "?")) for d, e in datasets.items()}
    ts = ", ".join(f"{DATASET_TITLES[d]} {label}" for d, label in t_labels.items())
    other = [d for d, label in t_labels.items() if not label.startswith("t = M/2")]
    if k not in (1, 2) or other:
        why = f"k = {k}" if k not in (1, 2) else f"{ts}"
        return f"R2AG row: none matches ({why}); Table 1's rows are t = M/2 at k = 1 or 2"
    name = f"R2AG-0.56B@8B{' base' if base else ''} @top-{k} (Qwen3-8B)"
    return f"R2AG row of this run: {name}, t = M/2 ({ts})"


def _t_label(dataset: str, t: int | str | None) -> str:
    """How ``t`` reads against the dataset's M (``t = M/2 = 1``); ``?``: not recorded."""
    hops = R2AG_HOPS.get(dataset)
    if t is None or t == "?":
        return "t = every branch" if t is None else "t not recorded"
    if hops is not None and 2 * t == hops:
        return f"t = M/2 = {t}"
    if hops is not None and t == hops:
        return f"t = M = {t}"
    return f"t = {t} (M = {hops})"
