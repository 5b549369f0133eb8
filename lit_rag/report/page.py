"""``lit-rag report RUN_DIR``: a training run's curves and sample rollouts as PNG plots and HTML.

    lit-rag report runs/quickstart/version_0            # writes runs/quickstart/version_0/report/
    lit-rag report runs/quickstart --out /tmp/report    # the newest version_N inside

Reads what a run leaves in its log folder: ``metrics.csv`` (Lightning's CSVLogger, the one the
recipes use) or, without it, TensorBoard event files (TensorBoardLogger; needs ``tensorboard``),
and ``rollouts.jsonl`` (:class:`lit_rag.callbacks.RolloutSampleLogger`). Writes one PNG per group
of metrics (reward components, KL, loss, lengths, step times, validation) and ``index.html``: the
plots, then the sampled rollouts step by step, with the documents the environment inserted set
apart from the policy's own text. Beside it, ``health.html`` (:mod:`lit_rag.report.health`): the
run-health signals with the step of each detector mark of ``health.jsonl``, the marks, and the
rollouts logged around each. Everything from the run is HTML-escaped (model output is
untrusted); the pages have no JavaScript and link their images by relative path.

Only the standard library at import time: matplotlib (and tensorboard, for event files) are
imported when a report is written, so ``lit-rag --help`` stays fast.
"""

from __future__ import annotations

import argparse
import csv
import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lit_rag.errors import CommandParser, InputError, file_line, not_utf8_line
from lit_rag.report.health import read_jsonl, write_health

#: a metric's name -> its points, ``(step, value)`` in step order
Series = dict[str, list[tuple[float, float]]]

#: columns of metrics.csv that are the x axis or bookkeeping, never a curve
_NOT_CURVES = {"step", "epoch", "hp_metric"}

_EVENTS_GLOB = "events.out.tfevents.*"
_INFORMATION = re.compile(r"<information>.*?(?:</information>|$)", re.DOTALL)


def _tokens(key: str) -> list[str]:
    return re.split(r"[/_.\-]", key.lower())


def _is_validation(key: str) -> bool:
    return key.startswith(("val/", "val_", "validation/"))


#: plot groups in page order: file stem, title, which keys belong. A key goes to the first group
#: of :data:`_PRECEDENCE` that takes it (``val/completion_length`` is validation, not a length;
#: ``reward/length`` is a reward)
GROUPS: list[tuple[str, str, Callable[[str], bool]]] = [
    ("rewards", "Reward components", lambda k: k.startswith("reward/")),
    ("kl", "KL", lambda k: "kl" in _tokens(k)),
    ("loss", "Training loss", lambda k: "loss" in _tokens(k)),
    ("lengths", "Lengths (tokens)", lambda k: "length" in k.lower()),
    ("timing", "Step times (s)", lambda k: k.startswith("time/") or "time" in _tokens(k)),
    ("throughput", "Update throughput", lambda k: k.startswith("perf/")),
    ("validation", "Validation", _is_validation),
]
_PRECEDENCE = ["validation", "rewards", "kl", "loss", "lengths", "timing", "throughput"]


@dataclass
class Report:
    """What :func:`write_report` read and wrote.

    Args:
        run: The version folder read.
        out: The folder written.
        files: Files written, in order.
        notes: Lines for the summary (which version, skipped groups, skipped rollout lines).
    """

    run: Path
    out: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- finding and reading a run ---------------------------------------------------------------
def _has_events(folder: Path) -> bool:
    return any(folder.rglob(_EVENTS_GLOB))


