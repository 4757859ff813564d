"""Stream records into a Neuron Explorer profile directory, memory-bounded and all-or-flagged.

    with ProfileWriter("out/profile", metadata={"instance_type": "trn1.2xlarge"}) as writer:
        writer.write("Instruction", {"start_ts": ..., "end_ts": ..., ...})   # any number of times
    # out/profile/ now holds Instruction.parquet, Metadata.parquet, SchemaFields.parquet, ...

Why it is shaped this way:

* **Bounded memory.** Each table buffers at most one row group (``row_group_rows`` rows or
  ``row_group_bytes``) before it is encoded and written, so a 100M-instruction capture needs the
  same memory as a small one.
* **Every row group is a committed part.** A row group is written as its own part file under a
  hidden temporary name, closed (footer written) and renamed to ``<Table>_<n>.parquet``
  (profile-schema.md §1.1 split parts; ``n`` in write order). A process killed at any moment leaves
  only whole, readable parts; it loses the rows still buffered and the part being encoded. A table
  of one part is renamed to plain ``<Table>.parquet`` at close.
* **Marked incomplete until it is complete.** The profile is written in ``<target>.incomplete``,
  which holds from the first moment a ``Warning`` row (``Incomplete Profile``) and a Metadata row
  with ``capture_complete = false`` (rewritten with what is known as parts are committed). Only
  ``close()`` writes the final Metadata and renames the folder to the target (same file system:
  atomic), so no hidden staging folder is ever left behind.
* **Interrupted captures stay readable, and say why.** ``abort()`` (called for any exception,
  ``KeyboardInterrupt`` included, when used as a context manager) commits what is buffered, writes
  the reason in the ``Warning`` row and leaves the folder at ``<target>.incomplete``.
* **Readable everywhere.** A dictionary holding a null (a per-op text with no value for some ops)
  is rewritten with the null in the indices: Parquet writers of every supported pyarrow refuse it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats.schema import PROFILE_SCHEMA_VERSION, SCHEMA, Schema
from formats.schema_def import OPENAPI_TYPES, TableDef
from neuronscope import settings

DEFAULT_ROW_GROUP_ROWS = 131_072
DEFAULT_ROW_GROUP_BYTES = 32 * 2**20  # a row group also ends here: rows of long text stay bounded
DEFAULT_ENCODER_THREADS = 2
INCOMPLETE_CATEGORY = "Incomplete Profile"
INCOMPLETE_SUFFIX = ".incomplete"
MARKS_REFRESH_S = 2.0  # a killed capture's provisional Metadata is at most this stale
IN_PROGRESS_MESSAGE = ("profile is incomplete: the capture did not finish (it is still running, or its "
                       "process was killed); tables hold the parts committed before it stopped")

# Tables written last, from what the writer collected (not streamed by callers).
_CLOSING_TABLES = ("Warning", "Metadata", "SchemaFields")


class ProfileWriteError(ValueError):
    """A record does not fit the schema (unknown table or column, missing required column, ...)."""


def _delta_encoded(field: pa.Field) -> bool:
    """Integer columns that grow steadily (timestamps, ids, program counters) are stored as deltas:
    a few bits per row where dictionary or plain encoding would keep 8 bytes."""
    if not pa.types.is_integer(field.type) or field.type.bit_width < 32:
        return False
    name = field.name
    return name in ("id", "pc", "compiler_pc", "timestamp", "raw_bir_id") or name.endswith("_ts")


def _with_statistics(field: pa.Field) -> bool:
    """Min/max statistics where readers prune row groups by them (time ranges, id lookups, op joins);
    computing them for every column costs about a sixth of the encoding time of a wide table."""
    name = field.name
    return name in ("id", "timestamp", "duration_ns", "raw_hlo_id", "packet_aggregation_id") or \
        name.endswith("_ts")


class _Lane:
    """One encoder lane of a table: the job encoding a part on it (at most one at a time)."""

    def __init__(self) -> None:
        self.job: Future[None] | None = None


class _TableStream:
    """One table being written: a row-group buffer and its encoder lanes.

    Every row group handed on becomes a part file of its own, committed whole: it is written under
    a hidden temporary name, closed (so it has its footer) and renamed to ``<Table>_<n>.parquet``.
    A process killed at any moment therefore leaves only readable parts; what it loses is the rows
    still buffered and the part being encoded. Part numbers are taken in order as row groups are
    handed on, so reading the parts by number gives the rows in the order they were written.
    Row groups are encoded on background threads (Parquet encoding releases the GIL), one job per
    lane at a time, so recording the next batches overlaps encoding the previous ones.
    """

    def __init__(self, owner: ProfileWriter, table: TableDef) -> None:
        self.owner = owner
        self.table = table
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.parts: list[Path] = []
        self.lanes = [_Lane() for _ in range(owner.encoder_threads)]
        self.groups = 0
        self.rows = 0
        self.committed_rows = 0
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.finished = False
        self._parts_lock = threading.Lock()

    # -- appending ---------------------------------------------------------------------------
    def append(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._track_time(batch)
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += _row_bytes(batch)
        self.rows += batch.num_rows
        while self.pending_rows >= self.owner.row_group_rows:
            self._flush(self.owner.row_group_rows)
        if self.pending_bytes >= self.owner.row_group_bytes:  # wide rows (long text, lists)
            self._flush()

    def _track_time(self, batch: pa.RecordBatch) -> None:
        """Remember the earliest and latest timestamps: Metadata's first/last_hw_timestamp."""
        names = batch.schema.names
        start = "start_ts" if "start_ts" in names else "timestamp" if "timestamp" in names else None
        if start is None or self.table.extension:
            return
        lo = pc.min(batch.column(start)).as_py()
        hi = pc.max(batch.column("end_ts" if "end_ts" in names else start)).as_py()
        if lo is not None:
            self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        if hi is not None:
            self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)

    def _flush(self, rows: int | None = None) -> None:
        """Hand up to ``rows`` buffered rows (all if None) to the next lane as one part."""
        if not self.pending_rows:
            return
        take = self.pending_rows if rows is None else min(rows, self.pending_rows)
        chosen: list[pa.RecordBatch] = []
        got = 0
        while got < take:
            batch = self.pending[0]
            need = take - got
            if batch.num_rows <= need:
                chosen.append(self.pending.pop(0))
                got += batch.num_rows
            else:
                chosen.append(batch.slice(0, need))
                self.pending[0] = batch.slice(need)
                got += need
        self.pending_rows -= take
        self.pending_bytes = sum(_row_bytes(b) for b in self.pending)
        group = pa.Table.from_batches(chosen)
        path = self.owner.staging / f"{self.table.name}_{self.groups}.parquet"
        lane = self.lanes[self.groups % len(self.lanes)]
        self.groups += 1
        self._wait(lane)
        lane.job = self.owner._submit(self._write_part, path, group)

    @staticmethod
    def _wait(lane: _Lane) -> None:
        job, lane.job = lane.job, None
        if job is not None:
            job.result()  # re-raises an encoding error in the recording thread

    def _write_part(self, path: Path, group: pa.Table) -> None:
        """Encode one row group as a complete part file and commit it by renaming it into place."""
        temporary = path.with_name(f".{path.name}.tmp")
        writer = self.owner._parquet_writer(temporary, group.schema)
        try:
            writer.write_table(group, row_group_size=group.num_rows)
        finally:
            writer.close()
        os.replace(temporary, path)
        with self._parts_lock:
            self.parts.append(path)
            self.committed_rows += group.num_rows
        self.owner._committed(self.table.name, path, group.num_rows)

    # -- finishing -----------------------------------------------------------------------------
    def finish(self) -> None:
        """Write what is buffered and wait for every part. Every lane is waited for even if one
        failed, so each part that was started is either committed or left as a hidden temp file."""
        error: BaseException | None = None
        try:
            self._flush()
        except Exception as exc:
            error = exc
        for lane in self.lanes:
            try:
                self._wait(lane)
            except Exception as exc:
                error = error or exc
        with self._parts_lock:
            self.parts.sort(key=lambda p: int(p.stem.rsplit("_", 1)[1]))
        if error is not None:
            raise error

    def give_plain_name(self) -> None:
        """A table written as one part is stored as plain ``<Table>.parquet`` (done at close only:
        while the profile is being written, part names never change)."""
        if len(self.parts) == 1 and self.parts[0].name != f"{self.table.name}.parquet":
            plain = self.parts[0].with_name(f"{self.table.name}.parquet")
            os.replace(self.parts[0], plain)
            self.parts[0] = plain


