"""The ``lit-rag`` command: LightningCLI (fit / validate / test) and lit-rag's own commands
(compare, evaluate, report, export, data, index, plugins), listed in :data:`COMMANDS`.

This module dispatches a command line to its command and prints what goes wrong as one line,
``lit-rag: error: ...``. Its parts live by job: the help texts in :mod:`lit_rag.cli.help`, the
rewriting of recipes and overrides (registered plugin names -> dotted class paths) in
:mod:`lit_rag.cli.recipe_args`, the LightningCLI of the trainer commands in
:mod:`lit_rag.cli.fit`, each of lit-rag's own commands in its module (``main(args)``).

Lightning, torch and the modules are imported only by the commands that build the LightningCLI
(fit, validate, test): ``--help``, ``plugins`` and ``index`` start in well under two seconds.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from lit_rag import registry
from lit_rag.cli.help import (
    COMMANDS,
    DESCRIPTION,
    TRAINER_COMMANDS,
    TRAINER_HELP,
    USAGE,
    help_text,
)
from lit_rag.cli.recipe_args import (
    RecipeError,
    argument_message,
    check_recipes,
    one_line,
    resolve_args,
    resolve_config,
)
from lit_rag.errors import (
    CommandParser,
    DiskFullError,
    InputError,
    NotWritableError,
    chain,
)
from lit_rag.models.distributed import CollectiveError

#: lit-rag's command and what scripts and tests import from here (the help texts and the recipe
#: rewriting live in their own modules)
__all__ = [
    "COMMANDS",
    "DESCRIPTION",
    "TRAINER_COMMANDS",
    "TRAINER_HELP",
    "USAGE",
    "build_cli",
    "entry",
    "error_line",
    "help_text",
    "main",
    "plugins_parser",
    "print_help",
    "print_plugins",
    "resolve_args",
    "resolve_config",
]


def build_cli(args: list[str], run: bool = True):
    """The LightningCLI over :class:`PolicyModule` and :class:`QADataModule` (or the recipe's
    own ``model`` and ``data`` classes): :func:`lit_rag.cli.fit.build_cli`, imported here
    on first use (it imports Lightning), once the recipes read well (a missing or broken one is
    one line in a fraction of a second, not after seconds of imports)."""
    check_recipes(args)
    from lit_rag.cli.fit import build_cli as build_trainer_cli

    return build_trainer_cli(args, run=run)


def print_plugins() -> None:
    """``lit-rag plugins``: every installed plugin with the package it comes from."""
    rows = [
        (p.kind, p.name, f"{p.package} {p.version}".strip(), p.target)
        for p in registry.all_plugins()
    ]
    header = ("kind", "name", "package", "target")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(col.ljust(w) for col, w in zip(row, widths, strict=True)).rstrip())


def print_help() -> None:
    """``lit-rag --help``, printed without importing Lightning or torch (see the module
    docstring); ``lit-rag fit --help`` and the others are each command's own."""
    print(help_text())


def _asks_top_level_help(args: list[str]) -> bool:
    """``-h`` / ``--help`` with no command: ``lit-rag --help``, ``lit-rag -c RECIPE --help``."""
    return any(a in ("-h", "--help") for a in args) and not any(a in COMMANDS for a in args)


def plugins_parser() -> CommandParser:
    """The parser of ``lit-rag plugins`` (no arguments; ``--help``)."""
    return CommandParser(
        "plugins",
        "lit-rag plugins",
        description=(
            f"{COMMANDS['plugins']} A row per plugin: its kind, the name a recipe gives it "
            "(class_path: grpo), the package it comes from and what it loads. A package adds "
            "plugins through Python entry points (lit_rag.rewards, lit_rag.retrievers, ...)."
        ),
    )


def _plugins(args: list[str]) -> None:
    plugins_parser().parse_args(args)  # --help, or an error for any argument
    print_plugins()


def _index(args: list[str]) -> None:
    from lit_rag.cli.index import main as index_main

    try:
        index_main(args)
    except ValueError as exc:  # index mismatch, data without gold passages, bad option
        raise RecipeError(str(exc)) from exc


