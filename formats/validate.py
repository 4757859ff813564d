"""Schema conformance report for a profile directory (``neuron-profile validate DIR``).

Checks a profile against ``profile-schema.json`` when it can be found (the reference twin in
``../shared``, or ``$NEURONSCOPE_PROFILE_SCHEMA``), else against the project's own definition, which
says the same. Unlike the reader, which stops at the first problem it cannot read past, validation
goes on and lists every finding:

* ``error``   -- the profile breaks the schema: missing required column or table ``Metadata``, a type
  from another family (text where a number belongs), nulls in a required column, values outside an
  enum, ``end_ts`` before ``start_ts``, a transient table written to disk, a newer major version.
* ``warning`` -- legal but suspect: an integer or float of another width, an unknown table or column
  that ``SchemaFields`` does not declare, a ``Summary`` percent outside [0, 1], an interrupted capture.
* ``info``    -- worth knowing: extension tables/columns declared in ``SchemaFields``, split tables.

Every page of every part is decoded once, with its checksum verified (parts this suite writes carry
a CRC per page), and the value checks -- nulls in required columns, enum values, percent ranges,
intervals -- are counted from the decoded values, never from footer statistics a flipped bit could
have changed. Files that cannot be read (a missing directory, a truncated or corrupt Parquet file, a
page whose checksum does not match, a part that is a FIFO or a link out of the profile) are bad input,
not findings: they raise ``ProfileError`` naming the file. ``validate_tree`` validates every profile
below a dataset folder and reports an unreadable one as such without stopping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from formats.dataset import find_profiles
from formats.reader import ProfileError, _family, _one_line, _read_footer, parquet_file, table_parts
from formats.schema import (
    PROFILE_SCHEMA_VERSION,
    SCHEMA,
    Schema,
    parse_version,
    reference_json_path,
    table_of_file,
)
from formats.schema_def import TableDef
from formats.writer import INCOMPLETE_CATEGORY

ERROR, WARNING, INFO = "error", "warning", "info"
Parts = dict[str, list[tuple[int | None, Path]]]  # table -> (part number or None, file)


@dataclass(frozen=True)
class Finding:
    level: str
    message: str
    table: str | None = None
    column: str | None = None
    file: str | None = None

    @property
    def where(self) -> str:
        if self.table and self.column:
            return f"{self.table}.{self.column}"
        return self.table or self.file or "profile"


@dataclass
class ValidationReport:
    """Every finding for one profile; ``conformant`` means no errors."""

    path: str
    schema_source: str
    schema_version: str
    profile_version: str | None = None
    tables: dict[str, int] = field(default_factory=dict)  # rows per table
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    @property
    def conformant(self) -> bool:
        return not self.errors

    def add(self, level: str, message: str, table: str | None = None, column: str | None = None,
            file: Path | None = None) -> None:
        self.findings.append(Finding(level, message, table, column, file.name if file else None))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "conformant": self.conformant, "schema_source": self.schema_source,
                "schema_version": self.schema_version, "profile_version": self.profile_version,
                "tables": self.tables, "findings": [asdict(f) for f in self.findings]}

    def lines(self) -> Iterator[str]:
        """The report as text; file names that are not UTF-8 are shown with backslash escapes."""
        for line in self._lines():
            yield line.encode("utf-8", "backslashreplace").decode("utf-8")

    def _lines(self) -> Iterator[str]:
        yield (f"profile {self.path} (schema {self.profile_version or 'unknown'}), checked against "
               f"{self.schema_source} ({self.schema_version})")
        yield f"{len(self.tables)} tables, {sum(self.tables.values()):,} rows"
        order = {ERROR: 0, WARNING: 1, INFO: 2}
        for f in sorted(self.findings, key=lambda f: order[f.level]):
            yield f"{f.level.upper():8}{f.where}: {f.message}"
        verdict = "conformant" if self.conformant else "NOT conformant"
        yield f"{verdict}: {len(self.errors)} errors, {len(self.warnings)} warnings"


def default_schema() -> Schema:
    """The reference JSON when present (plus our extensions), else our own definition."""
    path = reference_json_path()
    return Schema.from_json(path) if path else SCHEMA


def validate(path: str | os.PathLike[str], schema: Schema | None = None) -> ValidationReport:
    schema = schema or default_schema()
    root = Path(path)
    if not root.is_dir():
        problem = "not a profile directory" if root.exists() else "no such profile directory"
        raise ProfileError(f"{root}: {problem}")
    report = ValidationReport(str(root), schema.source, schema.version)
    parts: Parts = {}
    for table, number, file in table_parts(root):
        parts.setdefault(table, []).append((number, file))
    for name in sorted(os.listdir(root)):
        if name.endswith(".parquet") and table_of_file(name) is None:
            report.add(WARNING, "file name is neither <Table>.parquet nor <Table>_N.parquet",
                       file=root / name)
    if not parts:
        raise ProfileError(f"{root}: not a profile: no <Table>.parquet files in it")
    declared = _schema_fields(root, parts)
    for name, found in sorted(parts.items()):
        _check_table(report, schema, name, sorted(found, key=lambda p: -1 if p[0] is None else p[0]),
                     declared)
    _check_metadata(report, root, parts)
    _check_warnings(report, parts)
    if declared is None:
        report.add(WARNING, "no SchemaFields table: the profile does not describe its own fields",
                   table="SchemaFields")
    else:
        for name in parts:
            if name not in declared:
                report.add(WARNING, "table not listed in SchemaFields", table=name)
    return report


@dataclass
class TreeEntry:
    """One profile below a dataset folder: its report, or the one line saying why it is unreadable."""

    path: Path
    report: ValidationReport | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.report is not None:
            return self.report.to_dict()
        return {"path": str(self.path), "conformant": False, "error": self.error}


def validate_tree(root: str | os.PathLike[str], schema: Schema | None = None) -> Iterator[TreeEntry]:
    """Validate every profile at or below ``root`` (a profile, or a dataset folder such as a capture's
    ``device/``; interrupted ``.incomplete`` profiles included). A profile that cannot be read is an
    entry with ``error`` set, and the others are still checked. Raises ``ProfileError`` when ``root``
    is missing or holds no profile."""
    schema = schema or default_schema()
    entries, _ = find_profiles(root, include_incomplete=True)
    for entry in entries:
        try:
            yield TreeEntry(entry.path, report=validate(entry.path, schema))
        except ProfileError as exc:
            yield TreeEntry(entry.path, error=str(exc))


def _schema_fields(root: Path, parts: Parts) -> dict[str, set[str]] | None:
    """(table -> fields) that the profile's own SchemaFields declares, or None without one."""
    if "SchemaFields" not in parts:
        return None
    declared: dict[str, set[str]] = {}
    for _, file in parts["SchemaFields"]:
        file_schema, _ = _read_footer(file)
        if not {"table_name", "field_name"} <= set(file_schema.names):
            continue  # reported by the column checks of SchemaFields itself
        rows = _read_rows(file, "SchemaFields", ["table_name", "field_name"])
        for row in rows:
            declared.setdefault(str(row["table_name"]), set()).add(str(row["field_name"]))
    return declared


