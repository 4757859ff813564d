"""Read-only SQL over one profile or a folder of them: one DuckDB view per table.

    with open_query("out/llama/device") as q:        # a capture's dataset: model=/core=/execution=
        q.sql("SELECT core, count(*) FROM Instruction GROUP BY core").fetchall()
        q.tables                                      # views: every documented table + what is present

    neuron-profile query out/bert "SELECT opcode, count(*) FROM Instruction GROUP BY 1 ORDER BY 2 DESC"
    neuron-profile query out/llama/device "SELECT ..." --format csv -o result.csv

Views follow the reader's rules (``formats.sqlsource``): split parts read as one table, documented
columns first with typed NULLs for missing optional ones, engine names normalised, a table no
profile has is an empty view with its documented columns. Over a folder of profiles each view is the
union of the profiles' tables plus ``profile`` (the relative path) and one column per hive partition
level (``model``, ``core``, ``execution``: integers when every value is one).

**Read-only, three times over** (docs/trust.md):

1. DuckDB's own parser splits the text (``extract_statements``): exactly one statement, of a
   read-only kind -- ``SELECT`` (which DuckDB also uses for ``WITH``, ``VALUES``, ``TABLE``, ``FROM``,
   ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``), ``EXPLAIN [ANALYZE]`` of such a statement, or a ``PRAGMA``
   from a short list that only reads. ``COPY``, ``ATTACH``, ``INSTALL``/``LOAD``, ``CREATE``, ``INSERT``,
   ``SET``, ``CALL``, ``EXPORT`` ... are refused before anything runs, and so is ``EXPLAIN ANALYZE``
   of any of them (it executes what it explains).
2. The accepted statement is planned (``EXPLAIN (FORMAT json)``) and refused if the plan holds an
   operator that writes (``COPY_TO_FILE``, ``INSERT``, ``CREATE_TABLE_AS`` ...).
3. The connection is in-memory, cannot spill to disk (no ``temp_directory``), has a memory limit, can
   open no file but the profiles' Parquet parts (``allowed_paths`` with ``enable_external_access =
   false``, no extension loading), and its configuration is locked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from formats import sqlsource
from formats.dataset import ProfileEntry, find_profiles, partition_types
from formats.reader import Profile, ProfileError, open_profile, parquet_file
from formats.schema import SCHEMA
from formats.sqlsource import TableSource, ident, literal

# Statement kinds that run (DuckDB parses VALUES, TABLE, FROM, DESCRIBE, SHOW, SUMMARIZE as SELECT).
ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN", "PRAGMA")
# PRAGMAs that only read the catalog or version (``PRAGMA x = y`` parses as SET and is refused).
READ_PRAGMAS = frozenset({"table_info", "show_tables", "show_tables_expanded", "show", "version",
                          "platform", "database_list", "database_size", "functions", "storage_info",
                          "metadata_info", "user_agent", "collations"})
# Physical operators that change anything: a plan holding one is refused whatever its statement type.
WRITING_OPERATORS = frozenset({
    "INSERT", "DELETE", "UPDATE", "MERGE_INTO", "COPY_TO_FILE", "BATCH_COPY_TO_FILE",
    "FIXED_BATCH_COPY_TO_FILE", "COPY_DATABASE", "EXPORT", "CREATE_TABLE", "CREATE_TABLE_AS",
    "BATCH_CREATE_TABLE_AS", "CREATE_INDEX", "CREATE_VIEW", "CREATE_SCHEMA", "CREATE_SEQUENCE",
    "CREATE_MACRO", "CREATE_TYPE", "CREATE_SECRET", "ALTER", "DROP", "ATTACH", "DETACH", "LOAD",
    "SET", "SET_VARIABLE", "RESET", "VACUUM", "TRANSACTION", "PRAGMA", "EXTENSION", "UPDATE_EXTENSIONS",
})
# Tokens after EXPLAIN searched for the explained statement (its options are a few tokens long).
MAX_EXPLAIN_PREFIX = 64
# Default memory cap of a query session (DuckDB's own default is 80 % of RAM).
MEMORY_FRACTION = 0.5


class QueryError(ProfileError):
    """A query that cannot run (SQL error, refused statement); ``str()`` is one line."""


def error_line(exc: BaseException) -> str:
    """DuckDB's multi-line message as one line: the error and its hint, without the caret drawing."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    text = " ".join(kept[:2]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# Errors in the query itself; anything else met while running is taken for a read error and the
