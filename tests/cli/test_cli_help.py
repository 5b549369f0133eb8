"""``lit-rag --help`` and every command's ``--help`` say what lit-rag does, in its own words.

The top-level help and each light command's help run the real entry point (``python -m
lit_rag``) in a subprocess, with ``-X importtime`` to show that none of them imports torch or
Lightning. ``fit``, ``validate`` and ``test`` build the LightningCLI, so their help runs in this
process (Lightning is imported once, not once per command). Every argument of lit-rag's own
argparse commands is checked for help text by walking the parsers the modules build.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from lit_rag.cli import commands as cli
from lit_rag.cli import export, size
from lit_rag.cli import index as index_cli
from lit_rag.data.prepare import command as prepare
from lit_rag.evaluate import command as evaluate
from lit_rag.evaluate import compare
from lit_rag.report import page as report

pytestmark = [pytest.mark.subprocess]

#: what the top-level help must list (fit, report, compare, evaluate, export, index and plugins
#: are the commands a user meets first; validate, test and data complete what ``main`` runs)
EXPECTED = {
    "fit",
    "validate",
    "test",
    "compare",
    "evaluate",
    "report",
    "export",
    "data",
    "index",
    "size",
    "plugins",
}

#: packages the help of a light command must not import (each costs seconds)
HEAVY = {"torch", "lightning", "transformers", "sentence_transformers", "faiss", "torchmetrics"}

#: the parser of each of lit-rag's own (argparse) commands
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "compare": compare.build_parser,
    "evaluate": evaluate.build_parser,
    "report": report.build_parser,
    "export": export.build_parser,
    "data": prepare.build_parser,
    "index": index_cli.build_parser,
    "size": size.build_parser,
    "plugins": cli.plugins_parser,
}

#: arguments hidden from ``--help`` on purpose: how ``evaluate`` runs itself on a model folder
HIDDEN = {("lit-rag evaluate", "--label"), ("lit-rag evaluate", "--record-only")}


def _lit_rag(*args: str) -> tuple[int, str, str, set[str]]:
    """Exit code, stdout, stderr (without the import report) and the heavy packages imported of
    ``python -m lit_rag ARGS``."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lit_rag", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    err, imported = [], set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):  # "import time: self | cumulative | module"
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
        else:
            err.append(line)
    return proc.returncode, proc.stdout, "\n".join(err), imported & HEAVY


def _flat(text: str) -> str:
    """``text`` with its line wrapping undone."""
    return " ".join(text.split())


def test_the_listed_commands_are_the_commands():
    assert set(cli.COMMANDS) == EXPECTED
    assert set(PARSERS) == EXPECTED - set(cli.TRAINER_COMMANDS)
    assert set(index_cli.INDEX_COMMANDS) == {"build", "search", "eval", "serve", "import"}


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_top_level_help_lists_every_command_on_one_line(flag):
    code, out, err, heavy = _lit_rag(flag)
    assert (code, err, heavy) == (0, "", set())
    lines = out.splitlines()
    assert lines[0] == "usage: lit-rag COMMAND [options]"
    for name, line in cli.COMMANDS.items():
        assert line and "\n" not in line
        (row,) = [row for row in lines if row.split()[:1] == [name]]
        assert row.split(None, 1)[1] == line
    assert "predict" not in out
    assert "Lightning Trainer command line tool" not in out
    assert "lit-rag fit --config recipes/quickstart.yaml" in out


def test_no_arguments_prints_the_help_and_exits_2(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([])
    assert stop.value.code == 2
    assert capsys.readouterr().out == cli.help_text() + "\n"


def test_help_before_any_command_is_the_top_level_help(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--config", "recipes/quickstart.yaml", "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == cli.help_text() + "\n"


def test_predict_is_not_a_command(capsys):
    """Lightning's ``predict`` needs a ``predict_step`` no lit-rag module has: not offered."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", "--config", "recipes/quickstart.yaml"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "lit-rag: error: unknown command 'predict'; commands: "
        "fit, validate, test, compare, evaluate, report, export, data, index, size, plugins "
        "(lit-rag --help)"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["plugins"],
        ["index"],
        ["index", "build"],
        ["index", "search"],
        ["index", "eval"],
        ["index", "serve"],
        ["index", "import"],
        ["report"],
        ["export"],
        ["compare"],
        ["evaluate"],
        ["data"],
    ],
    ids=" ".join,
)
def test_command_help_opens_with_what_it_does(command):
    code, out, err, heavy = _lit_rag(*command, "--help")
    assert (code, err, heavy) == (0, "", set())
    assert out.startswith(f"usage: lit-rag {' '.join(command)}")
    first = out.split("\n\n")[1]  # the paragraph after the usage
    lines = {**cli.COMMANDS, **{f"index {k}": v for k, v in index_cli.INDEX_COMMANDS.items()}}
    assert _flat(first).startswith(lines[" ".join(command)])


def test_plugins_takes_no_arguments(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["plugins", "--kind"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "lit-rag: error: plugins: unrecognized arguments: --kind (usage: lit-rag plugins)"
    )


@pytest.mark.parametrize("name", cli.TRAINER_COMMANDS)
def test_trainer_command_help_opens_with_lit_rag_then_lightning_options(name, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([name, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    description = cli.TRAINER_HELP[name]
    opening = f"usage: lit-rag {name} --config RECIPE [--KEY=VALUE ...]\n\n{description}\n\n"
    assert out.startswith(opening)
    rest = out[len(opening) :]
    assert description.splitlines()[0] == cli.COMMANDS[name]
    assert f"lit-rag {name} --config recipes/quickstart.yaml" in description
    for option in ("--config CONFIG", "--trainer.max_steps", "--model.policy", "--ckpt_path"):
        assert option in rest  # Lightning's options, all still there
    if name == "fit":
        assert "--model.optimizer.lr=5e-4" in description and "recipes/README.md" in description


def _parsers(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    """Each argument of ``parser`` and of its commands' parsers, with the parser it is in."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:  # a command's line in the parent's help
                yield parser, choice
            for sub in action.choices.values():
                yield from _parsers(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser, action


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_argument_has_help(name):
    parser = PARSERS[name]()
    assert parser.prog == f"lit-rag {name}"
    assert _flat(parser.description).startswith(cli.COMMANDS[name])
    seen = 0
    for owner, action in _parsers(parser):
        seen += 1
        where = f"{owner.prog} {(action.option_strings or [action.dest])[-1]}"
        assert isinstance(action.help, str) and action.help.strip(), f"{where}: no help"
        if action.help == argparse.SUPPRESS:
            assert (owner.prog, action.option_strings[-1]) in HIDDEN, f"{where}: hidden"
        assert owner.description, f"{owner.prog}: no description"
    assert seen or name == "plugins"


def test_index_help_lists_import():
    out = index_cli.build_parser().format_help()
    assert "{build,search,eval,serve,import}" in out
    assert index_cli.INDEX_COMMANDS["import"] in _flat(out)