def _check_table(report: ValidationReport, schema: Schema, name: str, found: list[tuple[int | None, Path]],
                 declared: dict[str, set[str]] | None) -> None:
    files = [p for _, p in found]
    numbers = [n for n, _ in found]
    if None in numbers and len(numbers) > 1:
        report.add(WARNING, "both <Table>.parquet and numbered parts exist; read as one table", table=name)
    elif len(numbers) > 1:
        parts = sorted(n for n in numbers if n is not None)  # all numbered here (checked above)
        if parts != list(range(len(parts))):
            report.add(WARNING, f"part numbers {parts} are not 0..{len(parts) - 1}", table=name)
        report.add(INFO, f"split into {len(files)} parts", table=name)
    definition = schema.table(name)
    rows = 0
    for file in files:
        file_schema, n = _read_footer(file)
        rows += n
        if definition is None:
            _scan(file, name, [], {}, [], False, False)  # unknown tables are still decoded and checksummed
            continue
        _check_file(report, definition, file, file_schema, declared, n)
    report.tables[name] = rows
    if definition is None:
        if declared is not None and name in declared:
            report.add(INFO, "table outside the schema, declared in SchemaFields", table=name)
        else:
            report.add(WARNING, "unknown table, not declared in SchemaFields", table=name)
    elif definition.transient:
        report.add(ERROR, "transient HTTP-API type written to disk (never stored in Parquet)", table=name)
    elif definition.extension:
        report.add(INFO, "neuronscope extension table", table=name)


