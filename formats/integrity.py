"""Verify a Parquet part's page checksums from its raw bytes, before DuckDB reads it.

DuckDB's Parquet reader checks no page CRC, and on some flipped bits it crashes the whole process
(a segmentation fault found by ``bench/fuzz_profiles.py``: one bit in a ``DmaPacket`` data page, met
by ``view --recompute``). pyarrow verifies CRCs, but only while decoding every value, which would
double the cost of each SQL scan. So every part is checked here once per process, before the first
SQL scan over it (``formats.sqlsource.parquet_scan``), at the cost of reading its bytes and a CRC-32
-- no decompression, no decoding:

* each column chunk's pages are walked from the footer's offsets, each page header parsed (Thrift
  compact protocol, bounds-checked: a header that runs past its chunk is corruption too), and the
  CRC a page carries compared with ``zlib.crc32`` of its bytes;
* the footer is parsed by DuckDB (`parquet_metadata`), never by pyarrow's column-chunk metadata,
  which aborts the process on some damaged footers;
* a part with pages that carry no CRC (the real tool's, or older neuronscope) is decoded once with
  pyarrow instead when it is small (``DECODE_LIMIT``); a larger one is trusted (docs/trust.md).

A mismatch or an unparsable page is a ``ProfileError`` naming the file, column and page.
"""

from __future__ import annotations

import mmap
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from formats.reader import ProfileError, _one_line, parquet_file

DECODE_LIMIT = 64 * 2**20  # bytes: parts without CRCs up to this size are decoded once to check them
_verified: dict[tuple[str, int, int, int, int], None] = {}  # (path, dev, inode, size, mtime) checked


class _Corrupt(Exception):
    """A page header that does not parse, or runs out of its column chunk."""


def verify_parts(files: list[Path]) -> None:
    """Check each part once per process (cached by path, inode, size and mtime)."""
    for file in files:
        verify_part(file)


