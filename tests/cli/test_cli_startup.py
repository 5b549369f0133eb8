"""``lit-rag --help``, ``plugins`` and a BM25 ``index search`` start without torch or Lightning.

Each command runs in a fresh interpreter (``python -c``) through
:func:`lit_rag.cli.commands.main`; the wrapper then prints which heavy packages ended up in
``sys.modules``. What these commands cost in
seconds is measured by ``benchmarks/cli_startup.py``, not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lit_rag.cli import commands as cli

pytestmark = [pytest.mark.subprocess]

#: packages none of the light commands may import (each costs seconds to import)
HEAVY = ("torch", "lightning", "transformers", "sentence_transformers", "faiss", "torchmetrics")

#: runs ``main(argv)`` as ``lit-rag`` would, then prints the heavy packages it imported
WRAPPER = """
import json, sys
from lit_rag.cli.commands import main
code = 0
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
heavy = sorted(name for name in json.loads(sys.argv[2]) if name in sys.modules)
print("HEAVY=" + json.dumps({"code": code, "heavy": heavy}))
"""


def _run(args: list[str]) -> tuple[int, list[str], str, str]:
    """Exit code, heavy packages imported, stdout (without the report) and stderr of ``args``."""
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out, _, report = proc.stdout.rpartition("HEAVY=")
    assert report, f"the wrapper did not finish: {proc.stderr[-2000:]}"
    result = json.loads(report)
    return result["code"], result["heavy"], out, proc.stderr


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory) -> str:
    """A BM25 index of the synthetic world's corpus (1307 passages, about a second)."""
    out = tmp_path_factory.mktemp("startup") / "idx"
    cli.main(["index", "build", "--corpus", "synthetic", "--retriever", "bm25", "--out", str(out)])
    return str(out)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_imports_no_torch(flag):
    code, heavy, out, _ = _run([flag])
    assert code == 0
    assert heavy == []
    assert out == cli.help_text() + "\n"


def test_plugins_imports_no_torch():
    code, heavy, out, _ = _run(["plugins"])
    assert code == 0
    assert heavy == []
    rows = [line.split()[:2] for line in out.splitlines()]
    assert ["retriever", "bm25"] in rows and ["algorithm", "grpo"] in rows


def test_bm25_search_imports_no_torch(bm25_index):
    query = ["index", "search", bm25_index, "who founded Orbel Mills", "-k", "3"]
    code, heavy, out, _ = _run(query)
    assert code == 0
    assert heavy == []
    hits = out.strip().splitlines()
    assert [line.split()[0] for line in hits] == ["1", "2", "3"]  # the ranks the command prints
    assert all("Mills" in line for line in hits)


def test_search_error_is_one_line_without_torch(tmp_path):
    code, heavy, _, err = _run(["index", "search", str(tmp_path / "nope"), "query"])
    assert code == 2
    assert heavy == []
    assert [line for line in err.splitlines() if line.startswith("lit-rag: error:")] == [
        f"lit-rag: error: index folder not found: {tmp_path / 'nope'}"
    ]


def test_help_lists_the_commands_lightning_cli_runs(capsys):
    """The fast top-level help lists the Trainer commands LightningCLI's own parser offers
    (``predict`` is not one: lit-rag does not predict), and that parser describes lit-rag."""
    with pytest.raises(SystemExit) as slow:
        cli.build_cli(["--help"])
    lightning = capsys.readouterr().out
    assert slow.value.code == 0
    assert "{fit,validate,test}" in lightning
    assert cli.DESCRIPTION in lightning
    listed = [line.split()[0] for line in cli.help_text().splitlines() if line.startswith("  ")]
    assert set(cli.TRAINER_COMMANDS) <= set(listed)
