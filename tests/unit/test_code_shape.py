"""The shape docs/STYLE.md asks of lit_rag's code: no module over 600 lines, no function over 60
lines unless a ``# long: <reason>`` line sits right above it (or above its first decorator)."""

import ast
from pathlib import Path

MAX_FILE_LINES = 600
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


def test_no_module_is_over_600_lines():
    sizes = {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert [f"{p} ({n})" for p, n in sizes.items() if n > MAX_FILE_LINES] == []


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