# profile's files are checked to name the culprit.
_SQL_ERRORS = (duckdb.ParserException, duckdb.SyntaxException, duckdb.CatalogException,
               duckdb.BinderException, duckdb.PermissionException, duckdb.ConversionException,
               duckdb.OutOfRangeException,
               duckdb.InvalidTypeException, duckdb.TypeMismatchException, duckdb.NotImplementedException,
               duckdb.ConstraintException, duckdb.InterruptException, duckdb.OutOfMemoryException)


def find_unreadable(profiles: Sequence[Profile]) -> tuple[Path, str] | None:
    """(file, table) of the first Parquet part whose pages do not decode. DuckDB's message for a
    corrupt page ("TProtocolException: Invalid data") names no file, so on that error path every
    part is decoded once to find the one to name."""
    for profile in profiles:
        for name in profile.tables:
            for file in profile.files(name):
                try:
                    for _ in parquet_file(file).iter_batches(batch_size=1 << 16):
                        pass
                except (OSError, pa.ArrowException, ValueError):
                    return file, name
    return None


def read_error(profiles: Sequence[Profile], exc: BaseException, unlocated: str = "SQL error: ") -> str:
    """One line for an error met while reading: the bad file and table when it can be found, else
    ``unlocated`` + DuckDB's message."""
    found = find_unreadable(profiles)
    if found is None:
        return f"{unlocated}{error_line(exc)}"
    file, table = found
    return f"{file}: cannot read table {table} (corrupt or truncated data): {error_line(exc)}"


