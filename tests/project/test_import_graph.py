"""No circle in lit_rag's import graph: a module never imports, even lazily inside a function, a
module that imports it back (directly or through others).

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ... import``
anywhere in a module (function bodies included) except under ``if TYPE_CHECKING:``, which
never runs. Relative imports are resolved; importing a package is an edge to its
``__init__``; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. Imports of modules outside the package are left out, and so are the packages above
an imported module: Python runs their ``__init__`` first, but a package's ``__init__`` importing
its own modules is what a package is, not a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lit_rag"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package at ``root`` (``pkg.sub`` for
    ``pkg/sub/__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, skipping the bodies of ``if TYPE_CHECKING:``."""
    found = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from <node.module>`` names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    package = parts if is_package else parts[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _targets(module: str, is_package: bool, node: ast.AST, known: set[str]) -> set[str]:
    """The package's modules one import statement in ``module`` loads."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = _base(module, is_package, node)
    targets = set()
    for alias in node.names:
        child = f"{base}.{alias.name}"
        if child in known:
            targets.add(child)
        elif base in known:
            targets.add(base)
    return targets


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (see the module docstring)."""
    files = module_names(root)
    known = set(files)
    graph = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {
            target
            for node in _imports(tree)
            for target in _targets(module, is_package, node, known)
        }
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module an import chain from ``start`` reaches (``start`` only through a circle)."""
    seen: set[str] = set()
    pending = [start]
    while pending:
        for child in graph[pending.pop()] - seen:
            seen.add(child)
            pending.append(child)
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a circle (two or more modules,
    or one importing itself), each sorted: the modules that reach one another. The package
    has a few hundred modules, so reachability from each is cheap and plainer than Tarjan's."""
    reach = {module: _reachable(graph, module) for module in graph}
    found = {
        tuple(sorted(other for other in reach[module] if module in reach[other]))
        for module in graph
        if module in reach[module]
    }
    return sorted(list(component) for component in found)


def test_lit_rag_has_no_import_circle():
    found = circles(import_graph(PACKAGE))
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_finds_a_circle_through_a_lazy_import(tmp_path):
    # a -> b at import time, b -> a inside a function: a circle; c imports a only for typing,
    # d imports the subpackage (an edge to its __init__), whose __init__ imports d back
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from .a import g\n    return g\n",
            "c.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.a import g\n"
            ),
            "d.py": "import pkg.sub\nimport os\n",
            "sub/__init__.py": "from .. import d\n",
            "sub/e.py": "from . import f\nfrom pkg.sub import value\n",
            "sub/f.py": "",
        },
    )
    graph = import_graph(tmp_path / "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
        "pkg.c": set(),
        "pkg.d": {"pkg.sub"},
        "pkg.sub": {"pkg.d"},
        "pkg.sub.e": {"pkg.sub.f", "pkg.sub"},
        "pkg.sub.f": set(),
    }
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub"]]


def test_the_checker_finds_a_longer_circle_and_none_in_a_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert circles({"a": {"a"}}) == [["a"]]
