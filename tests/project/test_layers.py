"""Imports run down the layers (docs/DESIGN.md, "Layers and the public plugin API"), each layer
a set of folders of ``lit_rag/``:

    commands         cli/, evaluate/, report/, data/prepare/, __main__.py, recipe.py (the
                     commands from Python): wire things together
    callbacks        callbacks/
    built-in plugins plugins/: algorithms, rewards, environments, retrievers, engines, tools
    public API       api.py
    core             every other folder and root module: contracts, trainer, models, rollout,
                     retrieval, data, metrics, checkpoints, health, and the vocabulary (types,
                     text, errors, registry, rng, files)

A module imports its own layer and the layers below it; a plugin imports only ``lit_rag.api``.
A new folder is core unless it is named here. Read from the source (every ``import`` statement,
also those inside functions), so an import added anywhere in a module is caught without running
it.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
    assert kinds == {"algorithms", "rewards", "environments", "retrievers", "engines", "tools"}
    assert len(plugins) >= 20
    bad = {
        _relative(p): sorted(m for m in _lit_rag_imports(p) if m != "lit_rag.api") for p in plugins
    }
    assert {k: v for k, v in bad.items() if v} == {}


#: the folders (and root modules) of each layer above the core, top first
LAYERS = {
    "commands": ("cli", "evaluate", "report", "data/prepare", "__main__.py", "recipe.py"),
    "callbacks": ("callbacks",),
    "plugins": ("plugins",),
    "api": ("api.py",),
}
ORDER = [*LAYERS, "core"]


def layer_of(relative: str) -> str:
    """The layer of a module by its path under ``lit_rag/`` (``trainer/update.py``)."""
    for layer, homes in LAYERS.items():
        if any(relative == home or relative.startswith(home + "/") for home in homes):
            return layer
    return "core"


def module_layer(module: str) -> str:
    """The layer of a dotted module name (a package's name is its folder's)."""
    relative = module.removeprefix("lit_rag").lstrip(".").replace(".", "/")
    if relative == "":
        return "core"
    if (PACKAGE / f"{relative}.py").exists():
        return layer_of(f"{relative}.py")
    return layer_of(relative)


def test_every_module_imports_only_its_layer_and_those_below():
    bad = {}
    for path in _modules():
        here = ORDER.index(layer_of(_relative(path)))
        up = sorted(m for m in _lit_rag_imports(path) if ORDER.index(module_layer(m)) < here)
        if up:
            bad[_relative(path)] = up
    assert bad == {}


def test_the_layers_name_folders_that_exist():
    for homes in LAYERS.values():
        for home in homes:
            assert (PACKAGE / home).exists(), home


def test_the_layer_of_a_module_is_read_from_its_folder():
    assert layer_of("cli/fit.py") == "commands"
    assert layer_of("data/prepare/sampling.py") == "commands"
    assert layer_of("data/readers.py") == "core"
    assert layer_of("plugins/rewards/arena.py") == "plugins"
    assert layer_of("trainer/update.py") == "core"
    assert module_layer("lit_rag.api") == "api"
    assert module_layer("lit_rag.callbacks") == "callbacks"
    assert module_layer("lit_rag.contracts.methods") == "core"


def test_the_api_reexports_only_the_core():
    """The names :mod:`lit_rag.api` imports on first use come from the core, never a plugin."""
    import lit_rag.api as api

    assert {n: m for n, (m, _) in api._LAZY.items() if module_layer(m) != "core"} == {}


def test_at_most_a_dozen_modules_at_the_package_root():
    """The root keeps the public vocabulary; every family of modules is a package."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 12, root


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from lit_rag.plugins.rewards.qa import F1Reward\n"
        "    import lit_rag.cli.commands\n"
        "from lit_rag import registry\n"
    )
    assert _lit_rag_imports(source) == {
        "lit_rag.plugins.rewards.qa",
        "lit_rag.cli.commands",
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
