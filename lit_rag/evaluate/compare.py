"""``lit-rag compare``: what training bought, on the recipe's validation data.

    lit-rag compare --config recipes/arena_hotpotqa_cpu.yaml \\
        runs/arena_hotpotqa_cpu/version_0/checkpoints/last.ckpt
    lit-rag compare --config RECIPE CKPT [CKPT ...] [--json OUT] [--no-untrained] [overrides]

One process validates the untrained policy (the recipe's base model, LoRA adapters at their
initial no-op) and then each checkpoint (at least one: the untrained policy alone is
``lit-rag validate --config RECIPE``), on the same validation data with the same greedy
decoding, and prints the metrics side by side with each checkpoint's change from the untrained
policy. ``--json`` also writes them (metric -> value per column) for scripts that aggregate
seeds. Recipe overrides work as for ``validate`` (``--data.val=FILE`` validates on another file).
Nothing is logged to the run folders: the trainer's logger is off.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from lit_rag.cli.recipe_args import load_recipe
from lit_rag.errors import CommandParser, InputError

USAGE = (
    "lit-rag compare --config RECIPE CHECKPOINT [CHECKPOINT ...] [--json OUT] [--no-untrained] "
    "[--data.val=FILE ...]"
)
UNTRAINED = "untrained"
#: ``lit-rag compare --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = """\
Validate the untrained policy and each checkpoint, side by side.

  lit-rag compare --config recipes/quickstart.yaml \\
      runs/quickstart/version_0/checkpoints/last.ckpt
  lit-rag compare --config RECIPE CHECKPOINT CHECKPOINT --json table.json --no-untrained

One process scores each on the recipe's validation data with the same greedy decoding and
prints a table: a column per policy, each checkpoint's change from the untrained one. Recipe
overrides work as for lit-rag validate (--data.val=FILE scores another file). It takes at
least one checkpoint; lit-rag validate --config RECIPE scores the untrained policy alone."""


def build_parser() -> CommandParser:
    """The parser of ``lit-rag compare`` (recipe overrides are what it leaves)."""
    parser = CommandParser(
        "compare",
        USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "checkpoints",
        nargs="*",
        metavar="CHECKPOINT",
        help=".ckpt files of runs of this recipe (at least one)",
    )
    parser.add_argument(
        "--config", required=True, metavar="RECIPE", help="the recipe the runs were trained with"
    )
    parser.add_argument(
        "--json", default=None, metavar="OUT", help="also write the table as JSON to this file"
    )
    parser.add_argument(
        "--no-untrained", action="store_true", help="leave out the untrained policy's column"
    )
    return parser


def main(args: list[str]) -> None:
    """``lit-rag compare``: see the module docstring."""
    parser = build_parser()
    options, overrides = parser.parse_known_args(args)
    unknown = [word for word in overrides if not word.startswith("--")]
    if unknown:
        raise InputError(f"compare: {unknown[0]!r} is not an option (usage: {USAGE})")
    if not options.checkpoints:  # the untrained policy alone takes minutes to say nothing new
        raise InputError(
            "compare: give at least one checkpoint (lit-rag compare --config RECIPE "
            "runs/NAME/version_N/checkpoints/last.ckpt ...); the untrained policy alone: "
            f"lit-rag validate --config {options.config}"
        )
    load_recipe(options.config)  # a missing or broken recipe: one line before Lightning loads
    columns = compare(
        options.config,
        options.checkpoints,
        untrained=not options.no_untrained,
        overrides=overrides,
    )
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0:  # --trainer.devices=N: every rank validates, rank zero reports
        return
    print(table(columns))
    if options.json:
        Path(options.json).write_text(json.dumps(columns, indent=2) + "\n", encoding="utf-8")


def compare(
    recipe: str,
    checkpoints: list[str],
    untrained: bool = True,
    overrides: list[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Validation metrics per column (``untrained``, then each checkpoint by path), in order.

    Raises:
        InputError: A checkpoint that is missing or not a lit-rag checkpoint (before anything
            is validated).
    """
    from lit_rag.checkpoints.storage import check_checkpoint_file
    from lit_rag.cli.fit import build_cli

    for path in checkpoints:
        check_checkpoint_file(path)
    # the recipe's ModelCheckpoint notes that a loaded checkpoint was written to another run's
    # folder: true of every checkpoint compared, and nothing is saved here
    warnings.filterwarnings("ignore", message="The dirpath has changed")
    cli = build_cli(
        [
            "--config",
            recipe,
            *(overrides or []),
            "--trainer.logger=false",
        ],
        run=False,
    )
    trainer, module, data = cli.trainer, cli.model, cli.datamodule
    # LightningCLI's SaveConfigCallback would write config.yaml into the working directory (the
    # logger is off): compare writes nothing but its table
    from lightning.pytorch.cli import SaveConfigCallback

    trainer.callbacks[:] = [c for c in trainer.callbacks if not isinstance(c, SaveConfigCallback)]
    columns: dict[str, dict[str, float]] = {}
    runs = ([(UNTRAINED, None)] if untrained else []) + [(path, path) for path in checkpoints]
    for label, path in runs:
        (metrics,) = trainer.validate(module, datamodule=data, ckpt_path=path, verbose=False)
        columns[label] = {key: float(value) for key, value in sorted(metrics.items())}
    return columns


def table(columns: dict[str, dict[str, float]]) -> str:
    """The metrics side by side; each checkpoint's change from the untrained policy after it."""
    labels = list(columns)
    keys = sorted({key for metrics in columns.values() for key in metrics})
    base = columns.get(UNTRAINED)
    header = ["metric", *(_short(label) for label in labels)]
    if base is not None and len(labels) > 1:
        header += [f"change {i}" for i in range(1, len(labels))]
    rows = [header]
    for key in keys:
        row = [key, *(_number(columns[label].get(key)) for label in labels)]
        if base is not None and len(labels) > 1:
            for label in labels[1:]:
                have, was = columns[label].get(key), base.get(key)
                row.append("" if have is None or was is None else f"{have - was:+.3f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    legend = [f"  {i}: {label}" for i, label in enumerate(labels[1:], 1)] if base else []
    return "\n".join(
        lines + ([""] + ["change i: column i minus untrained"] + legend if legend else [])
    )


def _short(label: str) -> str:
    """A column title: ``untrained``, or a checkpoint's run name, version and file name."""
    if label == UNTRAINED:
        return label
    parts = [p for p in Path(label).parts[-4:] if p != "checkpoints"]
    return "/".join(parts[-3:])


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