class QuerySession:
    """A locked, read-only DuckDB connection with one view per profile table."""

    def __init__(self, root: str | os.PathLike[str], *, include_incomplete: bool = False,
                 threads: int | None = None, memory_limit: str | None = None) -> None:
        self.root = Path(root)
        entries, self.skipped = find_profiles(self.root, include_incomplete=include_incomplete)
        self.single = len(entries) == 1 and entries[0].name == "."
        self.profiles: list[tuple[ProfileEntry, Profile]] = [(e, open_profile(e.path)) for e in entries]
        self.partitions = {} if self.single else partition_types(entries)
        self.con = sqlsource.connect(threads=threads, memory_limit=memory_limit or default_memory_limit(),
                                     spill=False)
        self.tables: list[str] = []
        try:
            self._create_views()
            self._lock()
        except BaseException:
            self.con.close()
            raise

    # -- setup -------------------------------------------------------------------------------------
    def _create_views(self) -> None:
        names = [t.name for t in SCHEMA.persisted]
        for _, profile in self.profiles:
            names += [n for n in profile.tables if n not in names]
        for name in names:
            try:
                self.con.execute(f"CREATE VIEW {ident(name)} AS {self._view_sql(name)}")
            except duckdb.Error as exc:  # binding reads every part's footer: a part DuckDB cannot read
                raise QueryError(read_error([p for _, p in self.profiles], exc,
                                            f"{self.root}: cannot read table {name}: ")) from None
            self.tables.append(name)
        # the analyses as views over the table views (formats.analysis_sql; not listed in ``tables``:
        # they are computed, and counting their rows would run them)
        from formats.analysis_sql import view_statements

        for statement in view_statements(self.single):
            self.con.execute(statement)

    def _view_sql(self, name: str) -> str:
        branches = []
        for entry, profile in self.profiles:
            source = TableSource(profile, name)
            if not source.files:
                continue
            branches.append(source.conformed_select(self._partition_columns(entry)))
        if not branches:  # no profile has it: an empty view with the documented columns
            entry, profile = self.profiles[0]
            return TableSource(profile, name).conformed_select(self._partition_columns(entry)) + " LIMIT 0"
        return "\nUNION ALL BY NAME\n".join(branches)

    def _partition_columns(self, entry: ProfileEntry) -> list[str]:
        if self.single:
            return []
        columns = [f"{literal(entry.name)} AS profile"]
        for key, kind in self.partitions.items():
            value = entry.partitions.get(key)
            columns.append(f"{'NULL' if value is None else literal(value)}::{kind} AS {ident(key)}")
        return columns

    def _lock(self) -> None:
        """No file but the profiles' parts is reachable, and the settings cannot be changed back."""
        files = sorted({str(f) for _, p in self.profiles for name in p.tables for f in p.files(name)})
        self.con.execute(f"SET allowed_paths = [{', '.join(literal(f) for f in files)}]")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET autoinstall_known_extensions = false")
        self.con.execute("SET autoload_known_extensions = false")
        self.con.execute("SET lock_configuration = true")

    # -- queries -----------------------------------------------------------------------------------
    def check(self, sql: str) -> None:
        """Refuse anything but one read-only statement (module docstring), with one line saying why."""
        statement = _one_statement(self.con, sql)
        kind = _kind(statement)
        if kind == "EXPLAIN":
            inner = _explained(self.con, statement.query)
            if inner is None or _kind(inner) != "SELECT":
                what = "nothing it can parse" if inner is None else f"statement type {_kind(inner)}"
                raise QueryError(f"query refused: profiles are read-only; EXPLAIN here only explains a "
                                 f"SELECT (this explains {what}, and EXPLAIN ANALYZE would run it)")
            self._check_plan(inner.query)
        elif kind == "PRAGMA":
            name = _pragma_name(statement.query)
            if name not in READ_PRAGMAS:
                raise QueryError(f"query refused: PRAGMA {name or '?'} is not one of the read-only pragmas "
                                 f"({', '.join(sorted(READ_PRAGMAS))})")
        elif kind == "SELECT":
            self._check_plan(statement.query)
        else:
            raise QueryError(f"query refused: profiles are read-only and only SELECT queries run here "
                             f"(statement type {kind})")

    def _check_plan(self, sql: str) -> None:
        """Plan ``sql`` without running it and refuse it if any operator writes (second line of
        defence behind the statement type)."""
        try:
            try:
                rows = self.con.execute(f"EXPLAIN (FORMAT json) {sql}").fetchall()
            except duckdb.ParserException:  # a DuckDB without EXPLAIN options: read the text plan
                text = " ".join(str(r[1]) for r in self.con.execute(f"EXPLAIN {sql}").fetchall())
                found = sorted(op for op in WRITING_OPERATORS if "_" in op and op in text.upper())
                if found:
                    raise QueryError(f"query refused: profiles are read-only and its plan writes "
                                     f"({found[0]})") from None
                return
        except _SQL_ERRORS as exc:
            raise QueryError(f"SQL error: {error_line(exc)}") from None
        except duckdb.Error as exc:
            raise QueryError(read_error([p for _, p in self.profiles], exc)) from None
        for _, plan in rows:
            try:
                nodes = json.loads(plan)
            except ValueError:
                raise QueryError("query refused: its plan could not be checked") from None
            writer = _writing_operator(nodes)
            if writer is not None:
                raise QueryError(f"query refused: profiles are read-only and its plan writes ({writer})")

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run one read-only statement; the result is read with ``fetchall``/``fetchnumpy``/
        ``to_arrow_reader``... Raises ``QueryError`` (one line) for refused or failing SQL."""
        self.check(sql)
        try:
            return self.con.execute(sql, list(params or []))
        except _SQL_ERRORS as exc:
            raise QueryError(f"SQL error: {error_line(exc)}") from None
        except duckdb.Error as exc:
            raise QueryError(read_error([p for _, p in self.profiles], exc)) from None

    def arrow_reader(self, sql: str, batch_size: int = 65_536) -> pa.RecordBatchReader:
        """Run one read-only statement and stream its result as Arrow batches (bounded memory for
        large results: CSV/JSON/Parquet output). Errors while streaming surface as ``QueryError`` from
        ``iter_batches``."""
        self.check(sql)
        try:
            return self.con.sql(sql).to_arrow_reader(batch_size)
        except _SQL_ERRORS as exc:
            raise QueryError(f"SQL error: {error_line(exc)}") from None
        except duckdb.Error as exc:
            raise QueryError(read_error([p for _, p in self.profiles], exc)) from None

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> QuerySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_batches(reader: pa.RecordBatchReader, session: QuerySession | None = None
                 ) -> Iterator[pa.RecordBatch]:
    """The reader's batches, with DuckDB/Arrow errors raised while streaming as ``QueryError``
    (naming the corrupt file when ``session`` is given and one is found)."""
    try:
        yield from reader
    except _SQL_ERRORS as exc:
        raise QueryError(f"SQL error: {error_line(exc)}") from None
    except (duckdb.Error, pa.ArrowException) as exc:
        if session is not None:
            raise QueryError(read_error([p for _, p in session.profiles], exc)) from None
        raise QueryError(f"SQL error: {error_line(exc)}") from None


def _one_statement(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The single statement in ``sql`` as DuckDB's parser splits it (QueryError otherwise)."""
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 on the command line (lone surrogates)
        raise QueryError("SQL error: the query is not valid UTF-8 text") from None
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"SQL error: {error_line(exc)}") from None
    if not statements:
        raise QueryError("SQL error: empty query")
    if len(statements) > 1:
        raise QueryError(f"query refused: one statement per query, got {len(statements)}")
    return statements[0]