def verify_part(file: Path) -> None:
    try:
        info = os.stat(file)
    except OSError as exc:
        raise ProfileError(f"{file}: cannot read: {exc.strerror or exc}") from None
    key = (str(file), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key in _verified:
        return
    unchecked = _check_crcs(file)
    if unchecked and info.st_size <= DECODE_LIMIT:
        try:
            for _ in parquet_file(file).iter_batches(batch_size=65_536):
                pass
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise ProfileError(f"{file}: corrupt data (pages do not decode): {_one_line(exc)}") from None
    _verified[key] = None


def _check_crcs(file: Path) -> int:
    """Verify every page that carries a CRC; returns how many pages carry none."""
    chunks = _column_chunks(file)
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                return _walk(file, chunks, view, size)
            except ValueError as exc:  # bad offsets
                raise ProfileError(f"{file}: corrupt footer: {_one_line(exc)}") from None
            finally:
                view.release()
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Chunk:
    """Where one column chunk's pages lie, as the footer says."""

    row_group: int
    column: str
    start: int  # the dictionary page if there is one, else the first data page
    length: int  # total_compressed_size


def _column_chunks(file: Path) -> list[_Chunk]:
    """The footer's column chunks, parsed by DuckDB's ``parquet_metadata``.

    Not pyarrow's ``FileMetaData.row_group(g).column(c)``: building a column chunk's metadata from a
    damaged footer (a flipped bit in a level histogram or a physical type) throws a C++ exception that
    pyarrow cannot turn into a Python one -- ``terminate``, the process gone. DuckDB raises."""
    try:
        with duckdb.connect() as con:
            rows = con.execute(
                "SELECT row_group_id, path_in_schema, data_page_offset, dictionary_page_offset, "
                "total_compressed_size FROM parquet_metadata(?) ORDER BY row_group_id, column_id",
                [str(file)]).fetchall()
    except (duckdb.Error, UnicodeDecodeError) as exc:
        raise ProfileError(f"{file}: not a readable Parquet file (truncated or corrupt): "
                           f"{_one_line(exc)}") from None
    chunks = []
    for group, column, data_offset, dictionary_offset, length in rows:
        if data_offset is None or length is None:
            raise ProfileError(f"{file}: corrupt footer: column {column}, row group {group} has no pages")
        start = min(data_offset, dictionary_offset) if dictionary_offset else data_offset
        chunks.append(_Chunk(int(group), str(column), int(start), int(length)))
    return chunks


def _walk(file: Path, chunks: list[_Chunk], data: memoryview, size: int) -> int:
    unchecked = 0
    for chunk in chunks:
        start, end = chunk.start, chunk.start + chunk.length
        where = f"column {chunk.column}, row group {chunk.row_group}"
        if start < 4 or end > size or chunk.length < 0:
            raise ProfileError(f"{file}: corrupt footer: {where} lies outside the file")
        position, page = start, 0
        while position < end:
            try:
                header_length, length, crc = _page_header(data, position, end)
            except _Corrupt as exc:
                raise ProfileError(f"{file}: corrupt page header ({where}, page {page}): {exc}") from None
            body = position + header_length
            if body + length > end:
                raise ProfileError(f"{file}: corrupt page header ({where}, page {page}): the page "
                                   f"runs past its column chunk")
            if crc is None:
                unchecked += 1
            elif zlib.crc32(data[body:body + length]) != crc & 0xFFFFFFFF:
                raise ProfileError(f"{file}: page checksum mismatch ({where}, page {page}): the file "
                                   f"changed after it was written (a flipped bit, a bad disk or copy)")
            position, page = body + length, page + 1
    return unchecked


# -- Thrift compact protocol: just enough to read a PageHeader ---------------------------------------

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_MAX_DEPTH = 16


def _page_header(data: memoryview, position: int, end: int) -> tuple[int, int, int | None]:
    """(header length, compressed page size, CRC or None) of the PageHeader at ``position``."""
    reader = _Compact(data, position, end)
    compressed: int | None = None
    crc: int | None = None
    field_id = 0
    while True:
        byte = reader.byte()
        kind = byte & 0x0F
        if kind == _STOP:
            break
        delta = byte >> 4
        field_id = field_id + delta if delta else reader.zigzag()
        if field_id == 3 and kind == _I32:
            compressed = reader.zigzag()
        elif field_id == 4 and kind == _I32:
            crc = reader.zigzag()
        else:
            reader.skip(kind, 0)
    if compressed is None or compressed < 0:
        raise _Corrupt("no compressed page size")
    return reader.position - position, compressed, crc


class _Compact:
    def __init__(self, data: memoryview, position: int, end: int) -> None:
        self.data, self.position, self.end = data, position, end

    def byte(self) -> int:
        if self.position >= self.end:
            raise _Corrupt("header runs past its column chunk")
        value = self.data[self.position]
        self.position += 1
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise _Corrupt("varint too long")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def advance(self, count: int) -> None:
        if count < 0 or self.position + count > self.end:
            raise _Corrupt("field runs past its column chunk")
        self.position += count

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise _Corrupt("nested too deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.advance(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind in (_LIST, _SET):
            header = self.byte()
            count = header >> 4
            if count == 15:
                count = self.varint()
            element = header & 0x0F
            for _ in range(count):
                if element in (_TRUE, _FALSE):
                    self.advance(1)
                else:
                    self.skip(element, depth + 1)
        elif kind == _MAP:
            count = self.varint()
            if count:
                types = self.byte()
                for _ in range(count):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            field_id = 0
            while True:
                byte = self.byte()
                inner = byte & 0x0F
                if inner == _STOP:
                    return
                delta = byte >> 4
                field_id = field_id + delta if delta else self.zigzag()
                self.skip(inner, depth + 1)
        else:
            raise _Corrupt(f"unknown field type {kind}")