@dataclass
class _Scan:
    """What one decoding pass over a part counts (every page read, checksums verified)."""

    rows: int = 0
    nulls: dict[str, int] = field(default_factory=dict)
    enum_values: dict[str, set[str]] = field(default_factory=dict)
    ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    backwards: int = 0
    mismatched: int = 0


def _check_file(report: ValidationReport, definition: TableDef, file: Path, file_schema: pa.Schema,
                declared: dict[str, set[str]] | None, footer_rows: int) -> None:
    name = definition.name
    required: list[str] = []
    enums: dict[str, set[str]] = {}
    percents: list[str] = []
    for f in definition.fields:
        if f.name not in file_schema.names:
            if f.required:
                report.add(ERROR, "required column missing", name, f.name, file)
            continue
        found = file_schema.field(f.name).type
        want = f.arrow_type
        assert want is not None
        base = found.value_type if pa.types.is_dictionary(found) else found
        if base == want or (pa.types.is_large_string(base) and pa.types.is_string(want)):
            pass
        elif _family(base) == _family(want):
            report.add(WARNING, f"stored as {base}, schema says {want}", name, f.name, file)
        elif pa.types.is_null(base):
            if f.required:
                report.add(ERROR, "required column has no values (null type)", name, f.name, file)
            continue
        else:
            report.add(ERROR, f"stored as {base}, schema says {want}", name, f.name, file)
            continue
        if f.required:
            required.append(f.name)
        if f.enum_name and SCHEMA.enums.get(f.enum_name) and _family(base) == "string":
            enums[f.name] = set(SCHEMA.enums[f.enum_name])
        if name == "Summary" and f.name.endswith("_percent") and _family(base) in ("float", "int"):
            percents.append(f.name)
    for column in file_schema.names:
        if definition.field(column) is None:
            if declared is not None and column in declared.get(name, set()):
                report.add(INFO, "column outside the schema, declared in SchemaFields", name, column, file)
            else:
                report.add(WARNING, "unknown column, not declared in SchemaFields", name, column, file)
    names = set(file_schema.names)
    intervals = {"start_ts", "end_ts"} <= names and all(
        _family(file_schema.field(c).type) == "int" for c in ("start_ts", "end_ts"))
    duration = (intervals and "duration_ns" in names
                and _family(file_schema.field("duration_ns").type) == "int")
    scan = _scan(file, name, required, enums, percents, intervals, duration)
    if scan.rows != footer_rows:
        report.add(ERROR, f"footer says {footer_rows:,} rows, its pages hold {scan.rows:,}", name, file=file)
    for column, nulls in scan.nulls.items():
        if nulls:
            report.add(ERROR, f"{nulls:,} null values in a required column", name, column, file)
    for column, values in scan.enum_values.items():
        definition_field = definition.field(column)
        assert definition_field is not None
        bad = sorted(values - enums[column])
        if bad:
            report.add(ERROR, f"values outside enum {definition_field.enum_name}: "
                              f"{', '.join(map(repr, bad[:5]))}", name, column, file)
    for column, (lo, hi) in scan.ranges.items():
        if lo is not None and hi is not None and (lo < 0 or hi > 1):
            report.add(WARNING, f"values in [{lo:g}, {hi:g}]; Summary percents are fractions in [0, 1]",
                       name, column, file)
    if scan.backwards:
        report.add(ERROR, f"{scan.backwards:,} rows end before they start", name, "end_ts", file)
    if scan.mismatched:
        report.add(WARNING, f"{scan.mismatched:,} rows where duration_ns != end_ts - start_ts", name,
                   "duration_ns", file)


MAX_ENUM_VALUES = 1_000  # distinct bad values kept per column (only five are shown)


