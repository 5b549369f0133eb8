"""``lit-rag fit`` re-executes itself once with tcmalloc preloaded, and only then."""

import sys

import pytest

from lit_rag.cli import preload


@pytest.fixture
def library(tmp_path, monkeypatch):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.setattr(preload, "TCMALLOC", ("/nonexistent/libtcmalloc.so.4", str(lib)))
    monkeypatch.setattr(sys, "platform", "linux")
    return str(lib)


def test_trainer_command_is_rerun_with_the_library_first(library, tmp_path):
    script = tmp_path / "lit-rag"
    script.write_text("")
    argv, env = preload.preloaded_command(
        [str(script), "fit", "--config", "r.yaml"], {"LD_PRELOAD": "/x/other.so"}
    )
    assert argv == [sys.executable, str(script), "fit", "--config", "r.yaml"]
    assert env["LD_PRELOAD"] == f"{library} /x/other.so"
    assert env["LIT_RAG_PRELOAD"] == "0"  # the re-run does not re-run again
    assert preload.preloaded_command(argv[1:], env) is None


@pytest.mark.parametrize(
    "argv, environ",
    [
        (["SCRIPT", "plugins"], {}),  # not a trainer command: started as it is
        (["SCRIPT"], {}),
        (["SCRIPT", "fit"], {"LIT_RAG_PRELOAD": "0"}),  # switched off
        (["SCRIPT", "fit"], {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}),  # already there
        (["/no/such/script", "fit"], {}),  # nothing to re-run
    ],
)
def test_nothing_to_do(library, tmp_path, argv, environ):
    script = tmp_path / "lit-rag"
    script.write_text("")
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    assert preload.preloaded_command(argv, environ) is None


def test_no_library_no_rerun(monkeypatch, tmp_path):
    monkeypatch.setattr(preload, "TCMALLOC", ("/nonexistent/libtcmalloc.so.4",))
    script = tmp_path / "lit-rag"
    script.write_text("")
    assert preload.preloaded_command([str(script), "fit"], {}) is None
