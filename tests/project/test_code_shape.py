"""The shape docs/STYLE.md asks of lit_rag's code: a family of modules is a package (no two
modules of a folder share a name prefix: ``evaluate_table.py`` beside ``evaluate.py`` is
``evaluate/table.py``), and no function is over 60 lines unless a ``# long: <reason>`` line sits
right above it (or above its first decorator)."""

import ast
from pathlib import Path

MAX_FUNCTION_LINES = 60
PACKAGE = Path(__file__).resolve().parents[2] / "lit_rag"


def long_functions(path: Path) -> list[str]:
    """``path:line name (n lines)`` of each function over the limit without a reason."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        length = node.end_lineno - start + 1
        above = lines[start - 2].strip() if start > 1 else ""
        if length > MAX_FUNCTION_LINES and not above.startswith("# long: "):
            found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


def families(folder: Path) -> list[str]:
    """Modules of ``folder`` named ``<prefix>_<rest>.py`` beside another module starting with
    ``<prefix>``: a family that wants a package of its own."""
    names = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    found = []
    for name in names:
        prefix = name.split("_")[0]
        kin = [n for n in names if n != name and (n == prefix or n.startswith(prefix + "_"))]
        if "_" in name and kin:
            found.append(f"{folder.name}/{name}.py (beside {', '.join(kin)})")
    return found


#: folders whose shared prefixes are words of the field, not families of one part
NOT_FAMILIES = {"metrics", "callbacks"}


def test_a_family_of_modules_is_a_package():
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    found = [f for d in folders if d.name not in NOT_FAMILIES for f in families(d)]
    assert found == []


def test_the_family_check_sees_a_prefix_family(tmp_path):
    for name in ("evaluate", "evaluate_table", "report", "reward_model", "cpu_strategies"):
        (tmp_path / f"{name}.py").write_text("")
    assert families(tmp_path) == [f"{tmp_path.name}/evaluate_table.py (beside evaluate)"]


def test_no_function_is_over_60_lines_without_a_reason():
    assert [f for p in sorted(PACKAGE.rglob("*.py")) for f in long_functions(p)] == []


def test_the_length_check_sees_a_long_function_and_its_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    plain = tmp_path / "plain.py"
    plain.write_text("import functools\n\n\n@functools.cache\ndef f():\n" + body)
    assert long_functions(plain) == [f"{plain}:5 f (62 lines)"]
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text("# long: one table, row by row\ndef f():\n" + body)
    assert long_functions(reasoned) == []
