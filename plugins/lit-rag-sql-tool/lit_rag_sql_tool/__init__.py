"""Read-only SQL over a SQLite database, as two tools an agent calls: ``sql`` runs one query,
``sql_tables`` lists the tables and their columns.

Written against ``lit_rag.api`` alone. Read-only twice over: the file is opened with
``mode=ro`` (SQLite itself refuses every write), and a query must be one ``SELECT`` or ``WITH``
statement (anything else is refused before it reaches SQLite, with a reason the model can act
on). Each query runs under a time limit (SQLite's progress handler aborts it) and shows at most
``max_rows`` rows. A failure is a :class:`~lit_rag.api.ToolError` carrying SQLite's own message
(``no such table: x``), which the model reads as the call's result.
"""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from lit_rag.api import Tool, ToolError

#: SQLite virtual-machine instructions between two checks of the time limit
CHECK_EVERY = 1000
#: leading whitespace and comments, skipped to find a query's first keyword
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)


class SqliteTool(Tool):
    """The database both tools read: checked at construction, opened read-only per call (a
    connection belongs to the thread that opened it, and calls run in worker threads).

    Args:
        database: Path to a SQLite file (``.sqlite``, ``.db``); required.
        **settings: :class:`~lit_rag.api.Tool`'s ``timeout_s``, ``max_concurrency``,
            ``cache_size``.

    Raises:
        ValueError: No ``database``, or a file that does not exist or is not a SQLite database
            (one line).
    """

    def __init__(self, database: str | None = None, **settings) -> None:
        super().__init__(**settings)
        if not database:  # a recipe that lists the tool by its bare name
            raise ValueError(
                f"tool {self.name}: init_args.database is required (a SQLite file), e.g. "
                f"{{name: {self.name}, init_args: {{database: data/company.sqlite}}}}"
            )
        path = Path(database).expanduser()
        if not path.is_file():
            raise ValueError(f"tool {self.name}: database {database!r} does not exist")
        self.database = path.resolve()
        try:
            with closing(self.connect()) as conn:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise ValueError(
                f"tool {self.name}: database {database!r} is not a SQLite database ({exc})"
            ) from None

    def connect(self) -> sqlite3.Connection:
        """A new read-only connection (``mode=ro``: SQLite refuses every write)."""
        conn = sqlite3.connect(f"{self.database.as_uri()}?mode=ro", uri=True)
        conn.execute("PRAGMA query_only = ON")
        return conn


class SqlTool(SqliteTool):
    """``sql(query)``: one read-only query; its rows as a table, at most ``max_rows`` of them.

    Args:
        database: Path to a SQLite file.
        max_rows: Rows shown; the rest are counted ("N more rows not shown").
        query_timeout_s: A query that runs longer is stopped (SQLite's progress handler) and
            the model is told to narrow it; below ``timeout_s``, so the model reads this reason
            rather than a bare timeout.
        **settings: :class:`~lit_rag.api.Tool`'s ``timeout_s``, ``max_concurrency``,
            ``cache_size``.

    Example:
        >>> tool = SqlTool("data/company.sqlite", max_rows=2)  # doctest: +SKIP
        >>> print(tool.run("SELECT name, dept FROM employees ORDER BY name"))  # doctest: +SKIP
        | name | dept |
        | --- | --- |
        | Ada | R&D |
        | Bob | Sales |
        (3 more rows not shown)
    """

    name = "sql"
    parameters = {  # noqa: RUF012 (read only)
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "One SELECT (or WITH ... SELECT) statement, SQLite dialect.",
            }
        },
        "required": ["query"],
    }

    def __init__(
        self,
        database: str | None = None,
        max_rows: int = 20,
        query_timeout_s: float = 10.0,
        **settings,
    ) -> None:
        super().__init__(database, **settings)
        if max_rows < 1:
            raise ValueError(f"tool sql: max_rows must be >= 1, got {max_rows}")
        if not 0 < query_timeout_s < self.timeout_s:
            raise ValueError(
                f"tool sql: query_timeout_s must be > 0 and below timeout_s ({self.timeout_s:g}),"
                f" got {query_timeout_s:g}"
            )
        self.max_rows, self.query_timeout_s = max_rows, query_timeout_s
        self.description = (
            "Run one read-only SQL query (a single SELECT or WITH statement, SQLite dialect) on "
            f"the database and return the rows as a table, at most {max_rows} of them."
        )

    def run(self, query: str) -> str:
        check_select(query)
        with closing(self.connect()) as conn:
            deadline = time.monotonic() + self.query_timeout_s
            conn.set_progress_handler(lambda: time.monotonic() > deadline, CHECK_EVERY)
            try:
                cursor = conn.execute(query)
                columns = [d[0] for d in cursor.description or ()]
                rows = cursor.fetchmany(self.max_rows)
            except sqlite3.Error as exc:
                raise ToolError(self._reason(exc)) from None
            try:
                more: int | None = sum(1 for _ in cursor)  # counted, not kept
            except sqlite3.Error as exc:
                if not interrupted(exc):
                    raise ToolError(str(exc)) from None
                more = None  # the time limit stopped the count, not the query's rows
        return table(columns, rows, more)

    def _reason(self, exc: sqlite3.Error) -> str:
        if interrupted(exc):
            return (
                f"the query ran past {self.query_timeout_s:g} s and was stopped; narrow it "
                "(a WHERE, a LIMIT, fewer joins)"
            )
        if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in str(exc):
            return "send one statement per call"
        return str(exc)


