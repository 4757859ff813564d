"""Read a few columns of many Parquet parts fast: decoded on a small thread pool, handed back in order.

    parts = PartStream([PartJob("Flow", path, ["in_id", "out_id"]), ...], convert={"Flow": copy_ids})
    for job, result in parts:         # in job order; later parts decode while this one is used
        ...

Why: the analyses read ten million instruction rows and as many dependency edges, a few columns of
each (column projection: the other fifty columns are never decoded). pyarrow decodes a part on one
thread well, but its own column-level threading costs more than it saves on small row groups (on a
loaded 2-core machine it took several times the CPU time it used); decoding whole parts on
``workers()`` threads, one part per thread, keeps both cores busy (pyarrow releases the GIL while
decoding). A bounded window of parts is in flight, so memory holds a few decoded parts, not all.

Pages are checked against their CRCs while decoding (``page_checksum_verification``, as
``formats.reader.parquet_file`` does): a flipped bit fails the read instead of changing a figure.

String columns are read as dictionaries and turned into integer codes per distinct value
(``dictionary_codes``): ten million rows cost their indices, never Python strings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["PartJob", "PartStream", "chunk_codes", "dictionary_chunks", "dictionary_codes", "int_column",
           "workers"]

MAX_WORKERS = 4


def workers() -> int:
    """Threads that decode parts: the machine's cores, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@dataclass(frozen=True)
class PartJob:
    """One part to read: its path, the columns wanted (the ones it has), which are strings to keep as
    dictionaries, and where its rows go among the table's (``offset``; ``rows`` as its footer says)."""

    table: str
    path: Path
    columns: list[str]
    dictionary: list[str] = field(default_factory=list)
    offset: int = 0
    rows: int = 0


def read_part(job: PartJob) -> pa.Table:
    """One part's columns, decoded on the calling thread."""
    return pq.read_table(job.path, columns=job.columns, read_dictionary=job.dictionary, use_threads=False,
                         page_checksum_verification=True)


Convert = Callable[[PartJob, pa.Table], Any]
"""What a worker does with a decoded part (copy its numbers into place, say) before handing it on."""


class PartStream:
    """Decode ``jobs`` on a thread pool, yielding ``(job, result)`` in job order with at most
    ``ahead`` parts decoded or decoding beyond the one handed out. The result is the decoded table,
    or what ``convert(job, table)`` -- run on the worker, after decoding -- returns for it."""

    def __init__(self, jobs: Sequence[PartJob], convert: Mapping[str, Convert] | None = None,
                 ahead: int | None = None) -> None:
        self.jobs = list(jobs)
        self.convert = dict(convert or {})  # by table name
        self.ahead = ahead or 2 * workers()

    def _run(self, job: PartJob) -> Any:
        table = read_part(job)
        convert = self.convert.get(job.table)
        return convert(job, table) if convert is not None else table

    def __iter__(self) -> Iterator[tuple[PartJob, Any]]:
        if len(self.jobs) <= 1 or workers() == 1:
            for job in self.jobs:
                yield job, self._run(job)
            return
        pool = ThreadPoolExecutor(workers(), thread_name_prefix="part-reader")
        pending: dict[int, Future[Any]] = {}
        try:
            submitted = 0
            for k, job in enumerate(self.jobs):
                while submitted < len(self.jobs) and submitted <= k + self.ahead:
                    pending[submitted] = pool.submit(self._run, self.jobs[submitted])
                    submitted += 1
                yield job, pending.pop(k).result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def int_column(table: pa.Table, name: str, fill: int = -1) -> np.ndarray:
    """An integer column as int64 (nulls as ``fill``)."""
    column = table.column(name)
    if column.null_count:
        column = column.fill_null(fill)
    return column.to_numpy().astype(np.int64, copy=False)


def dictionary_chunks(column: pa.ChunkedArray) -> list[tuple[list[Any], np.ndarray]]:
    """A dictionary (or plain string) column as (distinct values, per-row indices) chunks; null rows get
    the index ``len(values)``. Cheap to hand between threads: the values are few, the indices ints."""
    out = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        indices = chunk.indices
        if indices.null_count:
            indices = indices.fill_null(len(values))
        out.append((values, indices.to_numpy(zero_copy_only=False)))
    return out


def chunk_codes(chunks: list[tuple[list[Any], np.ndarray]], mapping: dict[str, int],
                intern: Callable[[str], int]) -> np.ndarray:
    """Per-row codes (-1 for nulls) of ``dictionary_chunks``: each distinct value is mapped once
    (``mapping``; new values through ``intern``, in the order the dictionaries list them), then the
    rows' indices are looked up in one gather per chunk."""
    out = []
    for values, indices in chunks:
        for v in values:
            if v is not None and v not in mapping:
                mapping[v] = intern(v)
        codes = np.array([mapping[v] if v is not None else -1 for v in values] + [-1], np.int32)
        out.append(codes[indices])
    if not out:
        return np.zeros(0, np.int32)
    return out[0] if len(out) == 1 else np.concatenate(out)


def dictionary_codes(column: pa.ChunkedArray, mapping: dict[str, int],
                     intern: Callable[[str], int]) -> np.ndarray:
    """Per-row codes of a string column (``chunk_codes`` of its ``dictionary_chunks``)."""
    return chunk_codes(dictionary_chunks(column), mapping, intern)
