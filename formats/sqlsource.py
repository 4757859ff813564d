"""Profile tables as DuckDB SQL: quoting, Parquet scans over a table's parts, conformed column lists.

Everything in formats that runs SQL over a profile (summary, query layer, viewport) builds its FROM
clauses here, so the reader's leniency rules hold in SQL too: a table's parts are scanned as one
(``union_by_name``, so parts with extra or missing columns line up), a missing table is an empty
relation with the documented columns, a missing optional column is a typed NULL, and engine names are
normalised to ``Tensor``/``Vector``/``Scalar``/``GpSimd``/``Sync`` whatever the writer's spelling.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from formats.schema import ENGINE_ALIASES, ENGINE_COLUMNS, SCHEMA

if TYPE_CHECKING:
    from formats.reader import Profile

# Schema type names (profile-schema.md §2.4) -> DuckDB types.
DUCK_TYPES: dict[str, str] = {
    "string": "VARCHAR", "int64": "BIGINT", "int32": "INTEGER", "float32": "FLOAT", "float64": "DOUBLE",
    "bool": "BOOLEAN", "array<int64>": "BIGINT[]", "array<string>": "VARCHAR[]",
}


def connect(*, threads: int | None = None, memory_limit: str | None = None,
            spill: bool = True) -> duckdb.DuckDBPyConnection:
    """A private in-memory DuckDB connection (never the process-wide default one, whose settings other
    code may change). ``threads`` defaults to DuckDB's choice (all cores); ``spill=False`` gives it no
    temporary directory, so it never writes a file (a query over the memory limit fails instead)."""
    config: dict[str, str | bool | int | float | list[str]] = {}
    if not spill:
        config["temp_directory"] = ""
    if threads:
        config["threads"] = int(threads)
    if memory_limit:
        config["memory_limit"] = memory_limit
    con = duckdb.connect(":memory:", config=config)
    con.execute("SET preserve_insertion_order = false")  # lets scans run in parallel; we ORDER BY if needed
    return con



def arrow_table(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """A query's result as an Arrow table: strings stay in Arrow buffers, never Python objects.

    DuckDB renamed the method across releases (2.x ``to_arrow_table``, 1.x ``fetch_arrow_table`` /
    ``arrow``, the latter returning a reader in some versions); the pyproject allows both."""
    relation = con.sql(sql)
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        method = getattr(relation, name, None)
        if method is not None:
            result = method()
            return result if isinstance(result, pa.Table) else result.read_all()
    raise RuntimeError("this DuckDB cannot return Arrow tables")

def literal(value: str | os.PathLike[str]) -> str:
    """A SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def ident(name: str) -> str:
    """A quoted SQL identifier (table and column names come from files, never trusted as SQL)."""
    return '"' + name.replace('"', '""') + '"'


def parquet_scan(files: Sequence[Path]) -> str:
    """One scan over a table's parts; parts with different column sets are aligned by name. Each part's
    page checksums are verified first (once per process): DuckDB checks none, and some corrupt pages
    crash it (``formats.integrity``)."""
    from formats.integrity import verify_parts  # imports the reader, which imports this module's users

    verify_parts(list(files))
    listed = ", ".join(literal(f) for f in files)
    return f"read_parquet([{listed}], union_by_name = true)"


def engine_expr(column: str) -> str:
    """``column`` with engine spellings (``tensor``, ``PE``, ``Pool``, ...) mapped to canonical names."""
    cases = " ".join(f"WHEN {literal(alias)} THEN {literal(name)}" for alias, name in ENGINE_ALIASES.items())
    return f"CASE lower({ident(column)}) {cases} ELSE {ident(column)} END"


def duck_type(arrow_type: pa.DataType) -> str:
    """DuckDB type for an Arrow type, for typed NULLs of columns a profile lacks."""
    if pa.types.is_dictionary(arrow_type):
        return duck_type(arrow_type.value_type)
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_integer(arrow_type):
        return "INTEGER" if arrow_type.bit_width <= 32 else "BIGINT"
    if pa.types.is_floating(arrow_type):
        return "FLOAT" if arrow_type.bit_width <= 32 else "DOUBLE"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return duck_type(arrow_type.value_type) + "[]"
    return "VARCHAR"


class TableSource:
    """One table of one profile as SQL: which columns its parts hold and expressions for the rest.

    ``col(name)`` is the column itself when some part has it, else a NULL of the documented type, so
    summary SQL can name every documented column whatever the profile's writer filled.
    """

    def __init__(self, profile: Profile, name: str) -> None:
        self.profile = profile
        self.name = name
        self.files = profile.files(name)
        table = profile.tables.get(name)
        self.columns: list[str] = table.columns if table else []
        self.num_rows = profile.num_rows(name)
        self.definition = profile.schema.table(name) or SCHEMA.table(name)

    @property
    def present(self) -> bool:
        return bool(self.files) and self.num_rows > 0

    def has(self, column: str) -> bool:
        return column in self.columns

    def null_type(self, column: str) -> str:
        field = self.definition.field(column) if self.definition else None
        return DUCK_TYPES.get(field.type, "VARCHAR") if field else "VARCHAR"

    def col(self, column: str, *, engines: bool = True) -> str:
        """SQL for ``column``: the column (engine names normalised), or a typed NULL when absent."""
        if not self.has(column):
            return f"NULL::{self.null_type(column)}"
        if engines and column in ENGINE_COLUMNS.get(self.name, ()):
            return engine_expr(column)
        return ident(column)

    def relation(self) -> str:
        """The FROM item: a scan of the parts, or an empty relation with the documented columns."""
        if self.files:
            return parquet_scan(self.files)
        names = self.definition.names if self.definition else ["_none"]
        cols = ", ".join(f"NULL::{self.null_type(n)} AS {ident(n)}" for n in names)
        return f"(SELECT {cols} WHERE false)"

    def conformed_select(self, extra: Iterable[str] = ()) -> str:
        """``SELECT <documented columns, then unknown ones> FROM <parts>``: the view the query layer
        shows for this table. ``extra`` are leading expressions (partition columns)."""
        documented = self.definition.names if self.definition and not self.definition.transient else []
        items = list(extra)
        items += [f"{self.col(n)} AS {ident(n)}" for n in documented]
        items += [ident(n) for n in self.columns if n not in documented]
        return f"SELECT {', '.join(items)} FROM {self.relation()}"
