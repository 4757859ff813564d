"""Open a profile directory -- ours or one written by the real Neuron Explorer -- as typed Arrow tables.

    profile = open_profile("out/bert")
    profile.metadata["profile_schema_version"]      # '7.4.0'
    profile.complete, profile.warnings              # interrupted capture? processing warnings?
    instr = profile.table("Instruction", columns=["engine", "start_ts", "end_ts"])
    profile.files("Instruction")                    # the Parquet parts, e.g. for DuckDB read_parquet([...])

Leniency follows the schema's own versioning rules (profile-schema.md §1.2): a 7.x reader reads any
7.y profile by ignoring unknown tables and columns; a missing table is an empty table with the
documented columns; a missing optional column is nulls. What cannot be read safely -- a corrupt or
truncated file, a missing required column, a column of the wrong type, a newer major version --
raises ``ProfileError`` with one line naming the file, table or column.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from formats.schema import (
    ENGINE_COLUMNS,
    PROFILE_SCHEMA_VERSION,
    SCHEMA,
    Schema,
    canonical_engine,
    parse_version,
    table_of_file,
)
from formats.schema_def import TableDef
from formats.writer import INCOMPLETE_CATEGORY
from neuronscope.cli_kit import CliError


class ProfileError(CliError):
    """A profile that cannot be read; ``str()`` is one line naming the file, table or column (a
    ``CliError``: a command line prints it and exits 2)."""


@dataclass(frozen=True)
class ProfileWarning:
    """One row of the profile's ``Warning`` table."""

    category: str
    message: str


@dataclass
class ProfileTable:
    """One table of a profile: its Parquet parts and the union of their columns."""

    name: str
    files: list[Path]
    definition: TableDef | None  # None: a table this schema does not know (kept, not checked)
    file_schemas: list[pa.Schema] = field(default_factory=list)
    num_rows: int = 0
    file_rows: list[int] = field(default_factory=list)  # rows of each part, from its footer

    @property
    def known(self) -> bool:
        return self.definition is not None

    @property
    def columns(self) -> list[str]:
        """Columns present in at least one part, documented ones first."""
        seen: dict[str, None] = {}
        for schema in self.file_schemas:
            seen.update(dict.fromkeys(schema.names))
        documented = [n for n in (self.definition.names if self.definition else []) if n in seen]
        return documented + [n for n in seen if n not in documented]


def _family(t: pa.DataType) -> str:
    """Types a lenient reader treats as interchangeable (widths differ between writers: §2.4, §9.6)."""
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_family(t.value_type)}>"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def _wider(declared: pa.DataType, found: pa.DataType) -> pa.DataType:
    """The declared type, widened when a file holds a wider one of the same family (never narrowed)."""
    numeric = _family(found) == _family(declared) and _family(found) in ("int", "float")
    wider = numeric and found.bit_width > declared.bit_width
    if wider and pa.types.is_integer(declared):
        return pa.int64()
    if wider and pa.types.is_floating(declared):
        return pa.float64()
    return declared


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