def _scan(file: Path, table: str, required: list[str], enums: dict[str, set[str]], percents: list[str],
          intervals: bool, duration: bool) -> _Scan:
    """Decode every column of every page of ``file`` once (checksums verified) and count."""
    scan = _Scan(nulls=dict.fromkeys(required, 0), enum_values={c: set() for c in enums},
                 ranges=dict.fromkeys(percents, (None, None)))
    try:
        for batch in parquet_file(file).iter_batches(batch_size=65_536):
            scan.rows += batch.num_rows
            for column in required:
                scan.nulls[column] += batch.column(column).null_count
            for column, allowed in enums.items():
                values = batch.column(column)
                if pa.types.is_dictionary(values.type):
                    values = values.cast(values.type.value_type)
                seen = scan.enum_values[column]
                if len(seen) < MAX_ENUM_VALUES:
                    seen.update(str(v) for v in pc.unique(values.drop_null()).to_pylist() if v not in allowed)
            for column in percents:
                found = pc.min_max(batch.column(column)).as_py()
                lo, hi = scan.ranges[column]
                if found["min"] is not None:
                    lo = found["min"] if lo is None else min(lo, found["min"])
                    hi = found["max"] if hi is None else max(hi, found["max"])
                scan.ranges[column] = (lo, hi)
            if intervals:
                start = batch.column("start_ts").cast(pa.int64())
                end = batch.column("end_ts").cast(pa.int64())
                scan.backwards += pc.sum(pc.less(end, start)).as_py() or 0
                if duration:
                    diff = pc.subtract(end, start)  # wraps on overflow, as the writer's arithmetic
                    stored = batch.column("duration_ns").cast(pa.int64())
                    scan.mismatched += pc.sum(pc.not_equal(diff, stored)).as_py() or 0
    except (OSError, pa.ArrowException) as exc:
        raise ProfileError(f"{file}: cannot read table {table} (corrupt or truncated data, or a page "
                           f"checksum mismatch): {_one_line(exc)}") from exc
    return scan


def _read_rows(file: Path, table: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """A small table's rows as Python values (checksums verified); a value Python cannot hold (a
    timestamp past year 9999) is a ``ProfileError`` naming the file."""
    try:
        return parquet_file(file).read(columns=columns).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise ProfileError(f"{file}: cannot read table {table}: {_one_line(exc)}") from exc
    except (ValueError, OverflowError) as exc:
        raise ProfileError(f"{file}: table {table} holds a value that cannot be read: "
                           f"{_one_line(exc)}") from exc


def _check_metadata(report: ValidationReport, root: Path, parts: Parts) -> None:
    if "Metadata" not in parts:
        report.add(ERROR, "no Metadata table (profile_schema_version and hardware constants live there)",
                   table="Metadata")
        return
    rows: list[dict[str, Any]] = []
    for _, file in parts["Metadata"]:
        rows += _read_rows(file, "Metadata")
    if len(rows) != 1:
        report.add(WARNING, f"{len(rows)} rows; the profile-level record is normally one row",
                   table="Metadata")
    if not rows:
        return
    version = rows[0].get("profile_schema_version")
    report.profile_version = None if version is None else str(version)
    if version is None:
        return
    try:
        theirs = parse_version(str(version))
    except ValueError:
        report.add(ERROR, f"{version!r} is not a MAJOR.MINOR.PATCH version", "Metadata",
                   "profile_schema_version")
        return
    ours = parse_version(report.schema_version or PROFILE_SCHEMA_VERSION)
    if theirs[0] != ours[0]:
        report.add(ERROR, f"profile schema {version} has another major version than "
                          f"{report.schema_version}: tables may differ in ways this check cannot see",
                   "Metadata", "profile_schema_version")
    elif theirs > ours:
        report.add(INFO, f"profile schema {version} is newer than {report.schema_version} (same major: "
                         f"additions only)", "Metadata", "profile_schema_version")
    if rows[0].get("capture_complete") is False:
        report.add(WARNING, "capture_complete is false: an interrupted capture", "Metadata",
                   "capture_complete")


def _check_warnings(report: ValidationReport, parts: Parts) -> None:
    for _, file in parts.get("Warning", []):
        for row in _read_rows(file, "Warning"):
            if row.get("category") == INCOMPLETE_CATEGORY:
                report.add(WARNING, str(row.get("message")), table="Warning")