def find_run(run_dir: Path) -> tuple[Path, str]:
    """The version folder to read: ``run_dir`` itself when it holds metrics, else the newest
    ``version_N`` inside it holding ``metrics.csv`` (else TensorBoard event files).

    Args:
        run_dir: A version folder (``runs/quickstart/version_0``) or its parent.

    Returns:
        The folder and a note saying which version was picked ("" when ``run_dir`` itself).

    Raises:
        InputError: ``run_dir`` is missing, not a folder, or holds no metrics.
    """
    if not run_dir.exists():
        raise InputError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise InputError(
            f"{run_dir} is not a folder: give a run's log folder "
            f"(e.g. runs/quickstart/version_0) or its parent"
        )
    if (run_dir / "metrics.csv").is_file() or any(run_dir.glob(_EVENTS_GLOB)):
        return run_dir, ""
    versions = sorted(
        (int(m.group(1)), p)
        for p in run_dir.iterdir()
        if p.is_dir() and (m := re.fullmatch(r"version_(\d+)", p.name))
    )
    for test in (lambda p: (p / "metrics.csv").is_file(), _has_events):
        found = [p for _, p in versions if test(p)]
        if found:
            return found[-1], f"reading {found[-1]} (the newest of {len(versions)} version folders)"
    raise InputError(
        f"no metrics in {run_dir}: expected metrics.csv (CSVLogger) or "
        f"{_EVENTS_GLOB} (TensorBoardLogger) in it or in a version_N folder inside it"
    )


def _number(cell: str | None) -> float | None:
    """A finite float from a CSV cell; None for a blank cell (a key not logged in that row),
    text or NaN."""
    try:
        value = float(cell) if cell not in (None, "") else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_metrics_csv(path: Path) -> Series:
    """Every numeric column of a CSVLogger ``metrics.csv`` as points over ``step``.

    CSVLogger writes one row per ``log_metrics`` call, with a blank cell for each key that call
    did not log; blank and non-numeric cells are skipped. A row without a step takes its row
    number.

    Args:
        path: The ``metrics.csv`` file.

    Raises:
        InputError: The file is not UTF-8 text or not CSV.
    """
    series: Series = {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for i, row in enumerate(csv.DictReader(f)):
                step = _number(row.get("step"))
                x = float(i) if step is None else step
                for key, cell in row.items():
                    value = _number(cell) if isinstance(cell, str) else None
                    if key and key not in _NOT_CURVES and value is not None:
                        series.setdefault(key, []).append((x, value))
    except UnicodeDecodeError as exc:
        line, what = not_utf8_line(path, exc)
        raise InputError(f"{file_line(path, line)}: not UTF-8 text ({what})") from None
    except csv.Error as exc:
        raise InputError(f"{path} is not a CSV file: {exc}") from None
    return {k: sorted(v) for k, v in series.items()}


def read_tensorboard(folder: Path) -> Series:
    """Every scalar in the TensorBoard event files under ``folder``.

    Args:
        folder: A TensorBoardLogger version folder.

    Raises:
        InputError: tensorboard is not installed.
    """
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise InputError(
            f"{folder} holds TensorBoard event files and no metrics.csv; reading them "
            f"needs tensorboard (pip install tensorboard)"
        ) from None
    series: Series = {}
    for file in sorted(folder.rglob(_EVENTS_GLOB)):
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})  # 0: keep every point
        events.Reload()
        for tag in events.Tags().get("scalars", []):
            if tag not in _NOT_CURVES:
                points = [(float(e.step), float(e.value)) for e in events.Scalars(tag)]
                series.setdefault(tag, []).extend(p for p in points if math.isfinite(p[1]))
    return {k: sorted(v) for k, v in series.items() if v}


def _rollout_row(row: object) -> dict | None:
    step = row.get("step") if isinstance(row, dict) else None
    return row if isinstance(step, int) and not isinstance(step, bool) else None


def read_rollouts(path: Path) -> tuple[list[dict], int]:
    """The rows of a ``rollouts.jsonl`` and how many lines were skipped.

    A line that is not a JSON object with an integer ``step`` is skipped (counted), never an
    error: a run killed mid-write leaves a cut last line.

    Args:
        path: The ``rollouts.jsonl`` file; a missing file has no rows.
    """
    return read_jsonl(path, _rollout_row)