class Profile:
    """An opened profile directory. Cheap to create: only footers and the small tables are read."""

    def __init__(self, path: Path, tables: dict[str, ProfileTable], schema: Schema) -> None:
        self.path = path
        self.schema = schema
        self.tables = tables
        self.metadata: dict[str, Any] = {}
        self.warnings: list[ProfileWarning] = []
        self.notes: list[str] = []  # what the reader itself noticed (older version, missing Metadata)

    # -- facts ---------------------------------------------------------------------------------
    @property
    def version(self) -> str | None:
        value = self.metadata.get("profile_schema_version")
        return None if value is None else str(value)

    @property
    def complete(self) -> bool:
        """False when the capture was interrupted (Metadata flag or an ``Incomplete Profile`` warning)."""
        if self.metadata.get("capture_complete") is False:
            return False
        return not any(w.category == INCOMPLETE_CATEGORY for w in self.warnings)

    @property
    def is_simulation(self) -> bool:
        return bool(self.metadata.get("is_simulation"))

    @property
    def is_system(self) -> bool:
        """A host-side system profile (a capture's ``system/``), not a device run
        (``Schema.is_system_side``)."""
        return self.schema.is_system_side(self.tables)

    def has(self, name: str) -> bool:
        return name in self.tables

    def files(self, name: str) -> list[Path]:
        """The Parquet parts of ``name`` in order (empty if the profile has no such table)."""
        table = self.tables.get(name)
        return list(table.files) if table else []

    def num_rows(self, name: str) -> int:
        table = self.tables.get(name)
        return table.num_rows if table else 0

    # -- reading -------------------------------------------------------------------------------
    def arrow_schema(self, name: str, columns: Sequence[str] | None = None) -> pa.Schema:
        """The schema ``table(name)`` returns: documented columns (declared types, widened if a part
        is wider), then unknown columns in the order seen."""
        definition = self.schema.table(name)
        table = self.tables.get(name)
        found: dict[str, pa.DataType] = {}
        for schema in table.file_schemas if table else []:
            for f in schema:
                t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
                if f.name in found and found[f.name] != t:
                    found[f.name] = _unify(found[f.name], t)
                else:
                    found.setdefault(f.name, t)
        fields: list[pa.Field] = []
        if definition is not None and not definition.transient:
            for f in definition.fields:
                declared = f.arrow_type
                assert declared is not None
                fields.append(pa.field(f.name, _wider(declared, found[f.name]) if f.name in found
                                       else declared))
        names = {f.name for f in fields}
        fields += [pa.field(n, t) for n, t in found.items() if n not in names]
        schema = pa.schema(fields)
        if columns is not None:
            missing = [c for c in columns if c not in schema.names]
            if missing:
                raise ProfileError(f"{self.path}: table {name} has no column {missing[0]!r}")
            schema = pa.schema([schema.field(c) for c in columns])
        return schema

    def table(self, name: str, columns: Sequence[str] | None = None, *,
              normalize_engines: bool = True) -> pa.Table:
        """The whole table (all parts) as one Arrow table; empty with the documented columns if absent.

        Engine-name columns are normalised to the capitalised names (``tensor``/``PE``/``Pool`` ->
        ``Tensor``/``GpSimd``, §2.5) unless ``normalize_engines=False``.
        """
        batches = list(self.iter_batches(name, columns, normalize_engines=normalize_engines))
        return pa.Table.from_batches(batches, schema=self.arrow_schema(name, columns))

    def iter_batches(self, name: str, columns: Sequence[str] | None = None, *, batch_size: int = 131_072,
                     normalize_engines: bool = True) -> Iterator[pa.RecordBatch]:
        """Stream a table in batches (bounded memory whatever its size)."""
        schema = self.arrow_schema(name, columns)
        table = self.tables.get(name)
        for path, file_schema in zip(table.files, table.file_schemas) if table else []:
            present = [n for n in schema.names if n in file_schema.names]
            try:
                source = parquet_file(path)
                for batch in source.iter_batches(batch_size=batch_size, columns=present):
                    yield self._conform(name, batch, schema, normalize_engines)
            except (OSError, pa.ArrowException) as exc:
                raise ProfileError(f"{path}: cannot read table {name}: {_one_line(exc)}") from exc

    def dataset(self, name: str) -> ds.Dataset:
        """A pyarrow dataset over the table's parts with the unified schema, for filtered scans.
        (No engine-name normalisation: filter case-insensitively or use ``table()``.)"""
        return ds.dataset([str(p) for p in self.files(name)], schema=self.arrow_schema(name),
                          format="parquet")

    def _conform(self, name: str, batch: pa.RecordBatch, schema: pa.Schema,
                 normalize_engines: bool) -> pa.RecordBatch:
        arrays = []
        engine_columns = ENGINE_COLUMNS.get(name, ()) if normalize_engines else ()
        for f in schema:
            if f.name in batch.schema.names:
                array = batch.column(f.name)
                if pa.types.is_dictionary(array.type):
                    array = array.cast(array.type.value_type)
                if array.type != f.type:
                    try:
                        array = array.cast(f.type)
                    except pa.ArrowException as exc:
                        raise ProfileError(f"{self.path}: table {name}: column {f.name} cannot be read as "
                                           f"{f.type}: {_one_line(exc)}") from exc
                if f.name in engine_columns:
                    array = _normalize_engines(array)
            else:
                array = pa.nulls(batch.num_rows, f.type)
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Common type of an unknown column that differs between parts."""
    if _family(a) == _family(b) == "int":
        return pa.int64()
    if _family(a) in ("int", "float") and _family(b) in ("int", "float"):
        return pa.float64()
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    return pa.string()


def _normalize_engines(array: pa.Array) -> pa.Array:
    """Map engine spellings to canonical names through a dictionary of the distinct values."""
    encoded = pc.dictionary_encode(array)
    names = encoded.dictionary.to_pylist()
    canonical = [canonical_engine(n) for n in names]
    if canonical == names:
        return array
    return pa.DictionaryArray.from_arrays(encoded.indices, pa.array(canonical, pa.string())).cast(pa.string())


# -- opening --------------------------------------------------------------------------------------


ESSENTIAL_TABLES = frozenset({"Metadata", "Instruction"})
"""Tables without which a profile is not shown: an unreadable part of one refuses the profile."""


def open_profile(path: str | os.PathLike[str], *, schema: Schema = SCHEMA,
                 left_out: list[str] | None = None) -> Profile:
    """Open and check a profile directory. Raises ``ProfileError`` (one line) if it cannot be read.

    ``left_out``: a list to show what is readable instead of refusing. A table other than
    :data:`ESSENTIAL_TABLES` with a part that is not a readable Parquet file (truncated, corrupt) is
    then left out whole -- never read in part, which would change its figures -- and one line
    naming it is appended (the viewers print it as a warning); what a reader must never open
    (a link outside the profile, a FIFO) is refused all the same."""
    root = Path(path)
    if not root.exists():
        raise ProfileError(f"{root}: no such profile directory")
    if not root.is_dir():
        raise ProfileError(f"{root}: not a profile directory (a profile is a directory of "
                           f"<Table>.parquet files)")
    parts: dict[str, list[tuple[int, Path]]] = {}
    for table, part, file in table_parts(root):
        parts.setdefault(table, []).append((-1 if part is None else part, file))
    if not parts:
        raise ProfileError(f"{root}: not a profile: no <Table>.parquet files in it")
    if not any(name in schema for name in parts):
        raise ProfileError(f"{root}: not a profile: none of its Parquet files is a profile table "
                           f"({', '.join(sorted(parts)[:3])}...)")
    tables: dict[str, ProfileTable] = {}
    for name, found in sorted(parts.items()):
        definition = schema.table(name)
        loaded = ProfileTable(name, [p for _, p in sorted(found)], definition)
        if left_out is not None and name not in ESSENTIAL_TABLES:
            bad = [f for f in loaded.files if not _readable_footer(f)]
            if bad:
                more = f" and {len(bad) - 1} more of its parts" if len(bad) > 1 else ""
                left_out.append(f"table {name} left out: {bad[0].name}{more} unreadable (truncated "
                                f"or corrupt); the rest of the profile is shown")
                continue
        for file in loaded.files:
            file_schema, rows = _read_footer(file)
            if definition is not None:
                _check_columns(file, definition, file_schema)
            loaded.file_schemas.append(file_schema)
            loaded.file_rows.append(rows)
            loaded.num_rows += rows
        tables[name] = loaded
    profile = Profile(root, tables, schema)
    _load_small_tables(profile)
    return profile


def table_parts(root: Path) -> list[tuple[str, int | None, Path]]:
    """(table, part number or None, file) for every ``<Table>[_N].parquet`` in ``root``, checked by
    ``check_part``: the one place that lists a profile's files, for the reader, ``validate`` and the
    query layer alike. Raises ``ProfileError`` (one line) for a part that may not be read."""
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise ProfileError(f"{root}: cannot list the profile directory: {exc.strerror or exc}") from None
    found = []
    for name in names:
        named = table_of_file(name)
        if named is not None:
            found.append((named[0], named[1], check_part(root, root / name)))
    return found


def check_part(root: Path, file: Path) -> Path:
    """The path to read for a table part, refusing (``ProfileError``) what must not be opened:

    * a symbolic link whose target resolves outside the profile directory (a profile from someone
      else could otherwise make every tool read -- or a query write -- any file of the user's);
    * anything but a regular file -- a FIFO, socket or device, or a link to one -- found with
      ``stat`` before any ``open`` (opening a FIFO blocks forever), and a directory.

    A link that stays inside the profile is read through its resolved target, so what the check saw
    is what is opened."""
    try:
        str(file).encode("utf-8")
    except UnicodeEncodeError:
        raise ProfileError(f"{file}: the path is not valid UTF-8, which the Parquet readers cannot open; "
                           f"rename the file or directory") from None
    try:
        info = os.lstat(file)
    except OSError as exc:
        raise ProfileError(f"{file}: cannot read: {exc.strerror or exc}") from None
    target = file
    if stat.S_ISLNK(info.st_mode):
        try:
            base = Path(os.path.realpath(root))
            resolved = Path(os.path.realpath(file))
        except (OSError, ValueError) as exc:
            raise ProfileError(f"{file}: symbolic link that cannot be resolved: {exc}") from None
        if resolved == base or base not in resolved.parents:
            raise ProfileError(f"{file}: refused: a symbolic link to {resolved}, outside the profile "
                               f"directory (table parts must live inside the profile)")
        try:
            info = os.stat(resolved)
        except OSError as exc:
            raise ProfileError(f"{file}: dangling symbolic link: {exc.strerror or exc}") from None
        target = resolved
    if not stat.S_ISREG(info.st_mode):
        raise ProfileError(f"{file}: refused: not a regular file ({_file_kind(info.st_mode)}); a table "
                           f"part must be a Parquet file")
    return target


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def profile_from_files(root: str | os.PathLike[str], files: Mapping[str, Sequence[Path]],
                       metadata: dict[str, Any] | None = None, *, schema: Schema = SCHEMA) -> Profile:
    """A ``Profile`` over given Parquet parts (footers read and checked as ``open_profile`` does), with
    ``metadata`` as its Metadata row. For computing on a profile still being written: the summary at
    a capture's close reads the event tables the writer has finished, from its staging directory."""
    tables: dict[str, ProfileTable] = {}
    for name, paths in files.items():
        if not paths:
            continue
        definition = schema.table(name)
        table = ProfileTable(name, list(paths), definition)
        for file in table.files:
            file_schema, rows = _read_footer(file)
            if definition is not None:
                _check_columns(file, definition, file_schema)
            table.file_schemas.append(file_schema)
            table.file_rows.append(rows)
            table.num_rows += rows
        tables[name] = table
    profile = Profile(Path(root), tables, schema)
    profile.metadata = dict(metadata or {})
    return profile


def parquet_file(file: Path) -> pq.ParquetFile:
    """A part opened for reading with page checksums verified (pages written with a CRC -- every
    part this suite writes -- fail to read when a bit changed, instead of changing a figure)."""
    return pq.ParquetFile(file, page_checksum_verification=True)


def _readable_footer(file: Path) -> bool:
    try:
        _read_footer(file)
    except ProfileError as exc:
        return "not a readable Parquet file" not in str(exc)  # other refusals are raised later
    return True


def _read_footer(file: Path) -> tuple[pa.Schema, int]:
    try:
        source = parquet_file(file)
        schema, rows = source.schema_arrow, source.metadata.num_rows
    except (OSError, pa.ArrowException, ValueError) as exc:  # ValueError: names that are not UTF-8
        raise ProfileError(f"{file}: not a readable Parquet file (truncated or corrupt): "
                           f"{_one_line(exc)}") from exc
    seen: set[str] = set()
    for name in schema.names:
        if not name.strip() or name in seen or any(ord(c) < 32 for c in name):
            problem = ("a duplicate column" if name in seen
                       else "a column with an empty or control-character name")
            raise ProfileError(f"{file}: not a usable table part: {problem} ({name!r})")
        seen.add(name)
    if rows < 0:
        raise ProfileError(f"{file}: not a readable Parquet file: footer claims {rows} rows")
    return schema, rows


def _check_columns(file: Path, definition: TableDef, file_schema: pa.Schema) -> None:
    names = set(file_schema.names)
    for f in definition.fields:
        if f.name not in names:
            if f.required:
                raise ProfileError(f"{file}: table {definition.name} lacks required column {f.name!r}")
            continue
        found = file_schema.field(f.name).type
        declared = f.arrow_type
        assert declared is not None
        if _family(found) not in (_family(declared), "null"):
            raise ProfileError(f"{file}: column {definition.name}.{f.name} is {found}, expected {declared}")


def _load_small_tables(profile: Profile) -> None:
    """Metadata (version check), Warning (completeness) -- both tiny and needed up front."""
    if profile.has("Metadata"):
        rows = _small_rows(profile, "Metadata")
        if rows:
            profile.metadata = rows[0]
            if len(rows) > 1:
                profile.notes.append(f"Metadata has {len(rows)} rows; using the first")
    else:
        profile.notes.append("no Metadata table: schema version unknown, read as "
                             f"{PROFILE_SCHEMA_VERSION}")
    version = profile.version
    if version is not None and _check_version(profile.path, version):
        profile.notes.append(f"profile schema {version} is older than {PROFILE_SCHEMA_VERSION}; "
                             f"read leniently")
    if profile.has("Warning"):
        profile.warnings = [ProfileWarning(str(r.get("category") or ""), str(r.get("message") or ""))
                            for r in _small_rows(profile, "Warning")]
    unknown = sorted(n for n, t in profile.tables.items() if not t.known)
    if unknown:
        profile.notes.append(f"tables not in the schema (kept, unchecked): {', '.join(unknown)}")


def _small_rows(profile: Profile, name: str) -> list[dict[str, Any]]:
    """A small table's rows as Python values; a value Python cannot hold (a timestamp past year 9999,
    a nanosecond one it cannot convert) is a ``ProfileError`` naming the table."""
    table = profile.table(name)
    try:
        return table.to_pylist()
    except (ValueError, OverflowError) as exc:
        files = ", ".join(p.name for p in profile.files(name))
        raise ProfileError(f"{profile.path}: table {name} ({files}) holds a value that cannot be read: "
                           f"{_one_line(exc)}") from None


def _check_version(root: Path, version: str) -> bool:
    """Refuse a newer major version; True if the profile is of an older major (read leniently)."""
    ours = parse_version(PROFILE_SCHEMA_VERSION)
    try:
        theirs = parse_version(version)
    except ValueError:
        raise ProfileError(f"{root}: Metadata.profile_schema_version {version!r} is not a "
                           f"MAJOR.MINOR.PATCH version") from None
    if theirs[0] > ours[0]:
        raise ProfileError(f"{root}: profile schema {version} is newer than this reader supports "
                           f"({PROFILE_SCHEMA_VERSION}); its tables may have changed in ways we cannot read "
                           f"-- upgrade neuronscope")
    return theirs[0] < ours[0]