def _kind(statement: Any) -> str:
    return str(statement.type).rsplit(".", 1)[-1]


def _explained(con: duckdb.DuckDBPyConnection, sql: str) -> Any | None:
    """The statement an ``EXPLAIN [ANALYZE] [(options)] <statement>`` explains: the first suffix,
    starting at a token after ``EXPLAIN``, that DuckDB's parser reads as exactly one statement (the
    options alone never parse: ``ANALYZE COPY ...`` and ``(ANALYZE, FORMAT json) ...`` are syntax
    errors). None when no suffix parses."""
    for position, _ in duckdb.tokenize(sql)[1:MAX_EXPLAIN_PREFIX]:
        try:
            statements = con.extract_statements(sql[position:])
        except duckdb.Error:
            continue
        if len(statements) == 1:
            return statements[0]
    return None


def _pragma_name(sql: str) -> str:
    """The pragma's name: the token after ``PRAGMA``."""
    tokens = duckdb.tokenize(sql)
    if len(tokens) < 2:
        return ""
    start = tokens[1][0]
    end = tokens[2][0] if len(tokens) > 2 else len(sql)
    return sql[start:end].strip().strip('"').lower()


def _writing_operator(nodes: Any) -> str | None:
    """The first operator of a JSON plan (DuckDB's ``EXPLAIN (FORMAT json)``) that writes."""
    stack = list(nodes) if isinstance(nodes, list) else [nodes]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        name = str(node.get("name", "")).strip().upper().replace(" ", "_")
        if name in WRITING_OPERATORS:
            return name
        stack.extend(node.get("children") or [])
    return None


def default_memory_limit() -> str:
    """``MEMORY_FRACTION`` of physical memory, as a DuckDB size (``"3900MB"``)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "2GB"
    return f"{max(256, int(total * MEMORY_FRACTION) >> 20)}MB"


def open_query(root: str | os.PathLike[str], **options: Any) -> QuerySession:
    """A read-only query session over the profile (or folder of profiles) at ``root``."""
    return QuerySession(root, **options)
