"""``lit-rag index build`` is atomic and locked.

A rebuild into an existing ``--out`` runs in a subprocess and is SIGKILLed at three points: after
the index is built in memory (the temporary folder beside ``--out`` exists), after it is saved
and fsynced (just before the swap), and in the fallback swap's window between its two renames.
Each time the previous index must still load and answer exactly as before (for the window,
after the next build has put it back), and a later build must succeed and leave no temporary
folder behind. The pause points are set by patching the build in the subprocess only; the
library has no test hook.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rag.cli.commands import main
from lit_rag.retrieval.base import open_index
from lit_rag.retrieval.storage import atomic_index_dir
from tests.helpers import one_line_error

QUERIES = ["river city", "mountain lake", "bridge 3"]

# Runs one `lit-rag index build`, pausing (printing PAUSED, then sleeping) at argv[1]'s point.
PAUSING_BUILD = r"""
import os, sys, time
from lit_rag.cli.commands import main
from lit_rag.plugins.retrievers import bm25
from lit_rag.retrieval import storage

def pause():
    print("PAUSED", flush=True)
    time.sleep(120)

point, corpus, out = sys.argv[1:4]
if point == "built":
    build = bm25.BM25Retriever.build
    def built(self, passages):
        build(self, passages)
        pause()
    bm25.BM25Retriever.build = built
elif point == "saved":
    swap = storage._swap_into_place
    def saved(tmp, out_):
        pause()
        swap(tmp, out_)
    storage._swap_into_place = saved
elif point == "renamed-aside":
    storage._exchange = lambda a, b: False  # a file system without RENAME_EXCHANGE
    rename = os.rename
    def renamed(src, dst):
        if ".tmp-" in str(src):  # the second rename: the old index is aside, nothing at --out
            pause()
        rename(src, dst)
    os.rename = renamed
main(["index", "build", "--corpus", corpus, "--retriever", "bm25", "--out", out])
"""


def write_corpus(path: Path, words: str, n: int) -> Path:
    rows = [
        {"id": f"{words[:1]}{i}", "title": f"{words} {i}", "text": f"{words} number {i}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def answers(index: Path) -> list:
    return open_index(index).search(QUERIES, 3)


def leftovers(out: Path) -> list[str]:
    return sorted(
        p.name
        for p in out.parent.iterdir()
        if p.name.startswith(f".{out.name}.") and not p.name.endswith(".lock")
    )


def start_paused(point: str, corpus: Path, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSING_BUILD, point, str(corpus), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # blocks until the build reaches its pause point
        if line.strip() == "PAUSED":
            return proc
    proc.wait()
    raise AssertionError(f"the build exited ({proc.returncode}) before pausing at {point}")


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def built(tmp_path):
    """An index of corpus "old" at tmp/idx, its answers, and a different corpus "new"."""
    old = write_corpus(tmp_path / "old.jsonl", "river city bridge", 40)
    new = write_corpus(tmp_path / "new.jsonl", "mountain lake forest", 30)
    out = tmp_path / "idx"
    main(["index", "build", "--corpus", str(old), "--out", str(out)])
    return out, answers(out), new


def test_killed_rebuilds_leave_the_previous_index(built, capsys):
    out, before, new = built
    build_new = ["index", "build", "--corpus", str(new), "--out", str(out)]
    for point in ("built", "saved"):
        proc = start_paused(point, new, out)
        assert leftovers(out) == [f".{out.name}.tmp-{proc.pid}"]
        # meanwhile a second build into the same folder fails at once, naming the first
        line = one_line_error(build_new, capsys)
        assert f"index build into {out} is already running (pid {proc.pid})" in line
        kill(proc)
        assert answers(out) == before, point  # the old index, untouched
        assert leftovers(out) == [f".{out.name}.tmp-{proc.pid}"]  # until the next build

    proc = start_paused("renamed-aside", new, out)
    kill(proc)
    # the one window of the fallback swap: nothing at --out, the old index set aside
    assert not out.exists() and leftovers(out) == [
        f".{out.name}.old-{proc.pid}",
        f".{out.name}.tmp-{proc.pid}",
    ]
    line = one_line_error(["index", "search", str(out), "river"], capsys)
    assert f"left the previous index at {out.parent / f'.{out.name}.old-{proc.pid}'}" in line
    # the next build puts it back before anything else; this one then fails on its corpus
    line = one_line_error(
        ["index", "build", "--corpus", str(out.parent / "missing.jsonl"), "--out", str(out)], capsys
    )
    assert "missing.jsonl" in line
    assert answers(out) == before and leftovers(out) == []

    main(build_new)  # and a rebuild succeeds, cleanly
    assert leftovers(out) == []
    assert answers(out) != before and open_index(out).passages[0].id == "m0"


def test_build_fails_while_another_holds_the_lock(built, capsys):
    out, before, new = built
    with open(out.parent / f".{out.name}.lock", "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate()
        lock.write("4242\n")
        lock.flush()
        line = one_line_error(["index", "build", "--corpus", str(new), "--out", str(out)], capsys)
    assert f"index build into {out} is already running (pid 4242)" in line
    assert answers(out) == before
    main(["index", "build", "--corpus", str(new), "--out", str(out)])  # lock released: fine
    assert answers(out) != before


def test_out_must_be_an_index_or_empty(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.jsonl", "river city bridge", 5)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    line = one_line_error(["index", "build", "--corpus", str(corpus), "--out", str(notes)], capsys)
    assert "is not a lit-rag index (no manifest.json)" in line
    assert (notes / "todo.txt").read_text() == "mine"  # a build never replaces user files
    (tmp_path / "empty").mkdir()
    main(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "empty")])
    assert len(answers(tmp_path / "empty")) == len(QUERIES)


def test_a_failed_build_leaves_no_temporary_folder(tmp_path):
    out = tmp_path / "idx"
    with (
        pytest.raises(RuntimeError, match="encoder ran out of memory"),
        atomic_index_dir(out) as folder,
    ):
        (folder / "half-written").write_text("x")
        raise RuntimeError("encoder ran out of memory")
    assert not out.exists() and leftovers(out) == []
