"""CLI start-up: wall time of ``--help``, ``plugins``, BM25 ``index search`` and ``fit --help``.

Each command runs ``--repeats`` times (default 5) in a fresh process, the way a user runs it: the
``lit-rag`` script beside this Python (``python -m lit_rag`` where there is none). Before timing,
a BM25 index of the bundled synthetic corpus (1307 passages) is built into a temporary folder
and one untimed run of each command warms the OS file cache. The table gives median, min and
max seconds and whether the median is under the 2 s target (``--help``, ``plugins`` and
``index search`` have one; ``fit --help`` builds the whole LightningCLI and has none).

``--src DIR`` times the ``lit_rag`` package found in DIR instead (it goes first on
PYTHONPATH), e.g. an older commit for a before/after comparison:

    mkdir /tmp/old && git archive HEAD~1 | tar -x -C /tmp/old
    python benchmarks/cli_startup.py --src /tmp/old

Run (about a minute on 2 cores, most of it ``fit --help``; ``--quick``: 2 timed runs per
command instead of 5):

    python benchmarks/cli_startup.py
    python benchmarks/cli_startup.py --quick

Under the table: the date, commit, machine, library versions and command
(``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench

TARGET_S = 2.0
#: --quick: fewer timed runs per command (each still after its untimed warm-up)
QUICK = {"repeats": 2}


def _launcher() -> list[str]:
    """The ``lit-rag`` script of this environment, or ``python -m lit_rag``."""
    script = Path(sys.executable).parent / "lit-rag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "lit_rag"]


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run(command: list[str], env: dict[str, str]) -> float:
    """Seconds one run takes (wall clock); fails when the command fails."""
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(
            f"{shlex.join(command)} failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
        )
    return seconds


def _commands(index: str) -> dict[str, tuple[list[str], bool]]:
    """Row label -> (arguments, has the 2 s target)."""
    return {
        "lit-rag --help": (["--help"], True),
        "lit-rag plugins": (["plugins"], True),
        'lit-rag index search IDX "who founded Orbel Mills" -k 3': (
            ["index", "search", index, "who founded Orbel Mills", "-k", "3"],
            True,
        ),
        "lit-rag fit --help": (["fit", "--help"], False),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command (default 5)")
    parser.add_argument("--src", default=None, help="folder holding the lit_rag package to time")
    args = _bench.parse_args(parser, QUICK, argv)
    launcher, env = _launcher(), _env(args.src)
    load_before = os.getloadavg()[0]
    folder = tempfile.mkdtemp(prefix="lit_rag_cli_startup_")
    try:
        index = str(Path(folder) / "idx")
        build = ["index", "build", "--corpus", "synthetic", "--retriever", "bm25", "--out", index]
        _run([*launcher, *build], env)
        rows = []
        for label, (words, has_target) in _commands(index).items():
            _run([*launcher, *words], env)  # warm-up, untimed
            times = [_run([*launcher, *words], env) for _ in range(args.repeats)]
            median = statistics.median(times)
            met = ("yes" if median < TARGET_S else "no") if has_target else "no target"
            spread = f"{min(times):.2f} | {max(times):.2f}"
            rows.append(f"| `{label}` | {median:.2f} | {spread} | {met} |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"launcher: {shlex.join(launcher)}; lit_rag from: {args.src or 'this environment'}; "
        f"load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; {args.repeats} runs per command\n"
    )
    print(f"| command | median s | min s | max s | under {TARGET_S:g} s |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
