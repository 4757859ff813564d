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

**Read-only, twice over.** Only ``SELECT`` (and ``EXPLAIN``) statements are accepted -- ``COPY``,
``ATTACH``, ``INSTALL``, ``CREATE``, ``SET``, ``PRAGMA`` ... are refused before they run -- and the
connection itself can reach no file but the profiles' Parquet parts (``allowed_paths`` with
``enable_external_access = false``, then ``lock_configuration``), so even a statement that slipped
through could neither write nor read anything else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from formats import sqlsource
from formats.dataset import ProfileEntry, find_profiles, partition_types
from formats.reader import Profile, ProfileError, open_profile
from formats.schema import SCHEMA
from formats.sqlsource import TableSource, ident, literal

ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


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
    import pyarrow.parquet as pq

    for profile in profiles:
        for name in profile.tables:
            for file in profile.files(name):
                try:
                    for _ in pq.ParquetFile(file).iter_batches(batch_size=1 << 16):
                        pass
                except (OSError, pa.ArrowException):
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
                 threads: int | None = None) -> None:
        self.root = Path(root)
        entries, self.skipped = find_profiles(self.root, include_incomplete=include_incomplete)
        self.single = len(entries) == 1 and entries[0].name == "."
        self.profiles: list[tuple[ProfileEntry, Profile]] = [(e, open_profile(e.path)) for e in entries]
        self.partitions = {} if self.single else partition_types(entries)
        self.con = sqlsource.connect(threads=threads)
        self.tables: list[str] = []
        self._create_views()
        self._lock()

    # -- setup -------------------------------------------------------------------------------------
    def _create_views(self) -> None:
        names = [t.name for t in SCHEMA.persisted]
        for _, profile in self.profiles:
            names += [n for n in profile.tables if n not in names]
        for name in names:
            self.con.execute(f"CREATE VIEW {ident(name)} AS {self._view_sql(name)}")
            self.tables.append(name)

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
        """Refuse anything but one SELECT/EXPLAIN statement, with one line saying why."""
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise QueryError(f"SQL error: {error_line(exc)}") from None
        if not statements:
            raise QueryError("SQL error: empty query")
        if len(statements) > 1:
            raise QueryError(f"one statement per query, got {len(statements)}")
        kind = str(statements[0].type).rsplit(".", 1)[-1]
        if kind not in ALLOWED_STATEMENTS:
            raise QueryError(f"query refused: profiles are read-only and only SELECT queries run here "
                             f"(statement type {kind})")

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


def open_query(root: str | os.PathLike[str], **options: Any) -> QuerySession:
    """A read-only query session over the profile (or folder of profiles) at ``root``."""
    return QuerySession(root, **options)