def _row_bytes(batch: pa.RecordBatch) -> int:
    """Bytes a batch's rows hold; a dictionary column counts its indices (dictionaries are shared
    per program by the recorder, so counting them per batch would overstate memory many times)."""
    return sum(c.indices.nbytes if pa.types.is_dictionary(c.type) else c.nbytes for c in batch.columns)


class ProfileWriter:
    """Writes one profile directory. Not thread-safe: feed it from one thread (the sink listener)."""

    def __init__(self, out_dir: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None, *,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
                 compression: str = "zstd", compression_level: int | None = 1, overwrite: bool = False,
                 encoder_threads: int = DEFAULT_ENCODER_THREADS, schema: Schema = SCHEMA) -> None:
        if row_group_rows < 1 or row_group_bytes < 1 or encoder_threads < 1:
            raise ValueError("row_group_rows, row_group_bytes and encoder_threads must be positive")
        self.target = Path(out_dir).absolute()
        if self.target.exists() and not overwrite:
            raise FileExistsError(f"{self.target} already exists (pass overwrite=True to replace it)")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.staging = _make_free_dir(self.target.with_name(self.target.name + INCOMPLETE_SUFFIX))
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.compression = compression
        self.compression_level = compression_level
        self.overwrite = overwrite
        self.encoder_threads = encoder_threads
        self._executor: ThreadPoolExecutor | None = None
        self.schema = schema
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.warnings: list[tuple[str, str]] = []
        self._streams: dict[str, _TableStream] = {}
        self._state = "open"  # open -> closed | aborted
        self.path: Path | None = None  # where the profile ended up
        self._marks_lock = threading.Lock()
        self._metadata_version = 0
        self._marks_version = -1
        self._marks_at = 0.0
        self._commit_log = settings.COMMIT_LOG.get()  # each committed part is appended (crash tests)
        # Marked incomplete from the first moment: if this process is killed, the folder
        # (<target>.incomplete), its Metadata and a Warning row all say so. Interrupted before the
        # marks are whole (a Ctrl-C now), the folder holds nothing recorded: it goes.
        try:
            self._write_marks()
        except BaseException:
            self._state = "discarded"
            shutil.rmtree(self.staging, ignore_errors=True)
            raise

    # -- public API ----------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._state == "open"

    @property
    def rows_written(self) -> dict[str, int]:
        """Rows accepted so far per table (buffered rows included)."""
        return {name: s.rows for name, s in self._streams.items()}

    def write(self, table: str, data: Mapping[str, Any] | pa.RecordBatch | pa.Table) -> None:
        """Append rows to ``table``. ``data`` maps column names to equal-length arrays (NumPy, Arrow,
        lists) or is an Arrow batch/table. Missing optional columns become null; unknown columns and
        missing required ones raise ``ProfileWriteError``."""
        self._check_open()
        if table in _CLOSING_TABLES:
            raise ProfileWriteError(f"{table} is written by the writer itself; use "
                                    f"{'warn()' if table == 'Warning' else 'update_metadata()'}")
        definition = self.schema.table(table)
        if definition is None:
            raise ProfileWriteError(f"unknown table {table!r}: not in the profile schema or our extensions")
        if definition.transient:
            raise ProfileWriteError(f"{table} is a transient HTTP-API type and is never stored")
        batch = conform(definition, data)
        stream = self._streams.get(table)
        if stream is None:
            stream = self._streams[table] = _TableStream(self, definition)
        if stream.finished:
            raise ProfileWriteError(f"{table} was finished with finish_table(); it takes no more rows")
        stream.append(batch)

    def finish_table(self, table: str) -> list[Path]:
        """Complete one table now (its files get their footers) and return its parts in the staging
        directory, so rollups can read it before the profile closes. The table takes no more rows."""
        self._check_open()
        stream = self._streams.get(table)
        if stream is None:
            return []
        if not stream.finished:
            stream.finish()
            stream.finished = True
        return list(stream.parts)

    def flush(self) -> None:
        """Commit every table's buffered rows as parts now, so a process killed later keeps them.
        For slow streams (host samples): each call adds a part per table that had rows buffered."""
        self._check_open()
        for stream in list(self._streams.values()):
            if not stream.finished:
                stream._flush()

    def write_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append rows given as dicts (for small tables; big ones should pass columns to ``write``)."""
        rows = list(rows)
        if not rows:
            return
        definition = self.schema.table(table)
        names = definition.names if definition else sorted({k for r in rows for k in r})
        present = [n for n in names if any(n in r for r in rows)]
        unknown = {k for r in rows for k in r} - set(names)
        if unknown:
            raise ProfileWriteError(f"{table} has no column {sorted(unknown)[0]!r}")
        self.write(table, {n: [r.get(n) for r in rows] for n in present})

    def warn(self, message: str, category: str = "Processing") -> None:
        """Add a ``Warning`` row (the first table a reader should look at)."""
        self.warnings.append((category, message))

    def update_metadata(self, **fields: Any) -> None:
        """Set ``Metadata`` fields; the row is written at close, so later values win."""
        self.metadata.update(fields)
        self._metadata_version += 1

    def close(self) -> Path:
        """Finish every table, write Metadata/SchemaFields/Warning and move the profile into place."""
        if self._state != "open":
            if self.path is None:
                raise RuntimeError("profile writer was aborted and left nothing")
            return self.path
        if self.target.exists() and not self.overwrite:
            self.abort(f"{self.target} appeared while the profile was being written")
            raise FileExistsError(f"{self.target} already exists; the profile was left at {self.path}")
        try:
            for stream in self._streams.values():
                stream.finish()
            for stream in self._streams.values():
                stream.give_plain_name()
            self._write_closing_tables(complete=True)
        except BaseException as exc:
            self.abort(f"failed while finishing the profile: {type(exc).__name__}: {exc}")
            raise
        self._shutdown()
        if self.target.exists():
            shutil.rmtree(self.target) if self.target.is_dir() else self.target.unlink()
        os.replace(self.staging, self.target)
        self._state = "closed"
        self.path = self.target
        return self.target

    def abort(self, reason: str = "capture interrupted") -> Path | None:
        """Keep what was written, flagged incomplete, at ``<target>.incomplete``. Safe to call twice."""
        if self._state != "open":
            return self.path
        self._state = "aborted"
        self.warnings.append((INCOMPLETE_CATEGORY, f"profile is incomplete: {reason}; tables hold only "
                                                   f"the records written before the interruption"))
        for stream in self._streams.values():
            with contextlib.suppress(Exception):  # keep finishing the others: every buffered row counts
                stream.finish()
        with contextlib.suppress(Exception):  # best effort: the marks written at the start still hold
            self._write_closing_tables(complete=False)
        self._shutdown()
        self.path = self.staging
        return self.path

    def discard(self) -> None:
        """Drop the profile being written (nothing of it is kept): for a capture that recorded an
        execution only in case no later one came."""
        if self._state != "open":
            return
        self._state = "discarded"
        for stream in self._streams.values():
            with contextlib.suppress(Exception):
                for lane in stream.lanes:
                    stream._wait(lane)
        self._shutdown()
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> ProfileWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__)

    # -- internals ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"profile writer is {self._state}")

    def _submit(self, fn: Any, *args: Any) -> Future[None]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.encoder_threads, thread_name_prefix="profile-encode")
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError:  # at interpreter exit (atexit closing a capture) no thread can start
            done: Future[None] = Future()
            fn(*args)
            done.set_result(None)
            return done

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _parquet_writer(self, path: Path, schema: pa.Schema) -> pq.ParquetWriter:
        delta = [f.name for f in schema if _delta_encoded(f)]
        return pq.ParquetWriter(
            path, schema, compression=self.compression, compression_level=self.compression_level,
            use_dictionary=[f.name for f in schema if f.name not in delta],
            column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED") or None,
            store_schema=False,  # plain Parquet types: dictionary-encoded strings read back as strings
            dictionary_pagesize_limit=4 * 2**20,
            write_batch_size=65_536,  # fewer, larger encoder calls: measurably faster on wide tables
            write_statistics=[f.name for f in schema if _with_statistics(f)] or False,
            write_page_checksum=True,  # a CRC per page: readers and `validate` detect a flipped bit
        )

    def _write_file(self, name: str, columns: Mapping[str, Any], *, require: bool = True) -> Path:
        """Write a small table as one file ``<name>.parquet``, replacing it atomically (temp + rename)."""
        definition = self.schema.table(name)
        assert definition is not None
        table = pa.Table.from_batches([conform(definition, columns, require=require)])
        path = self.staging / f"{name}.parquet"
        temporary = path.with_name(f".{path.name}.tmp")
        writer = self._parquet_writer(temporary, table.schema)
        try:
            writer.write_table(table)
        finally:
            writer.close()
        os.replace(temporary, path)
        return path

    def _write_marks(self) -> None:
        """The incomplete marks a killed capture leaves: a Warning row and ``capture_complete =
        false`` in a Metadata row holding what is known so far."""
        with self._marks_lock:
            if self._state != "open":
                return
            # Metadata first: a process killed between the two leaves a folder whose one table says
            # capture_complete = false, never a Warning alone that a reader could take for a profile
            self._refresh_marks_locked()
            self._write_file("Warning", {"message": [IN_PROGRESS_MESSAGE], "category": [INCOMPLETE_CATEGORY]})

    def _refresh_marks_locked(self) -> None:
        self._write_file("Metadata", self._metadata_row(False, strict=False), require=False)
        self._marks_at = time.monotonic()
        self._marks_version = self._metadata_version

    def _committed(self, table: str, path: Path, rows: int) -> None:
        """A part was committed (called from an encoder thread): refresh the marks' Metadata when
        fields were set since (hardware constants arrive with the first program) or its time bounds
        are over ``MARKS_REFRESH_S`` old, and, when asked to, log the commit for crash tests."""
        with contextlib.suppress(Exception), self._marks_lock:  # the part is safe; marks best effort
            stale = time.monotonic() - self._marks_at >= MARKS_REFRESH_S
            if self._state == "open" and (stale or self._marks_version != self._metadata_version):
                self._refresh_marks_locked()
        if self._commit_log:
            line = json.dumps({"profile": str(self.target), "part": path.name, "table": table, "rows": rows})
            with contextlib.suppress(OSError):
                descriptor = os.open(self._commit_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(descriptor, (line + "\n").encode())
                finally:
                    os.close(descriptor)

    def _write_closing_tables(self, *, complete: bool) -> None:
        with self._marks_lock:
            if self.warnings:
                self._write_file("Warning", {"message": [m for _, m in self.warnings],
                                             "category": [c for c, _ in self.warnings]})
            else:
                (self.staging / "Warning.parquet").unlink(missing_ok=True)
            self._write_file("Metadata", self._metadata_row(complete))
            written = [n for n in self._streams if n not in _CLOSING_TABLES]
            written += [n for n in _CLOSING_TABLES if (self.staging / f"{n}.parquet").exists()]
            self._write_file("SchemaFields", schema_fields_columns([self.schema.tables[n] for n in
                                                                    [*written, "SchemaFields"]]))

    def metadata_preview(self) -> dict[str, Any]:
        """The Metadata row as it stands now (defaults, trace bounds so far, fields set), unchecked:
        for computing on the profile before ``close()`` writes the row."""
        first = [s.first_ts for s in list(self._streams.values()) if s.first_ts is not None]
        last = [s.last_ts for s in list(self._streams.values()) if s.last_ts is not None]
        row: dict[str, Any] = {"profile_schema_version": PROFILE_SCHEMA_VERSION,
                               "first_hw_timestamp": min(first) if first else None,
                               "last_hw_timestamp": max(last) if last else None}
        row.update(self.metadata)
        return row

    def _metadata_row(self, complete: bool, *, strict: bool = True) -> dict[str, list[Any]]:
        first = [s.first_ts for s in list(self._streams.values()) if s.first_ts is not None]
        last = [s.last_ts for s in list(self._streams.values()) if s.last_ts is not None]
        row: dict[str, Any] = {
            "profile_schema_version": PROFILE_SCHEMA_VERSION,
            "ntff_version": 0,
            "num_physical_cores": 1,
            "vnc_enabled": False,
            "first_hw_timestamp": min(first) if first else 0,
            "last_hw_timestamp": max(last) if last else 0,
            "ticks_per_nanosec": 1,
            "explorer_version": _tool_version(),
        }
        row.update(self.metadata)
        row.setdefault("first_ts", timestamp_text(int(row["first_hw_timestamp"])))
        row.setdefault("last_ts", timestamp_text(int(row["last_hw_timestamp"])))
        row["capture_complete"] = complete
        definition = self.schema.tables["Metadata"]
        missing = [n for n in definition.required if row.get(n) is None]
        if missing and not strict:  # the marks of a capture still running: what is known so far
            return {n: [row[n]] for n in definition.names if row.get(n) is not None}
        if missing:
            raise ProfileWriteError(f"Metadata lacks required field(s) {', '.join(missing)} "
                                    f"(pass them in metadata=... or update_metadata())")
        return {n: [row[n]] for n in definition.names if n in row}


def _make_free_dir(path: Path) -> Path:
    """Create and return ``path``, or ``path.1``, ``path.2``, ... whichever did not exist yet (created
    exclusively, so two writers never share one)."""
    candidate, n = path, 0
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}.{n}")


def _tool_version() -> str:
    try:
        from importlib.metadata import version
        return f"neuronscope {version('neuronscope')}"
    except Exception:
        return "neuronscope"


def timestamp_text(ns: int) -> str:
    """``Metadata.first_ts`` text form: ``1970-01-01 00:00:00+00:00`` (plus fraction when not whole)."""
    seconds, rest = divmod(int(ns), 1_000_000_000)
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if rest:
        text += f".{rest:09d}"
    return text + "+00:00"


def conform(definition: TableDef, data: Mapping[str, Any] | pa.RecordBatch | pa.Table, *,
            require: bool = True) -> pa.RecordBatch:
    """One Arrow batch with exactly the table's columns, in schema order, of the declared types.

    Dictionary-encoded strings stay dictionary-encoded (they are written as Parquet dictionary pages
    and read back as plain strings). Missing optional columns become nulls; so do missing required
    ones when ``require`` is false (the provisional Metadata of a capture still running).
    """
    if isinstance(data, pa.Table):
        data = data.combine_chunks()
        columns: dict[str, Any] = {n: data.column(n).chunk(0) if data.column(n).num_chunks else
                                   pa.array([], data.column(n).type) for n in data.column_names}
    elif isinstance(data, pa.RecordBatch):
        columns = {n: data.column(n) for n in data.schema.names}
    else:
        columns = dict(data)
    unknown = [n for n in columns if definition.field(n) is None]
    if unknown:
        raise ProfileWriteError(f"{definition.name} has no column {unknown[0]!r}")
    length = None
    for name, values in columns.items():
        n = len(values)
        if length is None:
            length = n
        elif n != length:
            raise ProfileWriteError(f"{definition.name}.{name} has {n} values, other columns {length}")
    length = length or 0
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for f in definition.fields:
        target = f.arrow_type
        assert target is not None
        values = columns.get(f.name)
        if values is None:
            if f.required and length and require:
                raise ProfileWriteError(f"{definition.name} requires column {f.name!r}")
            array = pa.nulls(length, target)
        else:
            array = _to_arrow(values, target, definition.name, f.name)
            if f.required and array.null_count:
                raise ProfileWriteError(f"{definition.name}.{f.name} is required but has "
                                        f"{array.null_count} null value(s)")
        arrays.append(array)
        fields.append(pa.field(f.name, array.type, nullable=not f.required or not require))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _to_arrow(values: Any, target: pa.DataType, table: str, column: str) -> pa.Array:
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            if pa.types.is_dictionary(values.type) and pa.types.is_string(target):
                if not pa.types.is_string(values.type.value_type):
                    values = values.cast(pa.dictionary(values.type.index_type, target))
                return _without_null_entries(values)
            return values if values.type == target else values.cast(target)
        if isinstance(values, np.ndarray) and values.dtype.kind in "iufb":
            array = pa.array(values)
            return array if array.type == target else array.cast(target)
        return pa.array(values, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
        raise ProfileWriteError(f"{table}.{column}: cannot store as {target}: {exc}") from exc


def _without_null_entries(values: pa.DictionaryArray) -> pa.DictionaryArray:
    """The same strings with every null moved from the dictionary into the indices.

    Parquet writers (pyarrow 15 through at least 26) refuse a dictionary that holds a null
    ("Writing DictionaryArray with null encoded in dictionary type not yet supported"), yet a per-op
    dictionary naturally has one for ops without the attribute (a traced ``parameter`` has no stack
    frames). Rows pointing at a null entry become null rows; the entry becomes an unused ``""``, so
    the indices keep their meaning and the dictionary its length (no re-indexing per batch)."""
    dictionary = values.dictionary
    if not dictionary.null_count:
        return values
    points_at_null = pc.fill_null(pc.take(dictionary.is_null(), values.indices), False)
    indices = pc.if_else(points_at_null, pa.scalar(None, values.indices.type), values.indices)
    return pa.DictionaryArray.from_arrays(indices, dictionary.fill_null(""))


def schema_fields_columns(tables: Iterable[TableDef]) -> dict[str, list[Any]]:
    """``SchemaFields`` rows (one per table and field) describing ``tables``."""
    out: dict[str, list[Any]] = {k: [] for k in (
        "table_name", "table_description", "field_name", "field_description", "field_type",
        "field_required", "field_format", "field_unit", "field_enum_values")}
    for table in tables:
        for f in table.fields:
            kind, fmt = OPENAPI_TYPES[f.type]
            out["table_name"].append(table.name)
            out["table_description"].append(table.row)
            out["field_name"].append(f.name)
            out["field_description"].append(f.description)
            out["field_type"].append(kind)
            out["field_required"].append(f.required)
            out["field_format"].append(fmt)
            out["field_unit"].append(f.unit)
            enum = SCHEMA.enums.get(f.enum_name or "")
            out["field_enum_values"].append(",".join(enum) if enum else None)
    return out
