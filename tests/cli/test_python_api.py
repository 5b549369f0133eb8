"""lit-rag from Python (lit_rag/recipe.py, docs/python.md): the page's code blocks run as
written, a Python fit logs what ``lit-rag fit`` logs, bad input raises the command's own line as
an InputError (no exit), calls repeat in one process, and an interrupt ends the call only.

The page's blocks name ``recipes/quickstart.yaml`` (SmolLM2 with vLLM: minutes per run); here
they run against ``recipes/tiny.yaml`` (the tiny random model, seconds), the one change made to
the page's code. Every run writes under the test's own working folder (``isolated``).
"""

from __future__ import annotations

import csv
import re
import signal
from pathlib import Path

import pytest
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)
from lightning.pytorch import Callback

import lit_rag.recipe as recipe
from lit_rag.cli.commands import main
from lit_rag.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny.yaml")
PAGE = ROOT / "docs" / "python.md"


def page_blocks() -> list[str]:
    """The page's ``python`` code blocks, in order."""
    return re.findall(r"```python\n(.*?)\n```", PAGE.read_text(encoding="utf-8"), re.DOTALL)


def training_rows(folder: str | Path) -> list[dict[str, str]]:
    """The training steps' rows of the one ``metrics.csv`` under ``folder``: the metrics each
    logged, without the wall-clock ones (``time/``, ``mem/``, and ``perf/``, rates per second),
    which differ between any two runs."""
    (path,) = sorted(Path(folder).rglob("metrics.csv"))
    with path.open(newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/loss")]
    return [
        {
            key: value
            for key, value in row.items()
            if value and not key.startswith(("time/", "mem/", "perf/"))
        }
        for row in rows
    ]


def command_error(args: list[str], capsys) -> str:
    """What ``lit-rag ARGS`` prints after ``lit-rag: error:`` (it must exit 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "lit-rag: error: " in line]
    return lines[-1].split("lit-rag: error: ", 1)[1]


def test_the_pages_code_blocks_run_as_written(capsys) -> None:
    blocks = page_blocks()
    assert len(blocks) == 6
    for number, block in enumerate(blocks, start=1):
        code = block.replace("recipes/quickstart.yaml", TINY)
        exec(compile(code, f"docs/python.md, block {number}", "exec"), {"__name__": "page"})
    out = capsys.readouterr().out
    assert "unrecognized arguments: --trainer.max_step=4 (options: lit-rag fit --help)" in out
    assert re.search(r"^6$", out, re.MULTILINE)  # the resumed run's global step
    assert re.search(r"^step 4: reward", out, re.MULTILINE)  # the callback added after build
    # the objects block is recipes/tiny.yaml in Python: the command logs the same steps
    main(["fit", "--config", TINY, "--trainer.logger.init_args.save_dir=command"])
    steps = training_rows("command")
    assert len(steps) == 2 and "health/entropy" in steps[0]  # max_steps: 2; sampled tokens
    assert training_rows("runs/tiny-python") == steps


def test_a_python_fit_logs_what_the_command_logs_and_repeats() -> None:
    main(["fit", "--config", TINY, "--trainer.logger.init_args.save_dir=command"])
    first = recipe.fit(TINY, {"trainer.logger.init_args.save_dir": "python"})
    again = recipe.fit(TINY, {"trainer.logger.init_args.save_dir": "python"})  # same process
    assert Path(first.log_dir).name == "version_0" and Path(again.log_dir).name == "version_1"
    steps = training_rows("command")
    assert [row["step"] for row in steps] == ["0", "1"]  # max_steps: 2
    assert "health/entropy" in steps[0]  # of the sampled tokens: the seed's samples
    assert training_rows(first.log_dir) == steps
    assert training_rows(again.log_dir) == steps


@pytest.mark.parametrize(
    ("overrides", "args"),
    [
        ({"trainer.max_step": 4}, ["--trainer.max_step=4"]),  # no such key
        ({"trainer.max_steps": "four"}, ["--trainer.max_steps=four"]),  # not an int
        ({"model.reward": "arena2"}, ["--model.reward=arena2"]),  # no such plugin
        ({"model.group_size": -2}, ["--model.group_size=-2"]),  # refused by the module
        # refused by Lightning once the data is read (the epoch has 8 batches)
        ({"trainer.val_check_interval": 100}, ["--trainer.val_check_interval=100"]),
    ],
    ids=["unknown-key", "wrong-type", "unknown-plugin", "out-of-range", "checked-mid-run"],
)
def test_bad_input_raises_the_commands_line(overrides, args, capsys) -> None:
    line = command_error(["fit", "--config", TINY, *args], capsys)
    with pytest.raises(InputError) as error:
        recipe.fit(TINY, overrides)
    assert str(error.value) == line


def test_a_missing_recipe_or_checkpoint_raises_the_commands_line(capsys) -> None:
    line = command_error(["fit", "--config", "missing.yaml"], capsys)
    with pytest.raises(InputError, match="^recipe 'missing.yaml' does not exist$"):
        recipe.fit("missing.yaml")
    assert line == "recipe 'missing.yaml' does not exist"
    line = command_error(["validate", "--config", TINY, "--ckpt_path", "missing.ckpt"], capsys)
    with pytest.raises(InputError) as error:
        recipe.validate(TINY, ckpt_path="missing.ckpt")
    assert str(error.value) == line


def test_overrides_are_spelt_as_the_command_line_spells_them() -> None:
    overrides = {
        "trainer.max_steps": 4,
        "model.optimizer.lr": 5e-4,
        "trainer.logger": False,
        "seed_everything": None,
        "data.hops": [2, 3],
        "model.engine": "hf",
        "--data.batch_size": "2",
    }
    assert recipe.override_args(overrides) == [
        "--trainer.max_steps=4",
        "--model.optimizer.lr=0.0005",
        "--trainer.logger=false",
        "--seed_everything=null",
        "--data.hops=[2, 3]",
        "--model.engine=hf",
        "--data.batch_size=2",
    ]
    with pytest.raises(InputError, match="model.reward takes what a command line can spell"):
        recipe.override_args({"model.reward": object()})


class _Interrupt(Callback):
    """Ctrl-C in the middle of the first step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        raise KeyboardInterrupt


def test_an_interrupt_ends_the_call_not_the_process() -> None:
    """Lightning answers Ctrl-C with SIGINT ignored and ``sys.exit(1)``; a Python call ends with
    KeyboardInterrupt, SIGINT handled as before, and the next call runs."""
    handler = signal.getsignal(signal.SIGINT)
    run = recipe.build(TINY, {"trainer.max_steps": 1})
    run.trainer.callbacks.append(_Interrupt())
    with pytest.raises(KeyboardInterrupt):
        run.fit()
    assert signal.getsignal(signal.SIGINT) is handler
    assert recipe.fit(TINY, {"trainer.max_steps": 1}).trainer.global_step == 1