class SqlTablesTool(SqliteTool):
    """``sql_tables()``: every table and view of the database with its columns and their types,
    one per line (``employees(id INTEGER, name TEXT)``).

    Args:
        database: Path to a SQLite file.
        **settings: :class:`~lit_rag.api.Tool`'s ``timeout_s``, ``max_concurrency``,
            ``cache_size``.
    """

    name = "sql_tables"
    description = "List the database's tables and views with their columns and column types."
    parameters = {"type": "object", "properties": {}}  # noqa: RUF012 (read only)

    def run(self) -> str:
        with closing(self.connect()) as conn:
            tables = conn.execute(
                "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()
            lines = []
            for name, kind in tables:
                columns = conn.execute(
                    "SELECT name, type FROM pragma_table_info(?) ORDER BY cid", (name,)
                ).fetchall()
                listed = ", ".join(f"{c} {t}".strip() for c, t in columns)
                lines.append(f"{name}({listed})" + (" -- view" if kind == "view" else ""))
        return "\n".join(lines) or "The database has no tables."


def check_select(query: str) -> None:
    """Refuse anything but a ``SELECT`` or ``WITH`` statement, with a reason in one line.

    Example:
        >>> check_select("/* top earners */ SELECT name FROM employees")
        >>> check_select("DELETE FROM employees")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ToolError: only SELECT or WITH queries are allowed (the database is read-only); got DELETE
    """
    rest = query[_LEADING.match(query).end() :]
    if not rest:
        raise ToolError("the query is empty")
    keyword = re.match(r"\w*", rest).group().upper() or rest[:1]
    if keyword not in ("SELECT", "WITH"):
        raise ToolError(
            f"only SELECT or WITH queries are allowed (the database is read-only); got {keyword}"
        )


def interrupted(exc: sqlite3.Error) -> bool:
    """The progress handler stopped the query (its time limit)."""
    return isinstance(exc, sqlite3.OperationalError) and str(exc) == "interrupted"


def cell(value: object) -> str:
    """One value as table text: NULL for None, a blob by its size, one line, pipes escaped."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return " ".join(str(value).split()).replace("|", "\\|")


def table(columns: list[str], rows: list[tuple], more: int | None) -> str:
    """Rows as a Markdown table, then what was left out.

    Example:
        >>> print(table(["id", "name"], [(1, "Ada"), (2, None)], 3))
        | id | name |
        | --- | --- |
        | 1 | Ada |
        | 2 | NULL |
        (3 more rows not shown)
    """
    lines = [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]
    if not rows:
        lines.append("(no rows)")
    elif more is None:
        lines.append("(more rows not shown: too many to count in the time limit)")
    elif more:
        lines.append(f"({more} more row{'s' if more > 1 else ''} not shown)")
    return "\n".join(lines)
