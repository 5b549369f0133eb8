"""The sql and sql_tables tools over a five-row database built in the test: their schemas, a
result table, the row limit, refusals, SQLite's errors, one call through the ToolBox and the
entry points."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from lit_rag_sql_tool import SqlTablesTool, SqlTool

from lit_rag import registry
from lit_rag.api import ToolBox, ToolCall, ToolError, ToolResult, build_tools

EMPLOYEES = [
    (1, "Ada", "R&D", 120),
    (2, "Bob", "Sales", 80),
    (3, "Cy", "R&D", 95),
    (4, "Di", "Sales", None),
    (5, "Ed", "Ops", 70),
]


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "company.sqlite"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, dept TEXT, pay)")
        conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?)", EMPLOYEES)
        conn.execute("CREATE VIEW depts AS SELECT DISTINCT dept FROM employees")
        conn.commit()
    return path


def test_schemas(database: Path) -> None:
    sql = SqlTool(str(database), max_rows=3).schema()["function"]
    assert sql["name"] == "sql" and "at most 3 of them" in sql["description"]
    assert sql["parameters"]["required"] == ["query"]
    tables = SqlTablesTool(str(database)).schema()["function"]
    assert tables["name"] == "sql_tables"
    assert tables["parameters"] == {"type": "object", "properties": {}}


def test_tables_lists_columns_and_views(database: Path) -> None:
    assert SqlTablesTool(str(database)).run() == (
        "depts(dept TEXT) -- view\nemployees(id INTEGER, name TEXT, dept TEXT, pay)"
    )


def test_select_is_a_table(database: Path) -> None:
    tool = SqlTool(str(database))
    query = "-- R&D first\nSELECT name, pay FROM employees WHERE id IN (1, 4) ORDER BY id;"
    assert tool.run(query) == "| name | pay |\n| --- | --- |\n| Ada | 120 |\n| Di | NULL |"
    assert tool.run("WITH r AS (SELECT * FROM employees WHERE dept = 'Ops') SELECT name FROM r")
    assert tool.run("SELECT name FROM employees WHERE id > 9").endswith("(no rows)")


def test_max_rows_says_how_many_are_cut(database: Path) -> None:
    lines = SqlTool(str(database), max_rows=2).run("SELECT id FROM employees ORDER BY id")
    # 5 rows, 2 shown: header, rule, 2 rows, then the 3 left out
    assert lines.splitlines() == ["| id |", "| --- |", "| 1 |", "| 2 |", "(3 more rows not shown)"]


def test_writes_are_refused_and_change_nothing(database: Path) -> None:
    tool = SqlTool(str(database))
    for query, got in [
        ("DELETE FROM employees", "got DELETE"),
        ("  /* tidy */ DROP TABLE employees", "got DROP"),
        ("ATTACH 'x.db' AS x", "got ATTACH"),
    ]:
        with pytest.raises(ToolError, match=f"only SELECT or WITH queries are allowed.*{got}$"):
            tool.run(query)
    # a WITH that writes passes the keyword check; the read-only file refuses it
    with pytest.raises(ToolError, match="readonly|read-only"):
        tool.run("WITH x AS (SELECT 1) DELETE FROM employees")
    with pytest.raises(ToolError, match="one statement per call"):
        tool.run("SELECT 1; DELETE FROM employees")
    with pytest.raises(ToolError, match="the query is empty"):
        tool.run(" -- nothing\n")
    with closing(sqlite3.connect(database)) as conn:
        assert conn.execute("SELECT count(*) FROM employees").fetchone() == (5,)


def test_sqlite_errors_are_tool_errors(database: Path) -> None:
    tool = SqlTool(str(database))
    with pytest.raises(ToolError, match="^no such table: staff$"):
        tool.run("SELECT * FROM staff")
    with pytest.raises(ToolError, match='near "FORM": syntax error'):
        tool.run("SELECT * FORM employees")


def test_a_long_query_is_stopped_at_its_time_limit(database: Path) -> None:
    tool = SqlTool(str(database), query_timeout_s=0.05)
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"
    with pytest.raises(ToolError, match="ran past 0.05 s and was stopped; narrow it"):
        tool.run(endless)


def test_bad_settings_fail_at_construction_in_one_line(database: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"^tool sql: database '\S+missing.sqlite' does not exist$"
    ):
        SqlTool(str(tmp_path / "missing.sqlite"))
    (tmp_path / "notes.txt").write_text("not a database " * 100)
    with pytest.raises(ValueError, match="is not a SQLite database"):
        SqlTablesTool(str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        SqlTool(str(database), max_rows=0)
    with pytest.raises(ValueError, match=r"below timeout_s \(5\), got 10"):
        SqlTool(str(database), timeout_s=5)


def test_the_readmes_tool_list_builds(database: Path) -> None:
    spec = {"database": str(database)}
    tools = build_tools(
        [{"name": "sql", "init_args": spec}, {"name": "sql_tables", "init_args": spec}, "answer"],
        retriever=None,
    )
    assert [type(t) for t in tools[:2]] == [SqlTool, SqlTablesTool]
    with pytest.raises(ValueError, match=r"^tool sql_tables: init_args.database is required"):
        build_tools(["sql_tables"])


def test_through_the_toolbox_a_failure_is_a_result(database: Path) -> None:
    box = ToolBox([SqlTool(str(database)), SqlTablesTool(str(database))])
    try:
        good, bad, tables = box.call_all(
            [
                ToolCall("sql", {"query": "SELECT count(*) AS n FROM employees"}),
                ToolCall("sql", {"query": "SELECT * FROM staff"}),
                ToolCall("sql_tables", {}),
            ]
        )
    finally:
        box.close()
    assert isinstance(bad, ToolResult)
    assert (bad.error, bad.text) == ("tool_error", "Error: sql failed: no such table: staff")
    assert (good.error, good.text) == ("", "| n |\n| --- |\n| 5 |")
    assert tables.text.startswith("depts(dept TEXT)")


def test_registered_by_name() -> None:
    registry.clear_cache()
    assert registry.resolve("tool", "sql") is SqlTool
    assert registry.resolve("tool", "sql_tables") is SqlTablesTool
    assert registry.available("tool")["sql"].package == "lit-rag-sql-tool"
