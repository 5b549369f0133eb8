"""Imports run down the layers (docs/DESIGN.md, "Layers and the public plugin API").

    cli, trainer_cli, index_cli,        top: wire things together
    export, compare, evaluate, prepare
    callbacks
    built-in plugins                    lit_rag/plugins/: algorithms, rewards, environments,
                                        retrievers, engines
    public plugin API                   lit_rag/api.py
    core                                everything else (registry, data, modules, metrics,
                                        retrieval and rollout machinery, the contracts)

Read from the source (every ``import`` statement, also those inside functions), so an import
added anywhere in a module is caught without running it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lit_rag"


def _modules(folder: str = "") -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def _lit_rag_imports(path: Path) -> set[str]:
    """Every ``lit_rag`` module ``path`` imports (``from lit_rag import x`` counts as
    ``lit_rag.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(
                alias.name for alias in node.names if alias.name.split(".")[0] == "lit_rag"
            )
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "lit_rag"
        ):
            if node.module == "lit_rag":
                found.update(f"lit_rag.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_built_in_plugins_import_only_the_public_api():
    plugins = [p for p in _modules("plugins") if p.name != "__init__.py"]
    kinds = {_relative(p).split("/")[1] for p in plugins}
    assert kinds == {"algorithms", "rewards", "environments", "retrievers", "engines"}
    assert len(plugins) >= 20
    bad = {
        _relative(p): sorted(m for m in _lit_rag_imports(p) if m != "lit_rag.api") for p in plugins
    }
    assert {k: v for k, v in bad.items() if v} == {}


#: the top layer's modules outside plugins/ and callbacks/: the commands
TOP_LAYER_FILES = (
    "cli.py",
    "trainer_cli.py",
    "index_cli.py",
    "api.py",
    "__main__.py",
    "export.py",
    "compare.py",
    "evaluate.py",
    "prepare.py",
)


def test_core_never_imports_plugins_the_api_callbacks_or_the_cli():
    top = (
        "lit_rag.plugins",
        "lit_rag.callbacks",
        "lit_rag.cli",
        "lit_rag.trainer_cli",
        "lit_rag.api",
    )
    core = [
        p
        for p in _modules()
        if not _relative(p).startswith(("plugins/", "callbacks/"))
        and _relative(p) not in TOP_LAYER_FILES
    ]
    bad = {_relative(p): sorted(m for m in _lit_rag_imports(p) if _is_under(m, *top)) for p in core}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("folder", ["retrieval", "rollout", "metrics", "data"])
def test_machinery_below_the_modules(folder: str):
    """Retrieval, rollout, metrics and data never reach up into the LightningModules (model
    loading facts they need live in lit_rag.models)."""
    bad = {
        _relative(p): sorted(m for m in _lit_rag_imports(p) if _is_under(m, "lit_rag.modules"))
        for p in _modules(folder)
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from lit_rag.plugins.rewards.qa import F1Reward\n    import lit_rag.cli\n"
        "from lit_rag import registry\n"
    )
    assert _lit_rag_imports(source) == {
        "lit_rag.plugins.rewards.qa",
        "lit_rag.cli",
        "lit_rag.registry",
    }


def test_every_built_in_plugin_lives_under_plugins():
    """The entry points lit-rag registers for itself all point into lit_rag/plugins/."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    targets = {
        f"{group}: {name}": target.split(":")[0]
        for group, entries in project["entry-points"].items()
        if group.startswith("lit_rag.")
        for name, target in entries.items()
    }
    assert len(targets) >= 20
    assert {k: v for k, v in targets.items() if not v.startswith("lit_rag.plugins.")} == {}


def test_the_old_base_paths_are_gone():
    for kind in ("algorithms", "rewards", "environments"):
        assert not (PACKAGE / "plugins" / kind / "base.py").exists()
