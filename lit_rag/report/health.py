"""The health page of ``lit-rag report``: ``health.html`` and ``health.png`` beside ``index.html``.

Reads what :class:`lit_rag.callbacks.HealthMonitor` and the step leave in a run folder: the
health signals among the run's metrics (``health/*``, the guards ``rollout/example_copy_rate``,
``rollout/passage_copy_rate``, ``rollout/hedged_answers``, ``rollout/token_mismatch``, and the
step's own ``reward/total``, ``train/kl``, ``rollout/logprob_diff_mean``,
``rollout/truncated_fraction``, ``rollout/completion_length``), and ``health.jsonl``, one line
per detector that fired: ``{"step", "detector", "metric", "value", "line"}``.

The page plots each signal in a panel of its own (their scales differ), with a dashed line at
each mark's step on the panel of the mark's metric and on the reward panel; then a table of the
marks; then, under ``#mark-<i>``, the rollouts logged from two steps before each mark to two
after. ``health.jsonl`` is read as untrusted data: a line that is not such an object is skipped
and counted, never evaluated; everything from the run is HTML-escaped.

This module does not import :mod:`lit_rag.report.page` (which imports it): the report hands in its
rollout renderer and style sheet.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from lit_rag.health.detectors import DEFAULTS

T = TypeVar("T")

#: a metric's name -> its points, ``(step, value)`` in step order (as in :mod:`lit_rag.report.page`)
Series = dict[str, list[tuple[float, float]]]

#: the panel every mark is also drawn on
REWARD = "reward/total"
#: the reward-integrity guards' rates (``lit_rag.health.signals.guard_signals``)
GUARDS = (
    "rollout/example_copy_rate",
    "rollout/passage_copy_rate",
    "rollout/hedged_answers",
    "rollout/token_mismatch",
)
#: panel order: the reward, the step's own signals, then ``lit_rag.health.signals``'s; a detector's
#: metric or ``health/*`` column not named here follows them
ORDER = [
    REWARD,
    "train/kl",
    "rollout/logprob_diff_mean",
    "rollout/truncated_fraction",
    "rollout/completion_length",
    "health/searches_mean",
    "health/searches_std",
    "health/repeated_query_rate",
    "health/answered",
    "health/invalid_actions",
    "health/think_words",
    "health/groups_with_variance",
    "health/entropy",
    "health/non_ascii",
    "health/repeated_ngrams",
    *GUARDS,
]
#: the rollouts shown with a mark: the logged steps from ``step - AROUND`` to ``step + AROUND``
AROUND = 2
_MAX_STEP = 2**53  # a step beyond this is not a run's (and would not convert to float exactly)


@dataclass
class Mark:
    """One line of ``health.jsonl``: a detector that fired.

    Args:
        step: The training step it fired at.
        detector: The detector's name (``lit_rag.health.detectors.DEFAULTS``).
        metric: The metric it watches.
        value: The metric's value at that step (None: not logged).
        line: What it printed.
        batch: The training batch it fired at, counted from 0 as ``metrics.csv``'s ``step``
            column counts (the plots' axis); None in a file without it: ``step - 1``.
    """

    step: int
    detector: str
    metric: str
    value: float | None
    line: str
    batch: int | None = None

    @property
    def x(self) -> int:
        """Where the mark sits on the plots' step axis (``metrics.csv``'s ``step``)."""
        return self.batch if self.batch is not None else max(0, self.step - 1)


@dataclass
class HealthPage:
    """What :func:`write_health` wrote.

    Args:
        files: Files written (``health.png`` when there was a signal, ``health.html``).
        notes: Lines for the report's summary (skipped lines of ``health.jsonl``).
        link: The text of index.html's link to the page; None for a run without health
            signals or marks (it predates health monitoring).
    """

    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    link: str | None = None


def is_health_column(key: str) -> bool:
    """Whether a metric is one only a health-monitored run logs (``health/*``, the guards)."""
    return key.startswith("health/") or key in GUARDS


def health_signals(series: Series) -> Series:
    """The signals of :data:`ORDER` the run logged, in that order, then any other detector's
    metric or ``health/*`` column."""
    watched = [spec[0] for spec in DEFAULTS.values()]
    columns = sorted(k for k in series if k.startswith("health/"))
    keys = dict.fromkeys(ORDER + watched + columns)  # in order, once each
    return {k: series[k] for k in keys if series.get(k)}


# ---- reading health.jsonl ---------------------------------------------------------------------
def _value(raw: object) -> tuple[bool, float | None]:
    """``(ok, value)`` of a mark's ``value``: a number or null; anything else is not ok."""
    if raw is None:
        return True, None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return False, None
    try:
        return True, float(raw)
    except OverflowError:  # an integer too large for a float
        return False, None


def _mark(row: object) -> Mark | None:
    """The mark a parsed line holds; None when it is not a mark."""
    if not isinstance(row, dict):
        return None
    step, line = row.get("step"), row.get("line", "")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_STEP:
        return None
    names = (row.get("detector"), row.get("metric"), line)
    ok, value = _value(row.get("value"))
    if not ok or not all(isinstance(n, str) for n in names):
        return None
    batch = row.get("batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= _MAX_STEP:
        batch = None
    return Mark(step, row["detector"], row["metric"], value, line, batch)


def read_jsonl(path: Path, parse: Callable[[object], T | None]) -> tuple[list[T], int]:
    """What ``parse`` makes of each line of a JSONL file a run wrote, and how many lines were
    skipped: a line that is not JSON, or that ``parse`` turns to None, is counted, never an
    error (a run killed mid-write leaves a cut last line). A missing file has no rows."""
    if not path.is_file():
        return [], 0
    rows, skipped = [], 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for text in f:
            if not text.strip():
                continue
            try:
                row = parse(json.loads(text))
            except ValueError:  # not JSON, or a number too long to parse
                row = None
            if row is None:
                skipped += 1
            else:
                rows.append(row)
    return rows, skipped


def read_marks(path: Path) -> tuple[list[Mark], int]:
    """The marks of a ``health.jsonl`` in step order and how many lines were skipped.

    A line that is not a JSON object with an integer ``step``, string ``detector``, ``metric``
    and ``line`` and a number or null ``value`` is skipped (counted), never an error.

    Args:
        path: The ``health.jsonl`` file; a missing file has no marks.
    """
    marks, skipped = read_jsonl(path, _mark)
    return sorted(marks, key=lambda m: m.step), skipped


# ---- the plot ---------------------------------------------------------------------------------
def _draw_mark(ax, mark: Mark) -> None:
    ax.axvline(mark.x, color="tab:red", linestyle="--", linewidth=1)
    ax.text(
        mark.x,
        0.97,
        mark.detector,
        transform=ax.get_xaxis_transform(),  # x in steps, y in the panel's height
        rotation=90,
        ha="right",
        va="top",
        fontsize=7,
        color="tab:red",
    )


def plot_health(signals: Series, marks: list[Mark], path: Path) -> None:
    """One figure, a panel per signal over training steps (three columns), each mark a dashed
    line labelled with its detector on its metric's panel and on :data:`REWARD`'s; saved as
    PNG with matplotlib's object API and the Agg canvas, as :func:`lit_rag.report.page.plot_group`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    keys = list(signals)
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(12, 0.8 + 2.3 * rows), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True).flatten()
    for ax, key in zip(axes[: len(keys)], keys, strict=True):
        xs, ys = zip(*signals[key], strict=True)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_title(key, fontsize="small")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for mark in marks:
            if key in (mark.metric, REWARD):
                _draw_mark(ax, mark)
    for ax in axes[len(keys) :]:  # the grid's empty cells after the last panel
        ax.set_visible(False)
    for column in range(cols):  # the lowest shown panel of each column carries the step axis
        ax = axes[max(range(column, len(keys), cols))]
        ax.set_xlabel("step")
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle("Run health signals (dashed: a detector fired)")
    fig.tight_layout()
    fig.savefig(path, format="png")


# ---- the page ---------------------------------------------------------------------------------
def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _value_text(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _around(mark: Mark, by_step: dict[int, list[dict]]) -> list[int]:
    """The logged steps within :data:`AROUND` of the mark's."""
    return [s for s in sorted(by_step) if abs(s - mark.step) <= AROUND]


def _marks_table(marks: list[Mark], by_step: dict[int, list[dict]]) -> list[str]:
    out = [
        "<table>",
        "<tr><th>#</th><th>step</th><th>detector</th><th>metric</th><th>value</th><th>line</th>"
        "<th>rollouts</th></tr>",
    ]
    for i, mark in enumerate(marks, start=1):
        count = sum(len(by_step[s]) for s in _around(mark, by_step))
        cells = [i, mark.step, _e(mark.detector), _e(mark.metric)]
        cells += [_value_text(mark.value), _e(mark.line)]
        link = f"{count} rollout{'s' if count != 1 else ''}" if count else "none logged"
        cells.append(f'<a href="#mark-{i}">{link}</a>')
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return [*out, "</table>"]


def _around_html(
    marks: list[Mark], by_step: dict[int, list[dict]], rollout_html: Callable[[dict], str]
) -> list[str]:
    out = ["<h2>Rollouts around each mark</h2>"]
    for i, mark in enumerate(marks, start=1):
        low, high = mark.step - AROUND, mark.step + AROUND
        out.append(
            f'<section id="mark-{i}"><h3>mark {i}: step {mark.step}, {_e(mark.detector)}</h3>'
        )
        steps = _around(mark, by_step)
        if not steps:
            out.append(f'<p class="note">no rollouts logged at steps {low} to {high}</p>')
        for step in steps:
            out.append(f"<h4>step {step}</h4>")
            out += [rollout_html(row) for row in by_step[step]]
        out.append("</section>")
    return out


def _status(marks: list[Mark], columns: bool) -> str:
    if marks:
        return f"{len(marks)} detector mark{'s' if len(marks) != 1 else ''}"
    if columns:
        return "no detector fired"
    return (
        "this run predates health monitoring: its metrics hold no health/* columns and it left "
        "no health.jsonl (lit_rag.callbacks.HealthMonitor writes them)"
    )


def render_health(
    run: Path,
    plot: str | None,
    marks: list[Mark],
    rows: list[dict] | None,
    status: str,
    notes: list[str],
    style: str,
    rollout_html: Callable[[dict], str],
) -> str:
    """The health page.

    Args:
        run: The version folder (named in the title).
        plot: The signals' PNG file name; None when the run logged no signal.
        marks: The detector marks, in step order.
        rows: Rollout rows; None when the run has no ``rollouts.jsonl``.
        status: The page's first line (:func:`_status`).
        notes: Lines shown at the page's foot (skipped lines of ``health.jsonl``).
        style: The report's style sheet.
        rollout_html: The report's rendering of one rollout row (escapes everything).
    """
    by_step: dict[int, list[dict]] = {}
    for row in rows or []:
        by_step.setdefault(row["step"], []).append(row)
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>lit-rag run health: {_e(run)}</title><style>{style}</style></head><body>",
        '<p><a href="index.html">the report</a></p>',
        f"<h1>Run health: {_e(run)}</h1>",
        f"<p><b>{_e(status)}</b></p>",
        "<h2>Signals</h2>",
        f'<img src="{_e(plot)}" alt="run health signals" style="width: 100%">'
        if plot
        else '<p class="note">no health signals to plot</p>',
    ]
    if marks:
        out += ["<h2>Detector marks</h2>", *_marks_table(marks, by_step)]
        if rows is None:
            out.append('<p class="note">no rollouts.jsonl in this run: no rollouts to show</p>')
        else:
            out += _around_html(marks, by_step, rollout_html)
    out += [f'<p class="note">{_e(n)}</p>' for n in notes]
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_health(
    run: Path,
    out: Path,
    series: Series,
    rows: list[dict] | None,
    style: str,
    rollout_html: Callable[[dict], str],
) -> HealthPage:
    """Write ``health.png`` (when the run logged a signal) and ``health.html`` into ``out``.

    Args:
        run: The version folder (its ``health.jsonl`` is read).
        out: The report folder.
        series: The run's metrics.
        rows: Its rollout rows; None when it has no ``rollouts.jsonl``.
        style: The report's style sheet.
        rollout_html: The report's rendering of one rollout row.
    """
    page = HealthPage()
    marks, skipped = read_marks(run / "health.jsonl")
    if skipped:
        page.notes.append(f"{run / 'health.jsonl'}: skipped {skipped} malformed line(s)")
    signals = health_signals(series)
    png = out / "health.png"
    if signals:
        plot_health(signals, marks, png)
        page.files.append(png)
    else:
        png.unlink(missing_ok=True)  # a stale plot from an earlier report of this run
    columns = any(is_health_column(k) for k in series)
    status = _status(marks, columns)
    if marks or columns:
        page.link = f"Run health: {status}"
    plot = png.name if signals else None
    text = render_health(run, plot, marks, rows, status, page.notes, style, rollout_html)
    (out / "health.html").write_text(text, encoding="utf-8")
    page.files.append(out / "health.html")
    return page
