"""Read a few columns of many Parquet parts fast: decoded on a small thread pool, handed back in order.

    parts = PartStream([PartJob(path, ["id", "start_ts"], dictionary=[]), ...])
    for job, table in parts:          # in job order; later parts decode while this one is used
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["PartJob", "PartStream", "dictionary_codes", "int_column", "workers"]

MAX_WORKERS = 4


def workers() -> int:
    """Threads that decode parts: the machine's cores, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@dataclass(frozen=True)
class PartJob:
    """One part to read: its path, the columns wanted (the ones it has) and which are strings to keep
    as dictionaries."""

    path: Path
    columns: list[str]
    dictionary: list[str] = field(default_factory=list)


def read_part(job: PartJob) -> pa.Table:
    """One part's columns, decoded on the calling thread."""
    return pq.read_table(job.path, columns=job.columns, read_dictionary=job.dictionary, use_threads=False,
                         page_checksum_verification=True)


class PartStream:
    """Decode ``jobs`` on a thread pool, yielding ``(job, table)`` in job order with at most
    ``ahead`` parts decoded or decoding beyond the one handed out."""

    def __init__(self, jobs: Sequence[PartJob], ahead: int | None = None) -> None:
        self.jobs = list(jobs)
        self.ahead = ahead or 2 * workers()

    def __iter__(self) -> Iterator[tuple[PartJob, pa.Table]]:
        if len(self.jobs) <= 1 or workers() == 1:
            for job in self.jobs:
                yield job, read_part(job)
            return
        pool = ThreadPoolExecutor(workers(), thread_name_prefix="part-reader")
        pending: dict[int, Future[pa.Table]] = {}
        try:
            submitted = 0
            for k, job in enumerate(self.jobs):
                while submitted < len(self.jobs) and submitted <= k + self.ahead:
                    pending[submitted] = pool.submit(read_part, self.jobs[submitted])
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


def dictionary_codes(column: pa.ChunkedArray, mapping: dict[str, int],
                     intern: Callable[[str], int]) -> np.ndarray:
    """Per-row codes of a dictionary (or plain string) column, -1 for nulls: each distinct value is
    mapped once (``mapping``, new values through ``intern``, in the order the dictionaries list them),
    then the rows' indices are looked up in one gather per chunk."""
    out = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        for v in values:
            if v is not None and v not in mapping:
                mapping[v] = intern(v)
        codes = np.array([mapping[v] if v is not None else -1 for v in values] + [-1], np.int32)
        indices = chunk.indices
        if indices.null_count:
            indices = indices.fill_null(len(values))
        out.append(codes[indices.to_numpy(zero_copy_only=False)])
    if not out:
        return np.zeros(0, np.int32)
    return out[0] if len(out) == 1 else np.concatenate(out)
