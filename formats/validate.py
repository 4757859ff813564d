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

Files that cannot be opened at all (a missing directory, a truncated or corrupt Parquet file) are bad
input, not findings: they raise ``ProfileError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats.reader import ProfileError, _family, _one_line, _read_footer
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
    for entry in sorted(root.iterdir()):
        if entry.suffix != ".parquet":
            continue
        named = table_of_file(entry.name)
        if named is None:
            report.add(WARNING, "file name is neither <Table>.parquet nor <Table>_N.parquet", file=entry)
            continue
        parts.setdefault(named[0], []).append((named[1], entry))
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


def _schema_fields(root: Path, parts: Parts) -> dict[str, set[str]] | None:
    """(table -> fields) that the profile's own SchemaFields declares, or None without one."""
    if "SchemaFields" not in parts:
        return None
    declared: dict[str, set[str]] = {}
    for _, file in parts["SchemaFields"]:
        _read_footer(file)
        try:
            rows = pq.read_table(file, columns=["table_name", "field_name"]).to_pylist()
        except (OSError, pa.ArrowException, KeyError):
            continue  # reported by the column checks of SchemaFields itself
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
        if sorted(numbers) != list(range(len(numbers))):  # type: ignore[type-var]
            report.add(WARNING, f"part numbers {sorted(numbers)} are not 0..{len(numbers) - 1}", table=name)
        report.add(INFO, f"split into {len(files)} parts", table=name)
    definition = schema.table(name)
    rows = 0
    for file in files:
        file_schema, n = _read_footer(file)
        rows += n
        if definition is None:
            continue
        _check_file(report, definition, file, file_schema, declared)
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


def _check_file(report: ValidationReport, definition: TableDef, file: Path, file_schema: pa.Schema,
                declared: dict[str, set[str]] | None) -> None:
    name = definition.name
    metadata = pq.ParquetFile(file).metadata
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
        else:
            report.add(ERROR, f"stored as {base}, schema says {want}", name, f.name, file)
            continue
        if f.required:
            nulls = _null_count(file, metadata, file_schema.get_field_index(f.name))
            if nulls:
                report.add(ERROR, f"{nulls:,} null values in a required column", name, f.name, file)
        if f.enum_name:
            allowed = set(SCHEMA.enums.get(f.enum_name, ()))
            bad = _values_outside(file, f.name, allowed) if allowed else []
            if bad:
                report.add(ERROR, f"values outside enum {f.enum_name}: {', '.join(map(repr, bad[:5]))}",
                           name, f.name, file)
        if name == "Summary" and f.name.endswith("_percent") and _family(base) in ("float", "int"):
            lo, hi = _min_max(file, f.name)
            if lo is not None and hi is not None and (lo < 0 or hi > 1):
                report.add(WARNING, f"values in [{lo:g}, {hi:g}]; Summary percents are fractions in [0, 1]",
                           name, f.name, file)
    for column in file_schema.names:
        if definition.field(column) is None:
            if declared is not None and column in declared.get(name, set()):
                report.add(INFO, "column outside the schema, declared in SchemaFields", name, column, file)
            else:
                report.add(WARNING, "unknown column, not declared in SchemaFields", name, column, file)
    names = set(file_schema.names)
    if {"start_ts", "end_ts"} <= names and _family(file_schema.field("start_ts").type) == "int":
        _check_intervals(report, name, file, "duration_ns" in names)


def _null_count(file: Path, metadata: pq.FileMetaData, index: int) -> int:
    """Nulls from the row-group statistics; read the column only where a writer left them out."""
    total = 0
    for g in range(metadata.num_row_groups):
        column = metadata.row_group(g).column(index)
        stats = column.statistics
        if stats is not None and stats.has_null_count:
            total += stats.null_count
        else:
            table = pq.ParquetFile(file).read_row_group(g, columns=[column.path_in_schema])
            total += table.column(0).null_count
    return total


def _values_outside(file: Path, column: str, allowed: set[str]) -> list[str]:
    bad: set[str] = set()
    for batch in pq.ParquetFile(file).iter_batches(columns=[column]):
        values = batch.column(0)
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        for value in pc.unique(values.drop_null()).to_pylist():
            if value not in allowed:
                bad.add(str(value))
    return sorted(bad)


def _min_max(file: Path, column: str) -> tuple[float | None, float | None]:
    values = pq.read_table(file, columns=[column]).column(0)
    result = pc.min_max(values).as_py()
    return result["min"], result["max"]


def _check_intervals(report: ValidationReport, name: str, file: Path, has_duration: bool) -> None:
    """Timeline rows must not end before they start, and ``duration_ns`` must be ``end - start``."""
    backwards = mismatched = 0
    columns = ["start_ts", "end_ts", *(["duration_ns"] if has_duration else [])]
    try:
        for batch in pq.ParquetFile(file).iter_batches(columns=columns):
            start, end = batch.column(0).cast(pa.int64()), batch.column(1).cast(pa.int64())
            backwards += pc.sum(pc.less(end, start)).as_py() or 0
            if has_duration:
                diff = pc.subtract(end, start)
                mismatched += pc.sum(pc.not_equal(diff, batch.column(2).cast(pa.int64()))).as_py() or 0
    except (OSError, pa.ArrowException) as exc:
        raise ProfileError(f"{file}: cannot read table {name}: {_one_line(exc)}") from exc
    if backwards:
        report.add(ERROR, f"{backwards:,} rows end before they start", name, "end_ts", file)
    if mismatched:
        report.add(WARNING, f"{mismatched:,} rows where duration_ns != end_ts - start_ts", name,
                   "duration_ns", file)


def _check_metadata(report: ValidationReport, root: Path, parts: Parts) -> None:
    if "Metadata" not in parts:
        report.add(ERROR, "no Metadata table (profile_schema_version and hardware constants live there)",
                   table="Metadata")
        return
    rows: list[dict[str, Any]] = []
    for _, file in parts["Metadata"]:
        try:
            rows += pq.read_table(file).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise ProfileError(f"{file}: cannot read table Metadata: {_one_line(exc)}") from exc
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
        try:
            rows = pq.read_table(file).to_pylist()
        except (OSError, pa.ArrowException, KeyError):
            continue
        for row in rows:
            if row.get("category") == INCOMPLETE_CATEGORY:
                report.add(WARNING, str(row.get("message")), table="Warning")
