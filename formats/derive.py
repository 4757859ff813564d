"""Tables derived from a profile's event tables, written when a capture closes.

A profile made by the real Neuron Explorer carries ``Summary``, ``OpcodeSummary``, ``ActiveTime`` and
``DmaUsage``; tools written for it read them and never compute them. So ours carry them too: when a
capture closes, the writer finishes the event tables, the summary layer computes over the finished
Parquet parts in the staging directory (bounded memory: ``formats.summary``), and the results are
written as ordinary tables before the profile is moved into place. ``InstructionLod`` (our extension:
the zoomed-out timeline levels) is written at the same time.

Interrupted captures get none of these (their figures would describe a part as if it were the whole);
readers compute them on demand from whatever was recorded (``summary.summary_row``).
"""

from __future__ import annotations

import ctypes
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from formats import sqlsource, summary
from formats.lod import LOD_TABLE
from formats.reader import Profile, profile_from_files
from formats.schema import canonical_engine
from formats.sqlsource import TableSource

if TYPE_CHECKING:
    from formats.writer import ProfileWriter

# What the summary reads; finished (closed, footers written) before it runs.
SOURCE_TABLES = ("Instruction", "DmaPacket", "DmaPacketAggregated", "CcOp", "CcInstruction",
                 "SemaphoreUpdate", "HbmUsage", "ExecutionInfo", "TrainingStep", "Throttle")
DERIVED_TABLES = ("Summary", "OpcodeSummary", "ActiveTime", "DmaUsage", "ThrottleSummary", LOD_TABLE)
# At a capture's close the capturing process has the writer's memory in use already; the derived
# tables are computed in small steps so the close adds little to its peak (bench: peak_rss_mb).
CLOSE_ROWS_PER_SLICE = 100_000
CLOSE_MEMORY_LIMIT = "64MB"  # DuckDB's buffer pool, one thread: a scan needs a row group at a time


@dataclass
class DerivedResult:
    """What ``write_derived`` did: the tables written and the partial profile it computed over."""

    profile: Profile
    tables: dict[str, int]  # name -> rows written
    summary: dict[str, Any]


def staged_profile(writer: ProfileWriter) -> Profile:
    """Finish the source tables and open them from the staging directory as a ``Profile``."""
    files = {name: writer.finish_table(name) for name in SOURCE_TABLES if name in writer.rows_written}
    return profile_from_files(writer.staging, files, writer.metadata_preview(), schema=writer.schema)


def write_derived(writer: ProfileWriter, facts: summary.ProgramFacts | None = None, *, lod: bool = True,
                  closing_rows: int = 0, later_tables: Sequence[str] = (),
                  staged: Profile | None = None) -> DerivedResult:
    """Compute the summary tables (and the timeline LOD) from what ``writer`` holds and write them.

    ``closing_rows``: rows the caller will still write after this, in ``later_tables`` (both counted in
    ``total_row_count``: the rows and the tables' SchemaFields rows);
    ``staged``: the result of ``staged_profile(writer)`` if the caller already finished the tables.
    """
    profile = staged if staged is not None else staged_profile(writer)
    pa.default_memory_pool().release_unused()  # the writer's freed buffers back to the OS first
    con = sqlsource.connect(memory_limit=CLOSE_MEMORY_LIMIT, threads=1)
    try:
        in_profile = set(profile.tables)
        others = sum(n for name, n in writer.rows_written.items() if name not in in_profile)
        closing = _closing_rows(writer, later_tables) + closing_rows
        def active_time(table: pa.Table) -> None:  # called once per slice
            writer.write("ActiveTime", table)
            _trim()

        derived = summary.compute(profile, facts, con=con, extra_rows=others + closing,
                                  rows_per_slice=CLOSE_ROWS_PER_SLICE, lod=lod, prefetch=False,
                                  active_time_sink=active_time)
        written: dict[str, int] = {}
        if derived.lod is not None and derived.lod.num_rows:
            derived.summary["total_row_count"] += derived.lod.num_rows
            for batch in derived.lod.to_batches():  # chunk by chunk: no combined copy
                writer.write(LOD_TABLE, batch)
            written[LOD_TABLE] = derived.lod.num_rows
        for name, table in derived.tables():
            writer.write(name, table)
            written[name] = table.num_rows
        written["ActiveTime"] = writer.rows_written.get("ActiveTime", 0)
    finally:
        con.close()
    return DerivedResult(profile, written, derived.summary)


def _trim() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``): the slices' NumPy arrays are
    freed each step, but glibc keeps the heap they grew, and a capturing process's peak is what counts."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def _closing_rows(writer: ProfileWriter, later_tables: Sequence[str]) -> int:
    """Rows the writer adds at close: one Metadata row, its warnings, one SchemaFields row per field of
    every table written (the derived ones and those still to come included)."""
    names = set(writer.rows_written) | set(DERIVED_TABLES) | set(later_tables) | {"Metadata", "SchemaFields"}
    if writer.warnings:
        names.add("Warning")
    fields = sum(len(writer.schema.tables[n].fields) for n in names if n in writer.schema.tables)
    return 1 + len(writer.warnings) + fields


def framework_engine_ranges(profile: Profile) -> dict[str, dict[str, tuple[int, int]]]:
    """Per FrameworkNode path and engine stem, the [first start, last end] of its instructions
    (``FrameworkNode.total_time_<e>``): one grouped scan by (layer, engine), rolled up to every
    enclosing module path in Python (the groups are few)."""
    source = TableSource(profile, "Instruction")
    if not source.present or not source.has("layer"):
        return {}
    con = sqlsource.connect(memory_limit=CLOSE_MEMORY_LIMIT, threads=1)
    try:
        rows = con.execute(f"""SELECT layer, engine, min(start_ts), max(end_ts) FROM {source.relation()}
                               WHERE layer IS NOT NULL GROUP BY ALL""").fetchall()
    finally:
        con.close()
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for layer, engine, first, last in rows:
        stem = summary.ENGINE_STEMS.get(str(canonical_engine(None if engine is None else str(engine))))
        if stem is None or not layer:
            continue
        parts = str(layer).split("/")
        for depth in range(1, len(parts) + 1):
            node = out.setdefault("/".join(parts[:depth]), {})
            lo, hi = node.get(stem, (first, last))
            node[stem] = (min(lo, first), max(hi, last))
    return out


def add_engine_ranges(rows: MutableMapping[str, list[Any]],
                      ranges: dict[str, dict[str, tuple[int, int]]]) -> None:
    """Fill ``total_time_<e>`` (text ``[min_ts, max_ts]``) of FrameworkNode columns in place."""
    names = rows.get("node_name", [])
    for stem in summary.ENGINE_STEMS.values():
        column = rows.setdefault(f"total_time_{stem}", [None] * len(names))
        for i, name in enumerate(names):
            span = ranges.get(name, {}).get(stem)
            column[i] = None if span is None else f"[{span[0]}, {span[1]}]"