def _report(args: list[str]) -> None:
    from lit_rag.report.page import main as report_main

    report_main(args)


def _export(args: list[str]) -> None:
    from lit_rag.cli.export import main as export_main

    export_main(args)


def _evaluate(args: list[str]) -> None:
    from lit_rag.evaluate.command import main as evaluate_main

    evaluate_main(args)


def _compare(args: list[str]) -> None:
    from lit_rag.evaluate.compare import main as compare_main

    compare_main(args)


def _data(args: list[str]) -> None:
    from lit_rag.data.prepare.command import main as data_main

    data_main(args)


def _size(args: list[str]) -> None:
    from lit_rag.cli.size import main as size_main

    size_main(args)


#: lit-rag's own commands: each runs with the arguments after its name (the trainer commands
#: are LightningCLI's, :func:`build_cli`)
_OWN_COMMANDS = {
    "plugins": _plugins,
    "index": _index,
    "report": _report,
    "export": _export,
    "evaluate": _evaluate,
    "compare": _compare,
    "data": _data,
    "size": _size,
}


def _run(args: list[str]) -> None:
    """Run the command ``args`` name (a trainer command, or options alone: LightningCLI's)."""
    if args == ["--version"]:
        from lit_rag.version import build_version

        print(f"lit-rag {build_version()}")
        return
    if not args[0].startswith("-") and args[0] not in COMMANDS:
        raise InputError(
            f"unknown command '{args[0]}'; commands: {', '.join(COMMANDS)} (lit-rag --help)"
        )
    command = _OWN_COMMANDS.get(args[0])
    if command is not None:
        command(args[1:])
        return
    build_cli(args)


def main(argv: list[str] | None = None) -> None:
    """``lit-rag ARGS`` (``argv``, else ``sys.argv[1:]``): the command they name. What the user
    can fix is one line, ``lit-rag: error: ...``, exit 2 (a failed collective: exit 1); a run
    stopped by SIGTERM exits 143; Ctrl-C (SIGINT) stops any command with ``lit-rag:
    interrupted``, exit 130, as a shell reports a process the signal ended."""
    from lit_rag.cli import console

    args, loud = console.split_verbose(list(sys.argv[1:] if argv is None else argv))
    if not loud:
        console.quiet()
    if not args:
        print_help()
        raise SystemExit(2)
    if _asks_top_level_help(args):
        print_help()
        raise SystemExit(0)  # as argparse's --help does
    try:
        _run(args)
    except KeyboardInterrupt:  # what the command was doing cleans up as the exception unwinds
        raise _interrupted() from None
    except Exception as exc:
        code = _print_error(exc, args)
        if code is None:  # not the user's to fix: the traceback
            raise
        raise SystemExit(code) from None
    except SystemExit as exc:
        if _stopped_by_sigterm(exc):  # Lightning exits 0 there; a scheduler must see the signal
            raise SystemExit(128 + 15) from None
        if any(isinstance(e, KeyboardInterrupt) for e in chain(exc)):
            raise _interrupted() from None  # Lightning's exit(1) after its Ctrl-C shutdown
        raise


#: the exit code of a command Ctrl-C stopped: 128 + SIGINT, as a shell reports it
INTERRUPTED_EXIT = 130


def _interrupted() -> SystemExit:
    """``lit-rag: interrupted`` on stderr, and the exit that ends the command with code 130."""
    print("lit-rag: interrupted", file=sys.stderr, flush=True)
    return SystemExit(INTERRUPTED_EXIT)


def _print_error(exc: Exception, args: list[str]) -> int | None:
    """Print ``exc`` as one line, ``lit-rag: error: ...``, when the user can act on it, and
    return the exit code; None for any other error (it keeps its traceback)."""
    found = error_line(exc, args)
    if found is None:
        return None
    line, code = found
    print(f"lit-rag: error: {line}", file=sys.stderr, flush=True)
    return code


