"""Print or save a query result: a rich table on the terminal, or CSV / JSON / Parquet, streamed.

Results stream as Arrow batches from DuckDB (``QuerySession.arrow_reader``) into pyarrow's CSV and
Parquet writers or a JSON array written row by row, so a query returning millions of rows never sits
in memory whole. Files are written by pyarrow in this process, never by DuckDB: the query connection
itself has no file access (``formats.query``). Every file goes through ``formats.safe_output`` (a fresh
temporary name renamed into place; a symlinked ``-o`` target is refused).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from formats.jsonsafe import json_value
from formats.query import QueryError, QuerySession, iter_batches
from formats.safe_output import output_file


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Decimal):
        return str(int(value)) if value == value.to_integral_value() else str(value)
    return str(value)


@contextmanager
def _text_output(path: str | None) -> Iterator[IO[str]]:
    if path is None or path == "-":
        yield sys.stdout
    else:
        with output_file(path, "w") as out:
            yield out


def _plain_types(schema: pa.Schema, fmt: str = "parquet") -> pa.Schema:
    """Types every reader of ``fmt`` knows. Parquet: DuckDB's 128-bit integer sums (decimal128(38, 0)
    in Arrow) become int64, which is what a sum of int64 profile columns fits in (CSV, JSON and the
    table print their exact digits). JSON and the table: timestamps, dates and times become text
    (Python's datetime cannot hold nanoseconds or years past 9999)."""
    fields = []
    for f in schema:
        if fmt == "parquet" and pa.types.is_decimal(f.type) and f.type.scale == 0:
            fields.append(pa.field(f.name, pa.int64()))
        elif fmt in ("json", "table") and (pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)
                                           or pa.types.is_time(f.type) or pa.types.is_duration(f.type)):
            fields.append(pa.field(f.name, pa.string()))
        else:
            fields.append(f)
    return pa.schema(fields)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema):
        return batch
    columns = []
    for i, f in enumerate(schema):
        try:
            columns.append(batch.column(i).cast(f.type))
        except pa.ArrowException:  # a 128-bit sum beyond int64
            raise QueryError(f"result column {f.name!r} holds a value beyond {f.type} (a sum of huge "
                             f"values): CAST it to DOUBLE or VARCHAR, or use --format csv/json") from None
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def write_result(session: QuerySession, sql: str, fmt: str, path: str | None, max_rows: int) -> int:
    """Run ``sql`` and write it in ``fmt`` (table, csv, json, parquet); returns the rows written."""
    reader = session.arrow_reader(sql)
    schema = _plain_types(reader.schema, fmt)
    batches = (_conform(b, schema) for b in iter_batches(reader, session))
    if fmt == "table":
        return _print_table(schema, batches, max_rows, path)
    if fmt == "parquet":
        assert path is not None
        rows = 0
        with output_file(path, "wb") as out, pq.ParquetWriter(out, schema, compression="zstd") as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        print(f"wrote {rows:,} rows to {path}", file=sys.stderr)
        return rows
    if fmt == "csv":
        rows = 0
        if path is None or path == "-":
            for i, batch in enumerate(batches):
                sink = pa.BufferOutputStream()
                pacsv.write_csv(pa.Table.from_batches([batch], schema), sink,
                                pacsv.WriteOptions(include_header=i == 0))
                sys.stdout.write(sink.getvalue().to_pybytes().decode("utf-8"))
                rows += batch.num_rows
            if rows == 0:
                print(",".join(schema.names))
            return rows
        with output_file(path, "wb") as out, pacsv.CSVWriter(out, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        print(f"wrote {rows:,} rows to {path}", file=sys.stderr)
        return rows
    rows = 0
    with _text_output(path) as out:  # json: one array of row objects
        out.write("[")
        for batch in batches:
            for row in batch.to_pylist():
                text = json.dumps({k: json_value(v) for k, v in row.items()})
                out.write(("\n" if rows == 0 else ",\n") + text)
                rows += 1
        out.write("\n]\n")
    if path not in (None, "-"):
        print(f"wrote {rows:,} rows to {path}", file=sys.stderr)
    return rows


def _print_table(schema: pa.Schema, batches: Iterator[pa.RecordBatch], max_rows: int,
                 path: str | None) -> int:
    table = Table(show_lines=False, header_style="bold")
    for f in schema:
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
        table.add_column(f.name, justify="right" if numeric else "left", overflow="fold")
    shown = total = 0
    for batch in batches:
        total += batch.num_rows
        if shown < max_rows:
            for row in batch.slice(0, max_rows - shown).to_pylist():
                table.add_row(*(_cell(v) for v in row.values()))
                shown += 1
    with _text_output(path) as out:
        console = _console_for(out, table)
        console.print(table)
        more = f" (showing {shown}; --max-rows N or --format csv -o FILE for all)" if total > shown else ""
        console.print(f"{total:,} row{'s' if total != 1 else ''}{more}")
    return total


def _console_for(out: Any, table: Table) -> Console:
    """A terminal wraps a wide table into its width (cells fold); a pipe or a file gets every cell
    whole on one line, however wide -- a script reading the output (``| less -S``, ``> result.txt``)
    wants the values, not a column of 80 characters folded letter by letter."""
    console = Console(file=out)
    if console.is_terminal:
        return console
    natural = Measurement.get(console, console.options.update(width=1 << 16), table).maximum
    return Console(file=out, width=max(console.width, natural))


def list_tables(session: QuerySession) -> None:
    """The views a query can use, with their row counts (tables no profile has are left out)."""
    table = Table(header_style="bold")
    table.add_column("table")
    table.add_column("rows", justify="right")
    table.add_column("columns", justify="right")
    for name in session.tables:
        rows = sum(p.num_rows(name) for _, p in session.profiles)
        if not rows:
            continue
        columns = len(session.con.execute(f'DESCRIBE "{name}"').fetchall())
        table.add_row(name, f"{rows:,}", str(columns))
    console = Console()
    console.print(table)
    where = "1 profile" if session.single else f"{len(session.profiles)} profiles"
    extra = "" if session.single else f"; partition columns: profile, {', '.join(session.partitions)}"
    console.print(f"{where}{extra}; empty tables are views too (documented columns, no rows)")
