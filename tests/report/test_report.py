"""``lit-rag report``: plots and HTML from a run folder written by Lightning's real CSVLogger,
one-line errors, the ``segments`` RolloutSampleLogger writes for multi-turn episodes, and the
health page (the health signals, ``health.jsonl``'s marks and the rollouts around each)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import one_line_error
from PIL import Image

from lit_rag.callbacks import RolloutSampleLogger
from lit_rag.cli.commands import main
from lit_rag.contracts.step import StepOutput
from lit_rag.models.tiny import build_tiny_tokenizer
from lit_rag.report.health import GUARDS, read_marks
from lit_rag.report.page import build_report, group_series, read_metrics_csv, write_report
from lit_rag.types import Example, RewardBreakdown, Trajectory

PLOTS = ["rewards.png", "kl.png", "loss.png", "lengths.png", "timing.png", "validation.png"]
DOC = "Doc 1(Title: Orbel Mills) founded by <b>Mira Tolvan</b>"


def log_run(save_dir: Path, steps: int = 4, validation: bool = True) -> Path:
    """A metrics.csv as a policy run writes it, through Lightning's own CSVLogger: one
    ``log_metrics`` call per training step, one for validation at the last step (so each row
    has blank cells for the other call's keys), a NaN at step 1."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(save_dir), name="run")
    for step in range(steps):
        logger.log_metrics(
            {
                "reward/total": 0.1 * step,
                "reward/format": 0.2 * step,
                "reward/accuracy": 0.05 * step,
                "train/loss": 1.0 - 0.1 * step,
                "train/kl": math.nan if step == 1 else 0.01 * step,
                "kl/global_mean": 0.01 * step,
                "rollout/completion_length": 40.0 + step,
                "time/rollout_s": 2.0,
                "time/update_s": 1.5,
                "epoch": 0.0,
            },
            step=step,
        )
    if validation:
        logger.log_metrics(
            {
                "val/em": 0.25,
                "val/f1": 0.4,
                "val/reward/total": 0.3,
                "val/completion_length": 30.0,
                "epoch": 0.0,
            },
            step=steps - 1,
        )
    logger.save()
    logger.finalize("success")
    return Path(logger.log_dir)


def rollout_rows() -> list[dict]:
    """Step 1: a single-turn row whose completion carries a <script>; step 2: a multi-turn row
    with segments (an inserted document holding HTML) and a row in the old format (no
    segments, an <information> block in the text)."""
    return [
        {
            "step": 1,
            "example_id": "q1",
            "group": 0,
            "completion": "<script>alert(1)</script> Kessa",
            "answers": ["Kessa"],
            "truncated": True,
            "reward": 0.75,
            "components": {"format": 0.5, "accuracy": 0.25},
        },
        {
            "step": 2,
            "example_id": "q2",
            "group": 1,
            "completion": "<search>Orbel Mills</search>" + DOC + "<answer>Mira</answer>",
            "answers": ["Mira Tolvan"],
            "truncated": False,
            "reward": 1.0,
            "components": {"format": 1.0, "accuracy": 0.0},
            "steps": [{"action": "search", "query": "Orbel Mills", "passage_ids": ["p1"]}],
            "segments": [
                {"text": "<search>Orbel Mills</search>", "inserted": False},
                {"text": DOC, "inserted": True},
                {"text": "<answer>Mira</answer>", "inserted": False},
            ],
        },
        {
            "step": 2,
            "example_id": "q3",
            "group": 2,
            "completion": "<search>x</search><information>old doc</information><answer>y</answer>",
            "answers": ["y"],
            "truncated": False,
            "reward": 0.0,
            "components": {"format": 0.0},
        },
    ]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A version folder: metrics.csv, and rollouts.jsonl with two malformed lines."""
    folder = log_run(tmp_path / "runs")
    lines = [json.dumps(r) for r in rollout_rows()]
    lines.insert(1, '{"step": 1, "completion": "cut mid-wri')  # a run killed mid-write
    lines.insert(2, "[1, 2]")  # JSON, not an object
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_csv_blank_and_nan_cells_are_skipped(run: Path) -> None:
    series = read_metrics_csv(run / "metrics.csv")
    assert [x for x, _ in series["reward/total"]] == [0, 1, 2, 3]
    assert series["train/kl"] == [(0, 0.0), (2, 0.02), (3, pytest.approx(0.03))]  # step 1: NaN
    assert series["val/em"] == [(3, 0.25)]  # the validation row only; training rows are blank
    assert "epoch" not in series and "step" not in series


def test_each_metric_in_one_group(run: Path) -> None:
    groups = group_series(read_metrics_csv(run / "metrics.csv"))
    assert sorted(groups["rewards"]) == ["reward/accuracy", "reward/format", "reward/total"]
    assert sorted(groups["kl"]) == ["kl/global_mean", "train/kl"]
    assert sorted(groups["loss"]) == ["train/loss"]
    assert sorted(groups["lengths"]) == ["rollout/completion_length"]  # not val/completion_length
    assert sorted(groups["timing"]) == ["time/rollout_s", "time/update_s"]
    assert sorted(groups["validation"]) == [
        "val/completion_length",
        "val/em",
        "val/f1",
        "val/reward/total",
    ]


def test_report_writes_valid_pngs_and_page(run: Path) -> None:
    index = write_report(run.parent)  # the parent: the newest version_N is read
    assert index == run / "report" / "index.html"
    for name in PLOTS:
        with Image.open(run / "report" / name) as image:
            assert image.format == "PNG" and image.size[0] == 800 and image.size[1] >= 450
            image.verify()
    page = index.read_text(encoding="utf-8")
    for name in PLOTS:
        assert f'<img src="{name}"' in page
    assert (
        page.count('<section id="step-') == 2
        and "<h3>step 1</h3>" in page
        and "<h3>step 2</h3>" in page
    )
    for example in ("q1", "q2", "q3"):
        assert f"<td>{example}</td>" in page


def test_page_escapes_model_output(run: Path) -> None:
    page = write_report(run).read_text(encoding="utf-8")
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; Kessa" in page
    assert "<b>Mira" not in page  # markup inside an inserted document is text too


def test_page_marks_inserted_documents_and_shows_components(run: Path) -> None:
    page = write_report(run).read_text(encoding="utf-8")
    doc = DOC.replace("<", "&lt;").replace(">", "&gt;")
    assert (
        f'&lt;search&gt;Orbel Mills&lt;/search&gt;<span class="inserted">{doc}</span>&lt;answer&gt;'
        in page
    )
    # the old format: the <information> block of the text is marked the same way
    assert '<span class="inserted">&lt;information&gt;old doc&lt;/information&gt;</span>' in page
    # q1's reward and components side by side, its truncated flag and answers
    assert (
        "<tr><th>example</th><th>group</th><th>reward</th><th>format</th><th>accuracy</th>"
        "<th>truncated</th></tr>"
    ) in page
    assert (
        "<tr><td>q1</td><td>0</td><td>0.75</td><td>0.5</td><td>0.25</td>"
        '<td><span class="truncated">yes</span></td></tr>'
    ) in page
    assert "<b>answers:</b> Mira Tolvan" in page and "search: Orbel Mills" in page


def test_cli_summary_counts_malformed_lines(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "elsewhere"
    main(["report", str(run), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "skipped 2 malformed line(s)" in printed
    assert f"wrote 9 files to {out}:" in printed and "  index.html" in printed
    # health.png: reward/total, train/kl and rollout/completion_length are health signals too
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*PLOTS, "health.png", "health.html", "index.html"]
    )


def test_group_without_metrics_is_skipped_and_said(tmp_path: Path, capsys) -> None:
    folder = log_run(tmp_path / "runs", validation=False)
    main(["report", str(folder)])
    printed = capsys.readouterr().out
    assert "no validation metrics in metrics.csv: validation.png skipped" in printed
    assert "no rollouts.jsonl" in printed
    assert not (folder / "report" / "validation.png").exists()
    assert (folder / "report" / "rewards.png").is_file()


def test_newest_version_with_metrics_is_read(tmp_path: Path, capsys) -> None:
    for _ in range(3):
        log_run(tmp_path / "runs")  # version_0, version_1, version_2
    (tmp_path / "runs" / "run" / "version_3").mkdir()  # a run that logged nothing yet
    main(["report", str(tmp_path / "runs" / "run")])
    printed = capsys.readouterr().out
    newest = tmp_path / "runs" / "run" / "version_2"
    assert f"reading {newest} (the newest of 4 version folders)" in printed
    assert (tmp_path / "runs" / "run" / "version_2" / "report" / "index.html").is_file()


def test_rollout_steps_are_thinned_evenly(tmp_path: Path) -> None:
    folder = log_run(tmp_path / "runs")
    rows = [{"step": s, "completion": f"c{s}"} for s in range(10)]
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(folder, rollout_steps=4)
    page = (report.out / "index.html").read_text()
    # 4 of steps 0..9, evenly: indices round(i * 9 / 3) = 0, 3, 6, 9
    assert [s for s in range(10) if f'id="step-{s}"' in page] == [0, 3, 6, 9]
    assert "showing 4 of 10 steps" in page


def test_bad_input_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    assert "does not exist" in one_line_error(["report", str(tmp_path / "nope")], capsys)
    empty = tmp_path / "empty"
    (empty / "version_0").mkdir(parents=True)
    line = one_line_error(["report", str(empty)], capsys)
    assert "no metrics in" in line and "metrics.csv" in line
    (tmp_path / "file.txt").write_text("x")
    assert "is not a folder" in one_line_error(["report", str(tmp_path / "file.txt")], capsys)
    assert "usage: lit-rag report RUN_DIR" in one_line_error(["report"], capsys)
    assert "--rollout-steps" in one_line_error(
        ["report", str(empty), "--rollout-steps", "x"], capsys
    )
    (empty / "version_0" / "metrics.csv").write_bytes(b"step,reward/total\n0,\xff\n")
    assert "metrics.csv:2: not UTF-8 text" in one_line_error(["report", str(empty)], capsys)


def test_tensorboard_files_without_tensorboard_is_one_line(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    (tmp_path / "events.out.tfevents.1.host.0").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    line = one_line_error(["report", str(tmp_path)], capsys)
    assert "needs tensorboard (pip install tensorboard)" in line


# ---- RolloutSampleLogger segments --------------------------------------------------------------
def test_sample_logger_writes_segments_for_inserted_tokens(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer()
    pieces = [
        ("<search>Who founded the company?</search>", 1),
        ("\n\n<information>Doc 1(Title: Orbel Mills) founded by Mira</information>\n\n", 0),
        ("<answer>Mira</answer>", 1),
    ]
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text, _ in pieces]
    completion = torch.tensor([i for part in ids for i in part])
    mask = torch.tensor([m for part, (_, m) in zip(ids, pieces, strict=True) for _ in part])
    example = Example(id="q", question="?", answers=["Mira"])
    multi = Trajectory(
        example,
        0,
        torch.tensor([1]),
        completion,
        mask,
        torch.zeros(len(completion)),
        text=tok.decode(completion),
    )
    single = Trajectory(
        example,
        0,
        torch.tensor([1]),
        completion,
        torch.ones(len(completion)),
        torch.zeros(len(completion)),
        text=tok.decode(completion),
    )
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0]))
    trainer = SimpleNamespace(
        is_global_zero=True, global_step=3, log_dir=str(tmp_path), default_root_dir=str(tmp_path)
    )
    RolloutSampleLogger().on_train_batch_end(
        trainer,
        SimpleNamespace(tokenizer=tok),
        StepOutput([multi, single], rewards).as_outputs(),
        None,
        0,
    )
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    segments = rows[0]["segments"]
    assert [s["inserted"] for s in segments] == [False, True, False]
    assert [s["text"] for s in segments] == [text for text, _ in pieces]
    assert "".join(s["text"] for s in segments) == tok.decode(completion, skip_special_tokens=True)
    assert "segments" not in rows[1]  # every token the policy's: the row stays as it was


def test_every_column_shows_its_step_axis(tmp_path: Path, monkeypatch) -> None:
    """Three panels in two columns: the right column ends one row early, and its lowest panel
    still carries the step labels (not only the hidden cell below it)."""
    from matplotlib.figure import Figure

    from lit_rag.report.page import plot_group

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    series = {"a": [(0, 1.0), (1, 2.0)], "b": [(0, 100.0), (1, 300.0)], "c": [(0, 1e4), (1, 3e4)]}
    plot_group("three scales", series, tmp_path / "x.png")
    (fig,) = figures
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 3
    labelled = {ax.get_subplotspec().colspan.start for ax in shown if ax.get_xlabel() == "step"}
    assert labelled == {0, 1}
    for ax in shown:
        if ax.get_xlabel() == "step":
            assert ax.xaxis.get_tick_params()["labelbottom"]


# ---- the health page ---------------------------------------------------------------------------
HEALTH_LINE = "reward collapse: the moving reward fell <script>alert(2)</script>"


def log_health_run(save_dir: Path, steps: int = 10) -> Path:
    """A metrics.csv with the health columns a HealthMonitor run logs, through CSVLogger."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(save_dir), name="run")
    for step in range(steps):
        metrics = {
            "reward/total": 0.5 if step < 3 else 0.05,
            "train/kl": 0.01 * step,
            "rollout/completion_length": 40.0 + step,
            "rollout/truncated_fraction": 0.1,
            "health/entropy": 1.2 if step < 8 else 0.1,
            "health/groups_with_variance": 0.75,
            "health/think_words": 20.0,
            "health/repeated_ngrams": 0.05,
        }
        metrics.update({guard: 0.0 for guard in GUARDS})
        logger.log_metrics(metrics, step=step)
    logger.save()
    logger.finalize("success")
    return Path(logger.log_dir)


@pytest.fixture
def health_run(tmp_path: Path) -> Path:
    """Health columns; two marks (steps 3 and 8) and two malformed lines in health.jsonl;
    rollouts logged at steps 0, 2, 4 and 8, example ``q<step>``."""
    folder = log_health_run(tmp_path / "runs")
    marks = [
        {"step": 3, "batch": 2, "detector": "reward_collapse", "metric": "reward/total"},
        {"step": 8, "detector": "entropy_collapse", "metric": "health/entropy", "value": None},
    ]
    marks[0]["line"], marks[1]["line"] = HEALTH_LINE, "entropy collapse (health/entropy 0.1)"
    marks[0]["value"] = 0.05
    lines = [json.dumps(m) for m in marks]
    lines.insert(1, '{"step": "5", "detector": "x", "metric": "y", "value": 1, "line": ""}')
    lines.append('{"step": 9, "detector": "trunc')  # a run killed mid-write
    (folder / "health.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = [{"step": s, "example_id": f"q{s}", "completion": f"c{s}"} for s in (0, 2, 4, 8)]
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _section(page: str, anchor: str) -> str:
    return page.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def test_health_page_lists_marks_and_the_rollouts_around_them(health_run: Path, capsys) -> None:
    main(["report", str(health_run)])
    assert "health.jsonl: skipped 2 malformed line(s)" in capsys.readouterr().out
    out = health_run / "report"
    with Image.open(out / "health.png") as image:
        assert image.format == "PNG"
        image.verify()
    page = (out / "health.html").read_text(encoding="utf-8")
    assert "<b>2 detector marks</b>" in page and '<img src="health.png"' in page
    assert "<td>1</td><td>3</td><td>reward_collapse</td><td>reward/total</td><td>0.05</td>" in page
    assert "<td>2</td><td>8</td><td>entropy_collapse</td><td>health/entropy</td><td></td>" in page
    assert "<script" not in page and "fell &lt;script&gt;alert(2)&lt;/script&gt;" in page
    # mark 1 at step 3: the logged steps 1..5 are 2 and 4; mark 2 at step 8: steps 6..10 hold 8
    assert '<a href="#mark-1">2 rollouts</a>' in page and '<a href="#mark-2">1 rollout</a>' in page
    around = {i: _section(page, f"mark-{i}") for i in (1, 2)}
    assert [s for s in (0, 2, 4, 8) if f"<td>q{s}</td>" in around[1]] == [2, 4]
    assert [s for s in (0, 2, 4, 8) if f"<td>q{s}</td>" in around[2]] == [8]
    index = (out / "index.html").read_text(encoding="utf-8")
    assert '<a href="health.html">Run health: 2 detector marks</a>' in index


def test_health_plot_marks_the_metric_and_reward_panels(health_run: Path, monkeypatch) -> None:
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    build_report(health_run)
    (fig,) = [f for f in figures if "Run health" in f.get_suptitle()]
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    # every signal logged, each in its own panel, the reward first
    assert list(panels)[0] == "reward/total" and len(panels) == 8 + len(GUARDS)
    labels = {key: sorted(t.get_text() for t in ax.texts) for key, ax in panels.items()}
    assert labels["reward/total"] == ["entropy_collapse", "reward_collapse"]
    assert labels["health/entropy"] == ["entropy_collapse"]
    assert labels["train/kl"] == []
    marked = [line.get_xdata()[0] for line in panels["reward/total"].lines[1:]]  # [0]: the curve
    # on metrics.csv's axis (batches from 0): the mark's batch, else its step - 1
    assert sorted(marked) == [2, 7]


def test_health_columns_stay_out_of_the_index_groups(health_run: Path) -> None:
    groups = group_series(read_metrics_csv(health_run / "metrics.csv"))
    grouped = {key for group in groups.values() for key in group}
    assert not grouped & {"health/entropy", "health/groups_with_variance", *GUARDS}


def test_health_page_without_marks_or_columns(tmp_path: Path) -> None:
    quiet = log_health_run(tmp_path / "quiet")  # health columns, no detector fired
    build_report(quiet)
    page = (quiet / "report" / "health.html").read_text(encoding="utf-8")
    assert "<b>no detector fired</b>" in page and "<table>" not in page
    index = (quiet / "report" / "index.html").read_text(encoding="utf-8")
    assert '<a href="health.html">Run health: no detector fired</a>' in index
    old = log_run(tmp_path / "old", validation=False)  # before health monitoring
    build_report(old)
    page = (old / "report" / "health.html").read_text(encoding="utf-8")
    assert "this run predates health monitoring" in page
    assert 'href="health.html"' not in (old / "report" / "index.html").read_text()


def test_malformed_health_lines_are_skipped(tmp_path: Path) -> None:
    good = {"step": 2, "detector": "hedging", "metric": "m", "value": 0.5, "line": "x"}
    bad = [
        "not json",
        "[1, 2]",
        json.dumps({**good, "step": True}),
        json.dumps({**good, "step": -1}),
        json.dumps({**good, "value": "high"}),
        json.dumps({**good, "detector": 5}),
        json.dumps({**good, "value": 10**400}),  # an integer no float holds
    ]
    lines = [*bad, json.dumps({**good, "step": 7}), "", json.dumps(good), '{"step": NaN}']
    (tmp_path / "health.jsonl").write_text("\n".join(lines), encoding="utf-8")
    marks, skipped = read_marks(tmp_path / "health.jsonl")
    assert [m.step for m in marks] == [2, 7] and skipped == len(bad) + 1  # the blank line is not
    assert read_marks(tmp_path / "missing.jsonl") == ([], 0)