def error_line(exc: Exception, args: list[str]) -> tuple[str, int] | None:
    """The line ``lit-rag ARGS`` prints after ``lit-rag: error:`` for ``exc``, and its exit code,
    when the user can act on it (bad input, a full disk or a folder it may not write, vLLM not
    installed: 2; a hung collective: 1); None for any other error. The Python entry points
    (lit_rag/recipe.py) raise the same line as an :class:`InputError`."""
    if isinstance(exc, argparse.ArgumentError):  # jsonargparse: unknown key, wrong type
        command = args[0] if args and args[0] in TRAINER_COMMANDS else ""
        line = f"{argument_message(exc)} (options: lit-rag {command} --help)".replace("  ", " ")
        return line, 2
    if isinstance(exc, (InputError, FileNotFoundError)):
        return one_line(exc), 2
    if isinstance(exc, CollectiveError):  # a hang or a lost rank: not the user's input, exit 1
        return one_line(exc), 1
    line = _missing_vllm(exc) or _unwritable(exc)
    return (line, 2) if line is not None else None


def _unwritable(exc: BaseException) -> str | None:
    """A full disk or a folder that refuses writes, as one line: lit-rag's own error (a
    checkpoint's), also under another error raised while the run stopped (a logger's own failed
    write), else the file the system refused (a read-only file system, no permission)."""
    errors = list(chain(exc))
    ours = next((e for e in errors if isinstance(e, (DiskFullError, NotWritableError))), None)
    if ours is not None:
        return one_line(ours)
    config = next((e for e in errors if _unwritable_config(e)), None)
    if config is not None:  # LightningCLI saves config.yaml in the run's folder first
        return (
            f"{one_line(config)} (a read-only file system, or no permission); point the run at "
            "a folder you can write (trainer.default_root_dir, the logger's save_dir)"
        )
    refused = next(
        (e for e in errors if isinstance(e, OSError) and e.errno in _REFUSED and e.filename),
        None,
    )
    if refused is None:
        return None
    advice = (
        "write to a folder on a writable file system"
        if refused.errno == errno.EROFS
        else "check the path's permissions or choose another"
    )
    return f"{refused.filename}: {refused.strerror} ({errno.errorcode[refused.errno]}); {advice}"


def _unwritable_config(exc: BaseException) -> bool:
    """jsonargparse's ``PathError`` for a ``config.yaml`` it may not create (LightningCLI's
    ``SaveConfigCallback``): "File is not creatable since parent directory not writable"."""
    return (
        type(exc).__name__ == "PathError"
        and type(exc).__module__.startswith("jsonargparse")
        and "not writable" in str(exc)
    )


#: ``errno`` of a file the system refused this process: read-only file system, no permission
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def _missing_vllm(exc: BaseException) -> str | None:
    """The vllm engine's install hint with the import error under it (``No module named
    'vllm'``, or what a broken vLLM install raised), when ``exc`` comes from vLLM not importing."""
    if "lit_rag.plugins.engines.vllm.support" not in sys.modules:
        return None
    from lit_rag.plugins.engines.vllm.support import INSTALL_HINT

    for error in chain(exc):
        if isinstance(error, ImportError) and str(error) == INSTALL_HINT:
            cause = error.__cause__
            return f"{INSTALL_HINT} ({one_line(cause)})" if cause is not None else INSTALL_HINT
    return None


def _stopped_by_sigterm(exc: SystemExit) -> bool:
    """Whether Lightning stopped the run on a SIGTERM (``SIGTERMException``, a ``SystemExit``
    with no code); :class:`~lit_rag.callbacks.PreemptionCheckpoint` saved a checkpoint first."""
    if "lightning" not in sys.modules:
        return False
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return isinstance(exc, SIGTERMException)


def entry() -> None:
    """The ``lit-rag`` console command: :func:`main`, trainer commands under tcmalloc
    (:mod:`lit_rag.cli.preload`)."""
    from lit_rag.cli import console
    from lit_rag.cli.preload import reexec_with_tcmalloc

    if not console.split_verbose(sys.argv[1:])[1]:
        # read when torch loads: before the re-exec
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    reexec_with_tcmalloc()
    main()


if __name__ == "__main__":
    main()