# ---- plots ------------------------------------------------------------------------------------
def group_series(series: Series) -> dict[str, Series]:
    """The metrics of each plot group in :data:`GROUPS`, each key in one group at most."""
    tests = {stem: belongs for stem, _, belongs in GROUPS}
    groups: dict[str, Series] = {stem: {} for stem, _, _ in GROUPS}
    for key, points in sorted(series.items()):
        stem = next((s for s in _PRECEDENCE if tests[s](key)), None)
        if stem is not None:
            groups[stem][key] = points
    return groups


def _scales_differ(series: Series, ratio: float = 20.0) -> bool:
    """Whether the metrics' magnitudes differ by more than ``ratio`` (a length of 40 tokens and
    an exact match of 0.25 on one axis would flatten the second)."""
    peaks = [max(abs(v) for _, v in points) for points in series.values()]
    peaks = [p for p in peaks if p > 0]
    return len(peaks) > 1 and max(peaks) > ratio * min(peaks)


def plot_group(title: str, series: Series, path: Path) -> None:
    """One figure: a labelled line per metric over training steps, saved as PNG; metrics of
    very different magnitude get a panel each (same x axis) instead of one shared axis.

    Uses matplotlib's object API with the Agg canvas (no pyplot state, no display needed).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = [{k: v} for k, v in series.items()] if _scales_differ(series) else [series]
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(8, 4.5 if rows == 1 else 2.6 * rows), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True).flatten()
    # an odd number of panels in two columns leaves the grid's last cell empty (hidden below)
    for ax, panel in zip(axes[: len(panels)], panels, strict=True):
        for key, points in panel.items():
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=key, marker="o" if len(points) < 30 else None, markersize=3)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps = {x for points in series.values() for x, _ in points}
    if len(steps) == 1:  # one validation: the point mid-axis, integer ticks around it
        axes[0].set_xlim(min(steps) - 1, min(steps) + 1)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for column in range(min(cols, len(panels))):  # the lowest shown panel of each column
        ax = axes[max(range(column, len(panels), cols))]
        ax.set_xlabel("step")
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")


# ---- HTML -------------------------------------------------------------------------------------
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(32em, 1fr)); gap: .8em; }
.plots img { width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: left; font-size: .9em; }
th { background: #f4f4f4; }
.rollout { border: 1px solid #ddd; border-radius: 4px; padding: .6em; margin: .8em 0; }
.completion { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: .85em;
              background: #fafafa; padding: .5em; }
.inserted { display: block; white-space: pre-wrap; background: #e8f0fe;
            border-left: 4px solid #3367d6; margin: .3em 0; padding: .3em .5em; color: #1a3d7c; }
.inserted::before { content: "inserted by the environment (not trained on)"; display: block;
                    font-family: system-ui, sans-serif; font-size: .8em; font-weight: bold; }
.truncated { color: #b00; font-weight: bold; }
.note { color: #666; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _e(value)


def _segments(row: dict) -> list[tuple[str, bool]]:
    """``(text, inserted)`` pieces of a row's completion: its ``segments`` when the logger wrote
    them, else ``<information>...</information>`` blocks of the text marked as inserted."""
    segments = row.get("segments")
    if (
        isinstance(segments, list)
        and segments
        and all(isinstance(s, dict) and isinstance(s.get("text"), str) for s in segments)
    ):
        return [(s["text"], bool(s.get("inserted"))) for s in segments]
    text, pieces, start = str(row.get("completion", "")), [], 0
    for match in _INFORMATION.finditer(text):
        pieces += [(text[start : match.start()], False), (match.group(0), True)]
        start = match.end()
    return [(t, inserted) for t, inserted in pieces + [(text[start:], False)] if t]


def _completion_html(row: dict) -> str:
    parts = [
        f'<span class="inserted">{_e(t)}</span>' if inserted else _e(t)
        for t, inserted in _segments(row)
    ]
    return f'<div class="completion">{"".join(parts)}</div>'


def _rollout_html(row: dict) -> str:
    """One rollout: a table of its reward and components side by side, answers, flags, text."""
    components = row.get("components") if isinstance(row.get("components"), dict) else {}
    heads = ["example", "group", "reward", *components, "truncated"]
    truncated = bool(row.get("truncated"))
    cells = [
        _e(row.get("example_id", "")),
        _e(row.get("group", "")),
        _fmt(row.get("reward", "")),
        *(_fmt(v) for v in components.values()),
        '<span class="truncated">yes</span>' if truncated else "no",
    ]
    answers = row.get("answers")
    answers = ", ".join(map(str, answers)) if isinstance(answers, list) else str(answers or "")
    out = [
        '<div class="rollout"><table>',
        "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr>",
        "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr></table>",
        f"<p><b>answers:</b> {_e(answers)}</p>",
    ]
    steps = row.get("steps")
    if isinstance(steps, list) and steps:
        actions = [
            f"{s.get('action', '?')}" + (f": {s['query']}" if s.get("query") else "")
            for s in steps
            if isinstance(s, dict)
        ]
        out.append(f"<p><b>actions:</b> {_e(' | '.join(actions))}</p>")
    if isinstance(row.get("prompt"), str):
        out.append(
            f'<details><summary>prompt</summary><div class="completion">{_e(row["prompt"])}'
            f"</div></details>"
        )
    out += [_completion_html(row), "</div>"]
    return "\n".join(out)


def _pick_steps(steps: list[int], limit: int) -> list[int]:
    """At most ``limit`` steps (0: all), evenly spaced, the first and the last included."""
    if limit <= 0 or len(steps) <= limit:
        return steps
    if limit == 1:
        return [steps[-1]]
    return sorted({steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)})


def _rollouts_html(rows: list[dict], limit: int, notes: list[str]) -> list[str]:
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    shown = _pick_steps(sorted(by_step), limit)
    out = ["<h2>Sample rollouts</h2>"]
    if len(shown) < len(by_step):
        note = (
            f"showing {len(shown)} of {len(by_step)} steps, evenly spaced "
            f"(--rollout-steps 0 shows all)"
        )
        notes.append(note)
        out.append(f'<p class="note">{_e(note)}</p>')
    for step in shown:
        out.append(f'<section id="step-{step}"><h3>step {step}</h3>')
        out += [_rollout_html(row) for row in by_step[step]]
        out.append("</section>")
    return out


def render_html(
    run: Path,
    source: str,
    plots: list[tuple[str, str]],
    rows: list[dict] | None,
    limit: int,
    notes: list[str],
    health: str | None = None,
) -> str:
    """The report page.

    Args:
        run: The version folder (named in the title).
        source: What the metrics were read from.
        plots: ``(file name, title)`` of each PNG, in order.
        rows: Rollout rows; None when the run has no ``rollouts.jsonl``.
        limit: Most steps of rollouts shown (0: all).
        notes: Summary lines (also shown on the page); a note about skipped steps is added.
        health: The text of the link to ``health.html`` at the top; None: no link.
    """
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>lit-rag report: {_e(run)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>lit-rag report: {_e(run)}</h1>",
        f'<p class="note">metrics from {_e(source)}</p>',
    ]
    if health is not None:
        out.append(f'<p><a href="health.html">{_e(health)}</a></p>')
    out.append("<h2>Training curves</h2>")
    images = [f'<img src="{_e(name)}" alt="{_e(title)}">' for name, title in plots]
    out.append(
        f'<div class="plots">{"".join(images)}</div>'
        if images
        else '<p class="note">no metrics to plot</p>'
    )
    if rows is None:
        out.append(
            '<h2>Sample rollouts</h2><p class="note">no rollouts.jsonl in this run (add '
            "lit_rag.callbacks.RolloutSampleLogger to the recipe's trainer.callbacks)</p>"
        )
    else:
        out += _rollouts_html(rows, limit, notes)
    out += [f'<p class="note">{_e(n)}</p>' for n in notes if not n.startswith("showing ")]
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ---- the command ------------------------------------------------------------------------------
def _output_folder(run: Path, out: str | Path | None) -> Path:
    folder = Path(out) if out is not None else run / "report"
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the report folder {folder}: {exc.strerror}") from None
    return folder


def build_report(
    run_dir: str | Path, out: str | Path | None = None, rollout_steps: int = 100
) -> Report:
    """Read a run folder and write its plots, ``health.html`` and ``index.html``.

    Args:
        run_dir: A version folder or its parent (the newest ``version_N`` with metrics is read).
        out: Output folder (default: ``<version folder>/report``).
        rollout_steps: Most training steps whose rollouts the page shows, evenly spaced (0: all).

    Raises:
        InputError: No such folder, no metrics in it, unreadable metrics, ``out`` is a file.
    """
    run, note = find_run(Path(run_dir))
    report = Report(run=run, out=Path(), notes=[note] if note else [])
    if (run / "metrics.csv").is_file():
        series, source = read_metrics_csv(run / "metrics.csv"), "metrics.csv"
    else:
        series, source = read_tensorboard(run), "TensorBoard event files"
    report.out = _output_folder(run, out)
    plots, titles = [], {stem: title for stem, title, _ in GROUPS}
    for stem, group in group_series(series).items():
        path = report.out / f"{stem}.png"
        if not group:
            report.notes.append(f"no {stem} metrics in {source}: {stem}.png skipped")
            path.unlink(missing_ok=True)  # a stale plot from an earlier report of this run
            continue
        plot_group(titles[stem], group, path)
        plots.append((path.name, titles[stem]))
        report.files.append(path)
    rollouts = run / "rollouts.jsonl"
    rows, skipped = read_rollouts(rollouts)
    if skipped:
        report.notes.append(f"{rollouts}: skipped {skipped} malformed line(s)")
    if not rollouts.is_file():
        report.notes.append(f"no rollouts.jsonl in {run}: the page has plots only")
    shown = rows if rollouts.is_file() else None
    health = write_health(run, report.out, series, shown, _STYLE, _rollout_html)
    report.files += health.files
    report.notes += health.notes
    page = render_html(run, source, plots, shown, rollout_steps, report.notes, health.link)
    index = report.out / "index.html"
    index.write_text(page, encoding="utf-8")
    report.files.append(index)
    return report


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a run's report (see :func:`build_report`); returns the path of ``index.html``.

    Args:
        run_dir: A version folder or its parent.
        out: Output folder (default: ``<version folder>/report``).

    Raises:
        InputError: No such folder, no metrics in it, unreadable metrics, ``out`` is a file.
    """
    return build_report(run_dir, out).files[-1]


