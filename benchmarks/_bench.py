"""What every benchmark here shares: its ``--quick`` mode, its ``--precision`` and the provenance
block it prints under its table.

The scripts run as ``python benchmarks/NAME.py``, so this module is found beside them
(``sys.path[0]``): ``import _bench``.

- ``--quick``: a run of a few minutes (under ~3 on a 2-core Zen 4, so under ~10 on a slow
  laptop) that prints the same table on smaller sizes. Its sizes are defaults, not overrides: a
  flag given on the command line wins (``--quick --prompts 8``).
- ``--precision auto|bf16|fp32``: ``auto`` is what ``precision: auto`` picks on this machine
  (lit_rag.models.precision: bf16 where the hardware computes it natively, else fp32).
- :func:`print_provenance`: the date, lit-rag's build, the machine, the libraries and the
  command (lit_rag.machine), as a Markdown list.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: when this process started its benchmark (this module is imported first thing)
STARTED = datetime.now(timezone.utc)
_STARTED_S = time.perf_counter()
#: ``--precision`` choices -> Lightning's ``trainer.precision`` / an engine's ``dtype``
PRECISIONS = {"bf16": ("bf16-mixed", "bfloat16"), "fp32": ("32-true", "float32")}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _shown(dest: str, value: object) -> str:
    if value is True:
        return _flag(dest)
    if isinstance(value, list | tuple):
        return f"{_flag(dest)} {' '.join(map(str, value))}"
    return f"{_flag(dest)} {value}"


def quick_help(quick: dict[str, object], note: str = "") -> str:
    """``--quick``'s help: what it sets."""
    sizes = ", ".join(_shown(k, v) for k, v in quick.items() if v is not None and v is not False)
    return (
        f"a run of a few minutes on smaller sizes ({sizes or note}; flags you give win)"
        if sizes
        else f"accepted for symmetry with the other benchmarks: {note}"
    )


def parse_args(
    parser: argparse.ArgumentParser,
    quick: dict[str, object],
    argv: list[str] | None = None,
    *,
    known: bool = False,
    note: str = "",
):
    """Add ``--quick`` to ``parser`` and parse ``argv``. With ``--quick``, ``quick``'s values
    (by argparse ``dest``) become the defaults, so a flag given explicitly keeps its value.
    ``known``: ``parse_known_args`` (the benchmarks that pass the rest to ``lit-rag``'s CLI)."""
    parser.add_argument("--quick", action="store_true", help=quick_help(quick, note))
    parse = parser.parse_known_args if known else parser.parse_args
    parsed = parse(argv)
    if (parsed[0] if known else parsed).quick:
        parser.set_defaults(**quick)
        parsed = parse(argv)
    return parsed


def add_precision(parser: argparse.ArgumentParser, what: str) -> None:
    """``--precision auto|bf16|fp32`` (default ``auto``); ``what`` says what it sets."""
    parser.add_argument(
        "--precision",
        choices=("auto", *PRECISIONS),
        default="auto",
        help=f"{what}: auto (the default) is what `precision: auto` picks on this machine, bf16 "
        "where the hardware computes it natively (AVX-512 BF16, AMX, a GPU), else fp32; bf16 / "
        "fp32 force one, for comparisons",
    )


def resolve_precision(choice: str, accelerator: str | None = "cpu") -> str:
    """``--precision``'s choice as Lightning's ``trainer.precision``: ``bf16-mixed`` or
    ``32-true`` (``auto`` resolved as ``lit-rag fit`` resolves it)."""
    if choice == "auto":
        from lit_rag.models.precision import resolve_precision as resolve

        return str(resolve("auto", accelerator))
    return PRECISIONS[choice][0]


def resolve_dtype(choice: str, accelerator: str | None = "cpu") -> str:
    """``--precision``'s choice as an engine's ``dtype``: ``bfloat16`` or ``float32``."""
    if choice == "auto":
        from lit_rag.models.precision import resolve_dtype as resolve

        return resolve("native", accelerator)
    return PRECISIONS[choice][1]


def installed(distribution: str) -> bool:
    """Whether a distribution is installed (its metadata; nothing imported)."""
    from importlib import metadata

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def command_line(script: str, argv: list[str] | None = None) -> str:
    """How to run this again: ``python benchmarks/NAME.py ARGS`` (``script``: the benchmark's
    file; ``argv``: its arguments, by default this process's)."""
    path = Path(script).resolve()
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = str(path)
    return shlex.join(["python", shown, *(sys.argv[1:] if argv is None else argv)])


def print_provenance(
    script: str,
    argv: list[str] | None = None,
    *,
    command: str | None = None,
    libraries: tuple[str | tuple[str, ...], ...] = (),
) -> None:
    """Print the provenance block (lit_rag.machine.provenance_lines) after a blank line: the
    date this benchmark started and its wall time, lit-rag's build, the machine, the library
    versions (the common ones + ``libraries``) and ``command`` (default: :func:`command_line`
    of ``script``, the benchmark's ``__file__``, and ``argv``)."""
    from lit_rag.machine import provenance_lines

    lines = provenance_lines(
        command or command_line(script, argv),
        libraries=libraries,
        started=STARTED,
        wall_s=time.perf_counter() - _STARTED_S,
    )
    print()
    print("\n".join(lines), flush=True)