USAGE = "lit-rag report RUN_DIR [--out DIR] [--rollout-steps N]"
#: ``lit-rag report --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = """\
Plot a run's curves and sampled rollouts as PNG files and an HTML page.

  lit-rag report runs/quickstart/version_0          writes runs/quickstart/version_0/report/
  lit-rag report runs/quickstart --out /tmp/report  the newest version_N in runs/quickstart

Reads the run's metrics.csv (or TensorBoard event files), rollouts.jsonl and health.jsonl;
writes a PNG per group of metrics (rewards, KL, loss, lengths, step times, validation),
index.html, and health.html: the run-health signals, the detectors' marks and the rollouts
around each."""


def build_parser() -> CommandParser:
    """The parser of ``lit-rag report``."""
    parser = CommandParser(
        "report",
        USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", help="a run's log folder (runs/NAME/version_N) or its parent")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default: RUN_DIR/report)"
    )
    parser.add_argument(
        "--rollout-steps",
        type=int,
        default=100,
        metavar="N",
        help="most steps whose sampled rollouts the page shows (default 100; 0: all)",
    )
    return parser


def main(argv: list[str]) -> None:
    """``lit-rag report RUN_DIR [--out DIR] [--rollout-steps N]``: write and list the files."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rollout_steps < 0:
        raise InputError(f"--rollout-steps: got {args.rollout_steps}; expected an integer >= 0")
    report = build_report(args.run_dir, args.out, args.rollout_steps)
    for note in report.notes:
        print(note)
    print(f"wrote {len(report.files)} file{'s' if len(report.files) != 1 else ''} to {report.out}:")
    for file in report.files:
        print(f"  {file.name}")
